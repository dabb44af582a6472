import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

// Browser tests: run by scripts/test-e2e.sh inside its network namespace, one file at a time.
export default defineConfig({
  test: {
    root: fileURLToPath(new URL('..', import.meta.url)),
    include: ['e2e/**/*.test.ts'],
    testTimeout: 600_000,
    hookTimeout: 180_000,
    fileParallelism: false,
    // The second names every file that did not pass as the run's last lines (CI keeps only its tail).
    reporters: ['default', './scripts/vitest-outcomes.ts'],
  },
});
