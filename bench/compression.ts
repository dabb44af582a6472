/**
 * The compression frontier: bytes per token per stage boundary against
 * held-out loss, for bottleneck widths b ∈ {d, d/4, d/16, d/32, d/64}, int8
 * on and off, same seed and token budget.
 *
 *   npm run bench:compression              (all 10 points, one worker per core)
 *   npm run bench:compression -- --steps 40 (a shorter budget, stated in the output)
 *
 * Budget (documented reduction): the `small` preset's width (d = 256), heads
 * and vocabulary (4096), with 4 layers and context 64 instead of 6 and 128, in
 * 2 stages (one boundary), 150 steps of 16 × 64 tokens (153,600 tokens) per
 * point. The full `small` preset at a meaningful budget takes hours per point
 * on this machine's CPU.
 */
import { spawn } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { PRESETS } from '@train-at-home/model';
import { runLocalTraining } from '@train-at-home/model/node';
import { RESULTS_DIR, finish, machine, writeChartPng, writeCsv } from './lib';

const { values } = parseArgs({
  options: {
    point: { type: 'string' },
    steps: { type: 'string', default: '150' },
    batch: { type: 'string', default: '16' },
    lr: { type: 'string', default: '0.003' },
  },
});
const steps = Number(values.steps);
const batchSize = Number(values.batch);
const peakLr = Number(values.lr);
const overrides = { nLayer: 4, contextLength: 64 };
const d = PRESETS.small.dModel;

interface Point {
  b: number;
  int8: boolean;
  heldOutLoss: number;
  bytesPerToken: number;
  tokensPerSec: number;
  backend: string;
}

async function runPoint(b: number, int8: boolean): Promise<Point> {
  const r = await runLocalTraining({ preset: 'small', configOverrides: overrides, stages: 2, bottleneck: b, int8, steps, batchSize, peakLr, seed: 7 });
  return {
    b,
    int8,
    heldOutLoss: r.heldOutLoss,
    // Forward activations + backward gradients, as encoded frames, per token, for the one boundary.
    bytesPerToken: (r.wire.forwardBytes + r.wire.backwardBytes) / r.wire.tokens,
    tokensPerSec: r.tokensPerSec,
    backend: r.backend,
  };
}

if (values.point) {
  // Worker mode: one point, printed as JSON for the parent.
  const [b, int8] = values.point.split(',');
  console.log(JSON.stringify(await runPoint(Number(b), int8 === 'int8')));
  process.exit(0);
}

const settings = [d, d / 4, d / 16, d / 32, d / 64].flatMap((b) => [
  { b, int8: false },
  { b, int8: true },
]);
const workers = Math.max(1, Math.min(availableParallelism(), settings.length));
console.log(`compression frontier: ${settings.length} points, ${steps} steps × ${batchSize} × ${overrides.contextLength} tokens each, ${workers} workers`);
const results: Point[] = [];
const queue = [...settings];
await Promise.all(
  Array.from({ length: workers }, async () => {
    for (let s = queue.shift(); s; s = queue.shift()) {
      const args = ['tsx', 'bench/compression.ts', '--point', `${s.b},${s.int8 ? 'int8' : 'fp32'}`, '--steps', String(steps), '--batch', String(batchSize), '--lr', String(peakLr)];
      const out = await new Promise<string>((resolve, reject) => {
        const child = spawn('npx', args, { stdio: ['ignore', 'pipe', 'inherit'] });
        let text = '';
        child.stdout.on('data', (c) => (text += c));
        child.on('exit', (code) => (code === 0 ? resolve(text) : reject(new Error(`point ${s.b}/${s.int8} exited ${code}`))));
      });
      const point = JSON.parse(out.trim().split('\n').pop()!) as Point;
      console.log(`b=${point.b} ${point.int8 ? 'int8' : 'fp32'}: held-out ${point.heldOutLoss.toFixed(4)}, ${point.bytesPerToken.toFixed(1)} B/token, ${point.tokensPerSec.toFixed(0)} tok/s`);
      results.push(point);
    }
  }),
);

const baseline = results.find((p) => p.b === d && !p.int8)!;
// fp32 at full width: 4·d bytes per token forward and again backward.
const uncompressedBytes = 2 * 4 * d;
const points = settings.map(({ b, int8 }) => {
  const p = results.find((r) => r.b === b && r.int8 === int8)!;
  return {
    b,
    int8,
    ratio: uncompressedBytes / p.bytesPerToken,
    lossRatio: p.heldOutLoss / baseline.heldOutLoss,
    heldOutLoss: p.heldOutLoss,
    bytesPerToken: p.bytesPerToken,
  };
});
const within = points.filter((p) => p.lossRatio <= 1.05);
const maxRatioWithin5pct = Math.max(...within.map((p) => p.ratio));

writeCsv(join(RESULTS_DIR, 'compression.csv'), points);
await writeChartPng(join(RESULTS_DIR, 'compression.png'), {
  $schema: 'https://vega.github.io/schema/vega-lite/v5.json',
  title: `Compression frontier (d=${d}, ${steps * batchSize * overrides.contextLength} tokens per point)`,
  width: 520,
  height: 320,
  data: { values: points.map((p) => ({ ...p, codec: p.int8 ? 'bottleneck + int8' : 'bottleneck, fp32', label: `b=${p.b}` })) },
  layer: [
    { mark: { type: 'rule', strokeDash: [4, 4], color: 'gray' }, encoding: { y: { datum: 1.05 } } },
    {
      mark: { type: 'line', point: true },
      encoding: {
        x: { field: 'ratio', type: 'quantitative', scale: { type: 'log' }, title: 'bytes reduction vs fp32 uncompressed (×, log)' },
        y: { field: 'lossRatio', type: 'quantitative', scale: { zero: false }, title: 'held-out loss ÷ uncompressed' },
        color: { field: 'codec', type: 'nominal' },
      },
    },
    { mark: { type: 'text', dy: -10, fontSize: 10 }, encoding: { x: { field: 'ratio', type: 'quantitative' }, y: { field: 'lossRatio', type: 'quantitative' }, text: { field: 'label' } } },
  ],
});

finish('compression', {
  maxRatioWithin5pct,
  points: points.map(({ b, int8, ratio, lossRatio }) => ({ b, int8, ratio: +ratio.toFixed(2), lossRatio: +lossRatio.toFixed(4) })),
  uncompressedHeldOutLoss: baseline.heldOutLoss,
  localTrainerTokensPerSec: Math.round(baseline.tokensPerSec),
  budget: { preset: 'small', overrides, stages: 2, steps, batchSize, tokensPerPoint: steps * batchSize * overrides.contextLength, peakLr, seed: 7, note: 'reduced budget: small width/vocab, 4 layers, context 64' },
  machine: machine(results[0]!.backend),
});
