export * from './record';
export * from './replay';
