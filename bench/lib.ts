import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, availableParallelism } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

// Charts and CSV are in ./charts.ts: this module stays free of native packages, so a benchmark
// can be bundled for a machine with no registry (scripts/device-bundle.sh).
export const RESULTS_DIR = process.env.TAH_RESULTS_DIR ?? join(dirname(fileURLToPath(import.meta.url)), 'results');

/** The machine a figure was measured on: it goes inside every result file. */
export function machine(backend: string): { cores: number; cpu: string; backend: string; node: string } {
  return { cores: availableParallelism(), cpu: cpus()[0]?.model ?? 'unknown', backend, node: process.version };
}

/** Writes bench/results/<name>.json and prints it as the last line of output. */
export function finish(name: string, headline: object): void {
  mkdirSync(RESULTS_DIR, { recursive: true });
  const json = JSON.stringify(headline);
  writeFileSync(join(RESULTS_DIR, `${name}.json`), JSON.stringify(headline, null, 2) + '\n');
  console.log(json);
}
