export * from './coordinator-client';
export * from './mesh';
