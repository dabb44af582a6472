import { Resvg } from '@resvg/resvg-js';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, availableParallelism } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as vega from 'vega';
import { compile, type TopLevelSpec } from 'vega-lite';

export const RESULTS_DIR = join(dirname(fileURLToPath(import.meta.url)), 'results');

/** The machine a figure was measured on: it goes inside every result file. */
export function machine(backend: string): { cores: number; cpu: string; backend: string; node: string } {
  return { cores: availableParallelism(), cpu: cpus()[0]?.model ?? 'unknown', backend, node: process.version };
}

/** Renders a Vega-Lite chart to PNG (SVG through resvg; no browser, no canvas). */
export async function writeChartPng(path: string, spec: TopLevelSpec): Promise<void> {
  const view = new vega.View(vega.parse(compile(spec).spec), { renderer: 'none' });
  const svg = await view.toSVG();
  view.finalize();
  const png = new Resvg(svg, { background: 'white', fitTo: { mode: 'zoom', value: 2 } }).render().asPng();
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, png);
}

export function writeCsv(path: string, rows: Array<Record<string, string | number | boolean>>): void {
  const header = Object.keys(rows[0] ?? {});
  const lines = [header.join(','), ...rows.map((r) => header.map((h) => String(r[h])).join(','))];
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, lines.join('\n') + '\n');
}

/** Writes bench/results/<name>.json and prints it as the last line of output. */
export function finish(name: string, headline: object): void {
  mkdirSync(RESULTS_DIR, { recursive: true });
  const json = JSON.stringify(headline);
  writeFileSync(join(RESULTS_DIR, `${name}.json`), JSON.stringify(headline, null, 2) + '\n');
  console.log(json);
}
