import { fileURLToPath } from 'node:url';

export * from './corpus';
export * from './prepare';
export * from './shards';
export * from './backend';

/** Where prepared data lives: ./data at the repository root (git-ignored). */
export const DATA_DIR = process.env.TAH_DATA_DIR ?? fileURLToPath(new URL('../../../../data', import.meta.url));
