/**
 * The compression frontier: bytes per token crossing a stage boundary, in
 * each direction (activations forward, their gradients back), against
 * held-out loss, for bottleneck widths and boundary codecs (codec.ts), each
 * trained from the same seed on the same tokens as an uncompressed control
 * (fp32 at full width).
 *
 *   npm run bench:compression                  (every point, one worker per core)
 *   npm run bench:compression -- --steps 150   (a shorter budget, stated in the output)
 *
 * Budget (documented reduction, the same as the first frontier's): the
 * `small` preset's width (d = 256), heads and vocabulary (4096), with 4
 * layers and context 64 instead of 6 and 128, in 2 stages (one boundary);
 * 600 steps of 16 × 64 tokens = 614,400 tokens per point, 4× the first
 * frontier's 153,600. The full `small` preset at that budget takes hours per
 * point on this machine's CPU.
 *
 * Each finished run is kept in bench/results/compression-runs.jsonl (keyed by
 * its setting and budget): a run interrupted or extended with more settings
 * trains only what it lacks.
 *
 * A deflated codec ('…z') is lossless over its plain twin: one run gives both
 * points (the same held-out loss; the plain one's bytes are its exact frame
 * size). Stochastic rounding applies to gradients only (activations are
 * rounded to the nearest), seeded per step, so a replay reproduces it.
 */
