import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['packages/*/src/**/*.test.ts', 'apps/*/src/**/*.test.ts', 'server/src/**/*.test.ts', 'bench/**/*.test.ts'],
    // Model tests train real networks on one CPU core: minutes, not milliseconds.
    testTimeout: 600_000,
    hookTimeout: 120_000,
    // One file at a time: each training test wants a whole core, and CI has two.
    fileParallelism: false,
    // The second names every file that did not pass as the run's last lines (CI keeps only its tail).
    reporters: ['default', './scripts/vitest-outcomes.ts'],
  },
});
