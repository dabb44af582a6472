export * from './record';
export * from './replay';
export * from './spread';
