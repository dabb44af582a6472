export * from './corpus';
export * from './inputs';
export * from './prepare';
export * from './shards';
export * from './backend';
export * from './paths';
export * from './train';