import { spawn } from 'node:child_process';
import { appendFileSync, existsSync, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { PRESETS, encodedBytes, type Precision } from '@train-at-home/model';
import { runLocalTraining } from '@train-at-home/model/node';
import { SMALL_BOUNDARY } from '../server/src/run-config';
import { writeChartPng, writeCsv } from './charts';
import { RESULTS_DIR, finish, machine } from './lib';

const { values } = parseArgs({
  options: {
    point: { type: 'string' },
    steps: { type: 'string', default: '600' },
    batch: { type: 'string', default: '16' },
    lr: { type: 'string', default: '0.003' },
  },
});
const steps = Number(values.steps);
const batchSize = Number(values.batch);
const peakLr = Number(values.lr);
const overrides = { nLayer: 4, contextLength: 64 };
const d = PRESETS.small.dModel;
const SEED = 7;

interface Setting {
  b: number;
  codec: Precision;
  rounding: 'nearest' | 'stochastic';
}

interface Run extends Setting {
  heldOutLoss: number;
  forwardBytesPerToken: number;
  backwardBytesPerToken: number;
  tokensPerSec: number;
  backend: string;
  evaluations: Array<{ tokens: number; heldOutLoss: number }>;
}

async function runPoint(s: Setting): Promise<Run> {
  const r = await runLocalTraining({
    preset: 'small',
    configOverrides: overrides,
    stages: 2,
    bottleneck: s.b,
    int8: s.codec !== 'fp32',
    codec: s.codec,
    gradientRounding: s.rounding,
    steps,
    batchSize,
    peakLr,
    seed: SEED,
    evalEvery: Math.max(50, Math.round(steps / 4)),
  });
  return {
    ...s,
    heldOutLoss: r.heldOutLoss,
    // As encoded frames, per token, for the one boundary, each direction.
    forwardBytesPerToken: r.wire.forwardBytes / r.wire.tokens,
    backwardBytesPerToken: r.wire.backwardBytes / r.wire.tokens,
    tokensPerSec: r.tokensPerSec,
    backend: r.backend,
    evaluations: r.evaluations.map((e) => ({ tokens: e.tokens, heldOutLoss: e.heldOutLoss })),
  };
}

if (values.point) {
  // Worker mode: one point, printed as JSON for the parent.
  const [b, codec, rounding] = values.point.split(',');
  console.log(JSON.stringify(await runPoint({ b: Number(b), codec: codec as Precision, rounding: rounding as Setting['rounding'] })));
  process.exit(0);
}

const settings: Setting[] = [
  // In the order they are trained (two at a time): the points that decide the default first.
  { b: d, codec: 'fp32', rounding: 'nearest' }, // the control
  { b: 8, codec: 'int8', rounding: 'nearest' }, // the first frontier's best within 5%
  { b: 8, codec: 'q6g4z', rounding: 'nearest' },
  { b: 8, codec: 'q4g4z', rounding: 'nearest' },
  // Scales shared by 4 rows cost 3-4 points of loss against int8's per-row scales: one scale per row.
  { b: 8, codec: 'q6g1z', rounding: 'nearest' },
  { b: 8, codec: 'q4g1z', rounding: 'nearest' },
  { b: 8, codec: 'q4g4z', rounding: 'stochastic' },
  { b: 4, codec: 'q6g1z', rounding: 'nearest' },
];
const workers = Math.max(1, Math.min(availableParallelism(), settings.length));
const tokensPerPoint = steps * batchSize * overrides.contextLength;
console.log(`compression frontier: ${settings.length} runs, ${steps} steps × ${batchSize} × ${overrides.contextLength} = ${tokensPerPoint} tokens each, ${workers} workers`);
const CACHE = join(RESULTS_DIR, 'compression-runs.jsonl');
const key = (s: Setting): string => JSON.stringify([s.b, s.codec, s.rounding, steps, batchSize, peakLr, SEED, overrides]);
const cached = new Map<string, Run>(
  (existsSync(CACHE) ? readFileSync(CACHE, 'utf8').split('\n').filter(Boolean) : []).map((line) => {
    const { key: k, run } = JSON.parse(line) as { key: string; run: Run };
    return [k, run];
  }),
);
const runs: Run[] = settings.flatMap((s) => (cached.has(key(s)) ? [cached.get(key(s))!] : []));
if (runs.length) console.log(`${runs.length} runs from ${CACHE}`);
const queue = settings.filter((s) => !cached.has(key(s)));
await Promise.all(
  Array.from({ length: workers }, async () => {
    for (let s = queue.shift(); s; s = queue.shift()) {
      const args = ['tsx', 'bench/compression.ts', '--point', `${s.b},${s.codec},${s.rounding}`, '--steps', String(steps), '--batch', String(batchSize), '--lr', String(peakLr)];
      const out = await new Promise<string>((resolve, reject) => {
        const child = spawn('npx', args, { stdio: ['ignore', 'pipe', 'inherit'] });
        let text = '';
        child.stdout.on('data', (c) => (text += c));
        child.on('exit', (code) => (code === 0 ? resolve(text) : reject(new Error(`point ${s.b}/${s.codec} exited ${code}`))));
      });
      const run = JSON.parse(out.trim().split('\n').pop()!) as Run;
      appendFileSync(CACHE, JSON.stringify({ key: key(s), run }) + '\n');
      console.log(`b=${run.b} ${run.codec}${run.rounding === 'stochastic' ? ' (stochastic gradients)' : ''}: held-out ${run.heldOutLoss.toFixed(4)}, ${run.forwardBytesPerToken.toFixed(2)} + ${run.backwardBytesPerToken.toFixed(2)} B/token, ${run.tokensPerSec.toFixed(0)} tok/s`);
      runs.push(run);
    }
  }),
);

const control = runs.find((r) => r.codec === 'fp32' && r.b === d)!;
// fp32 at full width: 4·d bytes per token forward and again backward.
const uncompressedPerDirection = 4 * d;
const rows = batchSize * overrides.contextLength;
/** Per token, one direction, of a codec's frame without deflate (exact). */
const plainBytesPerToken = (b: number, codec: Precision): number => encodedBytes(rows, b, codec) / rows;

const points = runs
  .filter((r) => r !== control)
  .flatMap((r) => {
    const variant = `${r.codec}${r.rounding === 'stochastic' ? '+sr' : ''}`;
    const at = (codec: string, fwd: number, bwd: number) => ({
      label: `b=${r.b} ${codec}`,
      b: r.b,
      codec,
      rounding: r.rounding,
      forwardBytesPerToken: +fwd.toFixed(3),
      backwardBytesPerToken: +bwd.toFixed(3),
      ratio: +((2 * uncompressedPerDirection) / (fwd + bwd)).toFixed(2),
      heldOutLoss: +r.heldOutLoss.toFixed(4),
      penalty: +(r.heldOutLoss / control.heldOutLoss - 1).toFixed(4),
    });
    const measured = at(variant, r.forwardBytesPerToken, r.backwardBytesPerToken);
    if (!r.codec.endsWith('z')) return [measured];
    // The same run without deflate: same codes, so the same loss; its frames' exact size.
    const plain = r.codec.slice(0, -1) as Precision;
    const p = plainBytesPerToken(r.b, plain);
    return [measured, at(`${plain}${r.rounding === 'stochastic' ? '+sr' : ''}`, p, p)];
  });
const within = (pct: number) => points.filter((p) => p.penalty <= pct);
const best = (pct: number) => within(pct).sort((a, b) => b.ratio - a.ratio)[0];

writeCsv(join(RESULTS_DIR, 'compression.csv'), points);
await writeChartPng(join(RESULTS_DIR, 'compression.png'), {
  $schema: 'https://vega.github.io/schema/vega-lite/v5.json',
  title: `Compression frontier (d=${d}, ${tokensPerPoint.toLocaleString('en')} tokens per point, both directions)`,
  width: 560,
  height: 340,
  data: { values: points.map((p) => ({ ...p, family: p.codec.replace(/\+sr$/, ' + stochastic gradients') })) },
  layer: [
    { mark: { type: 'rule', strokeDash: [4, 4], color: 'gray' }, encoding: { y: { datum: 0.05 } } },
    { mark: { type: 'rule', strokeDash: [2, 2], color: 'lightgray' }, encoding: { y: { datum: 0.02 } } },
    { mark: { type: 'rule', strokeDash: [4, 4], color: 'gray' }, encoding: { x: { datum: 128 } } },
    {
      mark: { type: 'point', filled: true, size: 70 },
      encoding: {
        x: { field: 'ratio', type: 'quantitative', scale: { type: 'log' }, title: 'fewer bytes than fp32 at full width, both directions (×, log)' },
        y: { field: 'penalty', type: 'quantitative', axis: { format: '%' }, title: 'held-out loss penalty vs the uncompressed control' },
        color: { field: 'family', type: 'nominal', title: 'codec' },
      },
    },
    { mark: { type: 'text', dy: -10, fontSize: 9 }, encoding: { x: { field: 'ratio', type: 'quantitative' }, y: { field: 'penalty', type: 'quantitative' }, text: { field: 'label' } } },
  ],
});

const b5 = best(0.05);
const b2 = best(0.02);
finish('compression', {
  maxRatioWithin5pct: b5?.ratio ?? null,
  pointWithin5pct: b5?.label ?? null,
  maxRatioWithin2pct: b2?.ratio ?? null,
  pointWithin2pct: b2?.label ?? null,
  bytesPerTokenForward: b5?.forwardBytesPerToken ?? null,
  bytesPerTokenBackward: b5?.backwardBytesPerToken ?? null,
  controlHeldOutLoss: +control.heldOutLoss.toFixed(4),
  // The layout `npm start` runs (server/src/run-config.ts), as measured here.
  defaultRun: points.find((p) => p.b === SMALL_BOUNDARY.bottleneck && p.codec === SMALL_BOUNDARY.codec) ?? null,
  // Counted above: the boundary tensor's frames. In the swarm an activation also carries its
  // microbatch's target tokens for the last stage (2 bytes per token, swarm/microbatch.ts).
  swarmTargetBytesPerToken: 2,
  uncompressedBytesPerTokenPerDirection: uncompressedPerDirection,
  points,
  runs: runs.map((r) => ({ b: r.b, codec: r.codec, rounding: r.rounding, heldOutLoss: +r.heldOutLoss.toFixed(4), evaluations: r.evaluations, tokensPerSec: Math.round(r.tokensPerSec) })),
  budget: { preset: 'small', overrides, stages: 2, steps, batchSize, tokensPerPoint, peakLr, seed: SEED, note: 'reduced: small width/vocab/heads, 4 layers, context 64; 4x the first frontier\'s tokens per point' },
  machine: machine(runs[0]!.backend),
});
