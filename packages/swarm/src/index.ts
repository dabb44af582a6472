export * from './coordinator-client';
