import { fileURLToPath } from 'node:url';

/** Where prepared data lives: ./data at the repository root (git-ignored), or $TAH_DATA_DIR. */
export const DATA_DIR = process.env.TAH_DATA_DIR ?? fileURLToPath(new URL('../../../../data', import.meta.url));
