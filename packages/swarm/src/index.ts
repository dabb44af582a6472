export * from './coordinator-client';
export * from './mesh';
export * from './microbatch';
export * from './pipeline';
export * from './miner';
export * from './allreduce';
export * from './merge';
