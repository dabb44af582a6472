export * from './partition';
export * from './values';
export * from './commitment';
export * from './reduce';
export * from './butterfly';
export * from './outer';
export * from './memory';
export * from './sparse';
