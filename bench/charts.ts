import { Resvg } from '@resvg/resvg-js';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import * as vega from 'vega';
import { compile, type TopLevelSpec } from 'vega-lite';

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
