/**
 * npx tsx bench/spot-spread.ts — how far an HONEST miner's stage drifts from
 * the validator's replay, against how far CHEATERS land, to set spot-check
 * thresholds.
 *
 * The validator replays a sampled microbatch through one stage with the
 * stage's hash-agreed weights of the current merge round (the checkpoint of
 * the last merge). The honest miner has meanwhile taken k inner AdamW steps on
 * its own data (k = 0 … ~20: merges every 10 microbatches per replica, a fast
 * replica ~2×). So honest answers differ from the replay by k steps of drift;
 * cheaters differ by their cheat.
 *
 * Method, per configuration (all stages in one process, `LocalTrainer`, every
 * boundary tensor through the real int8 codec):
 *   - train to a checkpoint step c on a merge boundary (0 = round 1's anchor,
 *     the initial weights; 20 = end of warm-up; 40; 100), copy every stage's
 *     weights into reference stages (exportStageWeightsSync → importStageWeights:
 *     the checkpoint blob);
 *   - keep training the trainer (the miner) on its own batches; after k steps
 *     (k ∈ ks) draw fresh probe batches and run them through the miner's
 *     pipeline exactly as the swarm would (forward, codec, loss, backward,
 *     codec). For each stage, replay with the reference stage on the SAME input
 *     (the decoded boundary tensor the previous stage sent; token ids for
 *     stage 0) and, backward, the SAME output gradient (the decoded one the
 *     next stage sent), and compare after the codec:
 *       forward  decode(encode(out)):  cosine, ‖m‖/‖r‖, ‖m−r‖/‖r‖, and on
 *                the middle stage (b in, b out) the cosine of (out − in);
 *       backward decode(encode(input gradient)): the same, the delta being
 *                (input gradient − output gradient) on the middle stage;
 *       loss     last stage: miner − ref, miner / ref.
 *     (The trainer goes on from there to the next checkpoint: checkpoints are
 *     at least max(ks) apart.)
 *   - at k ∈ CHEAT_KS the same probes give the cheats' answers: noise on the
 *     output / input gradient (σ = RMS and 0.3 RMS), zeros, sign-flipped input
 *     gradients, the answer for the previous (different) probe batch (stale),
 *     a free-rider middle stage (output = input, input gradient = output
 *     gradient), and a last stage reporting 0.7× / 0.9× its loss;
 *   - the floor: at k = 0 a replay on the pure-JS CPU backend (same weights,
 *     same inputs) against the WASM answers, i.e. two honest machines.
 *
 * Thresholds, per scope (all checkpoints, or from step 20; k ≤ 20, ≤ 10, ≤ 1)
 * and per direction (forward, backward, loss) or per stage: the honest worst
 * case ("h", as a deviation: 1 − cos, relErr, |ln normRatio|, 1 − deltaCos,
 * |loss ratio − 1|, |loss difference|) against each cheat's best case ("c").
 * A cheat is separable by a metric when c ≥ 1.2 h; the threshold is
 * h · min(2, √(c_min / h)) with c_min the smallest separable c (equal factor
 * margins both sides, at most 2× the honest worst), or 2 h when none is.
 *
 *   npx tsx bench/spot-spread.ts            (tiny: b ∈ {128, 32} × B ∈ {8, 32}; ~6 min of one core)
 *   npx tsx bench/spot-spread.ts --small    (adds a reduced `small` point: ≈ +7 min)
 *   npx tsx bench/spot-spread.ts --only small-b64-B16 --no-write   (that point alone, printed, not written)
 *   npx tsx bench/spot-spread.ts --quick    (a smoke run: one config, few probes)
 */
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import * as tf from '@tensorflow/tfjs';
import {
  BatchSampler,
  LocalTrainer,
  PRESETS,
  Stage,
  decodeBoundary,
  encodeBoundary,
  exportStageWeightsSync,
  importStageWeights,
  mulberry32,
  type ModelConfig,
  type PresetName,
  type StageInput,
  type TokenBatch,
} from '@train-at-home/model';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { finish, machine } from './lib';

const { values: args } = parseArgs({
  options: {
    small: { type: 'boolean', default: false },
    quick: { type: 'boolean', default: false },
    /** Comma-separated configuration names to run (e.g. small-b64-B16). */
    only: { type: 'string' },
    /** Print the result line without writing bench/results/spot-spread.json (partial runs). */
    'no-write': { type: 'boolean', default: false },
  },
});

interface RunConfig {
  name: string;
  preset: PresetName;
  stages: number;
  bottleneck: number;
  batch: number;
  peakLr: number;
  warmupSteps: number;
  totalSteps: number;
  /** Steps at which the validator's checkpoint is taken. */
  checkpoints: number[];
  /** Inner steps the miner has taken since the checkpoint when probed. */
  ks: number[];
  /** Probe batches per (checkpoint, k). */
  probes: number;
}

const SEED = 1;
const CHEAT_KS = [0, 10];
const tinyBase = { preset: 'tiny' as const, stages: 3, peakLr: 0.006, warmupSteps: 20, totalSteps: 200 };
const SMALL: RunConfig = {
  // ~8 s per step on one core: two checkpoints, three k.
  name: 'small-b64-B16', preset: 'small', stages: 3, bottleneck: 64, batch: 16, peakLr: 0.003, warmupSteps: 20, totalSteps: 200, checkpoints: [0, 20], ks: [0, 10, 20], probes: 2,
};
const ALL_CONFIGS: RunConfig[] = [
  // Checkpoints sit on merge boundaries (every 10 microbatches): 0 is round 1's anchor, the initial weights.
  // They are taken in order on one trainer, so each is at least max(ks) after the previous one.
  // Budget: ~0.3 s per step at B = 8, ~1.1 s at B = 32 (tiny, WASM, one core): B = 32 stops at checkpoint 20.
  { ...tinyBase, name: 'tiny-b128-B8', bottleneck: 128, batch: 8, checkpoints: [0, 20, 40, 100], ks: [0, 1, 2, 5, 10, 15, 20], probes: 3 },
  { ...tinyBase, name: 'tiny-b32-B8', bottleneck: 32, batch: 8, checkpoints: [0, 20, 40, 100], ks: [0, 1, 2, 5, 10, 15, 20], probes: 3 },
  { ...tinyBase, name: 'tiny-b128-B32', bottleneck: 128, batch: 32, checkpoints: [0, 20], ks: [0, 5, 10, 20], probes: 2 },
  { ...tinyBase, name: 'tiny-b32-B32', bottleneck: 32, batch: 32, checkpoints: [0, 20], ks: [0, 5, 10, 20], probes: 2 },
];
const CONFIGS: RunConfig[] = args.quick
  ? [{ ...tinyBase, name: 'tiny-b128-B8', bottleneck: 128, batch: 8, checkpoints: [0, 20], ks: [0, 2, 10], probes: 2 }]
  : args.only
    ? [...ALL_CONFIGS, SMALL].filter((c) => args.only!.split(',').includes(c.name))
    : [...ALL_CONFIGS, ...(args.small ? [SMALL] : [])];
if (!CONFIGS.length) throw new Error(`no configuration named ${args.only}`);
for (const c of CONFIGS) {
  c.checkpoints.forEach((ck, i) => {
    if (i > 0 && ck - c.checkpoints[i - 1]! < Math.max(...c.ks)) throw new Error(`${c.name}: checkpoints closer than max(ks)`);
  });
}
const SKIPPED = CONFIGS.includes(SMALL) ? [] : ['small-b64-B16 (≈8 s per training step on one core here: --small adds it, --only small-b64-B16 runs it alone; ≈ 7 min)'];

// ---------------------------------------------------------------- metrics

interface Metrics {
  cos?: number;
  normRatio?: number;
  relErr?: number;
  deltaCos?: number;
  lossDiff?: number;
  lossRatio?: number;
}

function norm(a: Float32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i]! * a[i]!;
  return Math.sqrt(s);
}
function cosine(a: Float32Array, b: Float32Array): number {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i]! * b[i]!;
    na += a[i]! * a[i]!;
    nb += b[i]! * b[i]!;
  }
  return na === 0 || nb === 0 ? 0 : dot / Math.sqrt(na * nb);
}
function sub(a: Float32Array, b: Float32Array): Float32Array {
  const out = new Float32Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i]! - b[i]!;
  return out;
}
/** The miner's tensor m against the replay r (both after the codec); base: the stage's other end, for the delta. */
function compare(m: Float32Array, r: Float32Array, base?: Float32Array): Metrics {
  const nr = norm(r);
  const out: Metrics = { cos: cosine(m, r), normRatio: norm(m) / nr, relErr: norm(sub(m, r)) / nr };
  if (base) out.deltaCos = cosine(sub(m, base), sub(r, base));
  return out;
}

// ---------------------------------------------------------------- the wire

function cross(data: Float32Array, rows: number, cols: number): Float32Array {
  return decodeBoundary(encodeBoundary({ rows, cols, data }, 'int8'), { rows, cols, precision: 'int8' }).data;
}

function gaussian(random: () => number): number {
  const u = Math.max(random(), 1e-12);
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * random());
}
function withNoise(raw: Float32Array, relSigma: number, random: () => number): Float32Array {
  const sigma = relSigma * (norm(raw) / Math.sqrt(raw.length));
  const out = new Float32Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw[i]! + sigma * gaussian(random);
  return out;
}

// ---------------------------------------------------------------- one probe

interface Boundary {
  /** What the miner computed, before the codec. */
  raw: Float32Array;
  /** What the miner sends (decoded). */
  miner: Float32Array;
  /** What the validator's replay sends (decoded). */
  ref: Float32Array;
}
interface Probe {
  rows: number;
  cols: number;
  /** fwd[s]: stage s's output, s = 0 … S−2. */
  fwd: Boundary[];
  /** bwd[s]: stage s's input gradient, s = 1 … S−1 (bwd[0] unused). */
  bwd: Boundary[];
  lossMiner: number;
  lossRef: number;
}

/**
 * One microbatch through the miner's pipeline, as the swarm runs it; every
 * stage replayed by the reference stage on the same input and output gradient.
 * ref = null: the reference holds the miner's weights (k = 0), reuse the miner's answers.
 */
function probe(miner: Stage[], ref: Stage[] | null, b: TokenBatch): Probe {
  const S = miner.length;
  const { batch, time } = b;
  const rows = batch * time;
  const cols = miner[0]!.spec.outputWidth;
  const xs: tf.Tensor[] = [tf.tensor2d(b.inputs, [batch, time], 'int32')];
  const targets = tf.tensor2d(b.targets, [batch, time], 'int32');
  const fwd: Boundary[] = [];
  for (let s = 0; s < S - 1; s++) {
    const input = { batch, time, x: xs[s]! };
    const outM = miner[s]!.forward(input);
    const raw = (outM.dataSync() as Float32Array).slice();
    outM.dispose();
    const m = cross(raw, rows, cols);
    let r = m;
    if (ref) {
      const outR = ref[s]!.forward(input);
      r = cross((outR.dataSync() as Float32Array).slice(), rows, cols);
      outR.dispose();
    }
    fwd.push({ raw, miner: m, ref: r });
    xs.push(tf.tensor2d(m, [rows, cols]));
  }
  const bwd: Boundary[] = new Array(S);
  const lastInput = { batch, time, x: xs[S - 1]!, targets };
  const backward = (stage: Stage, input: StageInput, outputGrad?: tf.Tensor): { grad: Float32Array; loss?: number } => {
    const result = stage.backward(input, outputGrad);
    const grad = (result.inputGrad!.dataSync() as Float32Array).slice();
    tf.dispose([result.inputGrad!, ...Object.values(result.grads)]);
    return { grad, loss: result.loss };
  };
  const lastM = backward(miner[S - 1]!, lastInput);
  const lastR = ref ? backward(ref[S - 1]!, lastInput) : lastM;
  bwd[S - 1] = { raw: lastM.grad, miner: cross(lastM.grad, rows, cols), ref: ref ? cross(lastR.grad, rows, cols) : cross(lastM.grad, rows, cols) };
  for (let s = S - 2; s >= 1; s--) {
    const g = tf.tensor2d(bwd[s + 1]!.miner, [rows, cols]);
    const input = { batch, time, x: xs[s]! };
    const m = backward(miner[s]!, input, g);
    const r = ref ? backward(ref[s]!, input, g) : m;
    g.dispose();
    const mc = cross(m.grad, rows, cols);
    bwd[s] = { raw: m.grad, miner: mc, ref: ref ? cross(r.grad, rows, cols) : mc };
  }
  tf.dispose([...xs, targets]);
  return { rows, cols, fwd, bwd, lossMiner: lastM.loss!, lossRef: lastR.loss! };
}

/** The same microbatch replayed stage by stage on `stages` (another backend), from the inputs and output gradients the probe recorded. */
function replay(stages: Stage[], p: Probe, b: TokenBatch): { fwd: Float32Array[]; bwd: Float32Array[]; loss: number } {
  const S = stages.length;
  const { batch, time } = b;
  const { rows, cols } = p;
  const inputOf = (s: number): tf.Tensor => (s === 0 ? tf.tensor2d(b.inputs, [batch, time], 'int32') : tf.tensor2d(p.fwd[s - 1]!.miner, [rows, cols]));
  const fwd: Float32Array[] = [];
  for (let s = 0; s < S - 1; s++) {
    const x = inputOf(s);
    const out = stages[s]!.forward({ batch, time, x });
    fwd.push(cross((out.dataSync() as Float32Array).slice(), rows, cols));
    tf.dispose([x, out]);
  }
  const bwd: Float32Array[] = new Array(S);
  let loss = NaN;
  for (let s = S - 1; s >= 1; s--) {
    const x = inputOf(s);
    const targets = s === S - 1 ? tf.tensor2d(b.targets, [batch, time], 'int32') : undefined;
    const g = s < S - 1 ? tf.tensor2d(p.bwd[s + 1]!.miner, [rows, cols]) : undefined;
    const result = stages[s]!.backward({ batch, time, x, targets }, g);
    if (result.loss !== undefined) loss = result.loss;
    bwd[s] = cross((result.inputGrad!.dataSync() as Float32Array).slice(), rows, cols);
    tf.dispose([x, result.inputGrad!, ...Object.values(result.grads), ...(targets ? [targets] : []), ...(g ? [g] : [])]);
  }
  return { fwd, bwd, loss };
}

// ---------------------------------------------------------------- records

/** fwd<s>: stage s's output; bwd<s>: stage s's input gradient; loss: the last stage's loss. */
type Where = string;
interface Sample {
  config: string;
  ckpt: number;
  k: number;
  probe: number;
  who: string; // 'honest' or the cheat
  where: Where;
  m: Metrics;
}
const samples: Sample[] = [];
const CHEATS = ['noise1.0', 'noise0.3', 'zero', 'stale', 'freeRider', 'signFlip', 'loss×0.7', 'loss×0.9'] as const;

function record(cfg: RunConfig, ckpt: number, k: number, probes: Probe[], random: () => number): void {
  const P = probes.length;
  probes.forEach((p, i) => {
    const S = p.fwd.length + 1;
    const prev = probes[(i - 1 + P) % P]!;
    const add = (who: string, where: Where, m: Metrics): void => void samples.push({ config: cfg.name, ckpt, k, probe: i, who, where, m });
    const cheat = CHEAT_KS.includes(k);
    const zeros = new Float32Array(p.rows * p.cols);
    for (let s = 0; s < S - 1; s++) {
      // The delta (out − in) exists where input and output are both b wide: the middle stages.
      const base = s > 0 ? p.fwd[s - 1]!.miner : undefined;
      const { raw, miner, ref } = p.fwd[s]!;
      add('honest', `fwd${s}`, compare(miner, ref, base));
      if (!cheat) continue;
      add('noise1.0', `fwd${s}`, compare(cross(withNoise(raw, 1, random), p.rows, p.cols), ref, base));
      add('noise0.3', `fwd${s}`, compare(cross(withNoise(raw, 0.3, random), p.rows, p.cols), ref, base));
      add('zero', `fwd${s}`, compare(zeros, ref, base));
      add('stale', `fwd${s}`, compare(prev.fwd[s]!.miner, ref, base));
      if (base) add('freeRider', `fwd${s}`, compare(base, ref, base));
    }
    for (let s = 1; s < S; s++) {
      const base = s < S - 1 ? p.bwd[s + 1]!.miner : undefined; // the output gradient it was sent
      const { raw, miner, ref } = p.bwd[s]!;
      add('honest', `bwd${s}`, compare(miner, ref, base));
      if (!cheat) continue;
      add('noise1.0', `bwd${s}`, compare(cross(withNoise(raw, 1, random), p.rows, p.cols), ref, base));
      add('noise0.3', `bwd${s}`, compare(cross(withNoise(raw, 0.3, random), p.rows, p.cols), ref, base));
      add('zero', `bwd${s}`, compare(zeros, ref, base));
      add('signFlip', `bwd${s}`, compare(cross(raw.map((v) => -v), p.rows, p.cols), ref, base));
      add('stale', `bwd${s}`, compare(prev.bwd[s]!.miner, ref, base));
      if (base) add('freeRider', `bwd${s}`, compare(base, ref, base));
    }
    const lossM = (l: number): Metrics => ({ lossDiff: l - p.lossRef, lossRatio: l / p.lossRef });
    add('honest', 'loss', lossM(p.lossMiner));
    if (cheat) {
      add('loss×0.7', 'loss', lossM(0.7 * p.lossMiner));
      add('loss×0.9', 'loss', lossM(0.9 * p.lossMiner));
    }
  });
}

// ---------------------------------------------------------------- summaries

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const i = (s.length - 1) * q;
  const lo = Math.floor(i);
  return s[lo]! + (s[Math.min(lo + 1, s.length - 1)]! - s[lo]!) * (i - lo);
}
const pick = (xs: Sample[], f: (m: Metrics) => number | undefined): number[] => xs.map((x) => f(x.m)).filter((v): v is number => v !== undefined && Number.isFinite(v));
const lnAbs = (v: number): number => Math.abs(Math.log(Math.max(v, 1e-30)));
/** normRatio farthest from 1 (honest worst) or closest to 1 (cheater best). */
function nrExtreme(xs: number[], farthest: boolean): number {
  if (xs.length === 0) return NaN;
  return xs.reduce((a, b) => ((lnAbs(b) > lnAbs(a)) === farthest ? b : a));
}
const sig = (v: number, n = 4): number => (Number.isFinite(v) ? Number(v.toPrecision(n)) : v);

/** The honest worst case and median of one group of samples. */
function honestStats(xs: Sample[]): Record<string, number> {
  const out: Record<string, number> = {};
  const cos = pick(xs, (m) => m.cos);
  if (cos.length) {
    out.cosMin = sig(Math.min(...cos), 6);
    out.cosMedian = sig(quantile(cos, 0.5), 6);
    const rel = pick(xs, (m) => m.relErr);
    out.relErrMax = sig(Math.max(...rel));
    const nr = pick(xs, (m) => m.normRatio);
    out.normRatioMin = sig(Math.min(...nr));
    out.normRatioMax = sig(Math.max(...nr));
  }
  const dc = pick(xs, (m) => m.deltaCos);
  if (dc.length) out.deltaCosMin = sig(Math.min(...dc), 6);
  const ld = pick(xs, (m) => m.lossDiff);
  if (ld.length) {
    out.lossDiffMin = sig(Math.min(...ld));
    out.lossDiffMax = sig(Math.max(...ld));
    const lr = pick(xs, (m) => m.lossRatio);
    out.lossRatioMin = sig(Math.min(...lr));
    out.lossRatioMax = sig(Math.max(...lr));
  }
  return out;
}
/** A cheat's best case: what looks most honest. */
function cheatStats(xs: Sample[]): Record<string, number> {
  const out: Record<string, number> = {};
  const cos = pick(xs, (m) => m.cos);
  if (cos.length) {
    out.cosMax = sig(Math.max(...cos), 6);
    out.relErrMin = sig(Math.min(...pick(xs, (m) => m.relErr)));
    out.normRatioClosest = sig(nrExtreme(pick(xs, (m) => m.normRatio), false));
  }
  const dc = pick(xs, (m) => m.deltaCos);
  if (dc.length) out.deltaCosMax = sig(Math.max(...dc), 6);
  const lr = pick(xs, (m) => m.lossRatio);
  if (lr.length) {
    const ld = pick(xs, (m) => m.lossDiff);
    out.lossDiffMaxNeg = sig(Math.max(...ld)); // the closest to honest (differences are negative)
    out.lossRatioMax = sig(Math.max(...lr));
  }
  return out;
}

const f = (v: number | undefined, d = 4): string => (v === undefined || !Number.isFinite(v) ? '—' : v.toFixed(d));
const pad = (s: string, n: number): string => s.padStart(n);

function printConfig(cfg: RunConfig, seconds: number): void {
  const mine = samples.filter((s) => s.config === cfg.name);
  const wheres = [...new Set(mine.map((s) => s.where))];
  console.log(`\n=== ${cfg.name}: ${cfg.preset}, ${cfg.stages} stages, b = ${cfg.bottleneck}, B = ${cfg.batch}, lr ${cfg.peakLr}, ${cfg.probes} probes per point (${seconds.toFixed(0)} s)`);
  for (const ckpt of cfg.checkpoints) {
    const l = losses.find((x) => x.config === cfg.name && x.ckpt === ckpt);
    console.log(`-- honest, checkpoint at step ${ckpt} (train loss ${ckpt === 0 ? 'init' : f(l?.trainLoss, 3)}): worst over probes. cos min | relErr max | normRatio farthest from 1 | deltaCos min; loss: miner−ref min..max`);
    const head = ['k', 'wΔ s0/s1/s2', ...wheres.filter((w) => w !== 'loss').map((w) => pad(w, 31)), 'loss Δ (ratio)'];
    console.log(head.join(' | '));
    for (const k of cfg.ks) {
      const at = mine.filter((s) => s.who === 'honest' && s.ckpt === ckpt && s.k === k);
      const wd = weightDrift.filter((x) => x.config === cfg.name && x.ckpt === ckpt && x.k === k).map((x) => x.rel.toFixed(3)).join('/');
      const cells = wheres.filter((w) => w !== 'loss').map((w) => {
        const xs = at.filter((s) => s.where === w);
        const dc = pick(xs, (m) => m.deltaCos);
        return `${f(Math.min(...pick(xs, (m) => m.cos)))} ${f(Math.max(...pick(xs, (m) => m.relErr)), 3)} ${f(nrExtreme(pick(xs, (m) => m.normRatio), true), 3)} ${dc.length ? f(Math.min(...dc)) : '     —'}`;
      });
      const loss = at.filter((s) => s.where === 'loss');
      const ld = pick(loss, (m) => m.lossDiff);
      const lr = pick(loss, (m) => m.lossRatio);
      console.log([pad(String(k), 2), pad(wd, 17), ...cells.map((c) => pad(c, 31)), `${f(Math.min(...ld), 3)}..${f(Math.max(...ld), 3)} (${f(Math.min(...lr), 3)})`].join(' | '));
    }
  }
  console.log(`-- cheaters (best case over checkpoints, probes; k = ${CHEAT_KS.join(', ')}): cos max | relErr min | normRatio closest to 1 | deltaCos max  /  loss: diff, ratio max`);
  for (const who of CHEATS) {
    for (const k of CHEAT_KS) {
      const xs = mine.filter((s) => s.who === who && s.k === k);
      if (!xs.length) continue;
      const cells = [...new Set(xs.map((s) => s.where))].map((w) => {
        const st = cheatStats(xs.filter((s) => s.where === w));
        if (w === 'loss') return `loss Δ ${f(st.lossDiffMaxNeg, 3)} ratio ${f(st.lossRatioMax, 3)}`;
        return `${w} ${f(st.cosMax)} ${f(st.relErrMin, 3)} ${f(st.normRatioClosest, 3)} ${st.deltaCosMax !== undefined ? f(st.deltaCosMax) : '—'}`;
      });
      console.log(`${who.padEnd(10)} k=${pad(String(k), 2)}  ${cells.join('  |  ')}`);
    }
  }
}

// ---------------------------------------------------------------- running

const started = performance.now();
const backend = await initNodeBackend();
const weightDrift: Array<{ config: string; ckpt: number; k: number; stage: number; rel: number }> = [];
const losses: Array<{ config: string; ckpt: number; trainLoss: number }> = [];
let determinismChecked = false;
/** k = 0 answers from WASM against a replay on the CPU backend: the floor of an honest difference between machines. */
const crossBackend: Array<{ config: string; ckpt: number; where: Where; m: Metrics }> = [];

function snapshotFlat(stages: Stage[]): Float32Array[] {
  return stages.map((st) => {
    const parts = st.specs.map((s) => st.params[s.name]!.dataSync() as Float32Array);
    const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
    let o = 0;
    for (const p of parts) (out.set(p, o), (o += p.length));
    return out;
  });
}

for (const cfg of CONFIGS) {
  const t0 = performance.now();
  const preset = PRESETS[cfg.preset];
  prepareData({ outDir: DATA_DIR, vocabSize: preset.vocabSize });
  const data = loadDataset(join(DATA_DIR, datasetName(preset.vocabSize)));
  const config: ModelConfig = { ...preset, vocabSize: data.manifest.vocabSize };
  const layout = { stages: cfg.stages, bottleneck: cfg.bottleneck, int8: true };
  const trainer = new LocalTrainer({ config, layout, seed: SEED, peakLr: cfg.peakLr, warmupSteps: cfg.warmupSteps, totalSteps: cfg.totalSteps });
  const reference = trainer.stages.map((s) => new Stage(s.spec, SEED));
  const trainSampler = new BatchSampler(data.train, cfg.batch, config.contextLength, SEED + 1);
  const probeSampler = new BatchSampler(data.train, cfg.batch, config.contextLength, SEED + 1000);
  const random = mulberry32(SEED + 77);
  const xbSaved: Array<{ ckpt: number; blobs: Uint8Array[]; probe: Probe; batch: TokenBatch }> = [];
  let lastLoss = NaN;
  const train = (): void => void (lastLoss = trainer.trainStep(trainSampler.next()).loss);

  for (const ckpt of cfg.checkpoints) {
    while (trainer.step < ckpt) train();
    losses.push({ config: cfg.name, ckpt, trainLoss: lastLoss });
    // The merge round's checkpoint: the validator's reference weights.
    trainer.stages.forEach((s, i) => importStageWeights(reference[i]!, exportStageWeightsSync(s)));
    const anchor = snapshotFlat(reference);
    let k = 0;
    for (const target of cfg.ks) {
      while (k < target) (train(), k++);
      const batches = Array.from({ length: cfg.probes }, () => probeSampler.next());
      // k = 0: the reference holds the miner's weights; replay once to check the replay is exact, then reuse.
      const exactCheck = k === 0 && !determinismChecked;
      const probes = batches.map((b) => probe(trainer.stages, k === 0 && !exactCheck ? null : reference, b));
      if (exactCheck) {
        determinismChecked = true;
        for (const p of probes) {
          const same = [...p.fwd, ...p.bwd.slice(1)].every((x) => x.miner.every((v, i) => v === x.ref[i])) && p.lossMiner === p.lossRef;
          if (!same) throw new Error('the replay with identical weights is not bit-exact');
        }
      }
      record(cfg, ckpt, k, probes, random);
      if (k === 0 && cfg.batch <= 8 && (ckpt === cfg.checkpoints[0] || ckpt === cfg.checkpoints.at(-1))) {
        xbSaved.push({ ckpt, blobs: reference.map((r) => exportStageWeightsSync(r)), probe: probes[0]!, batch: batches[0]! });
      }
      snapshotFlat(trainer.stages).forEach((w, stage) => weightDrift.push({ config: cfg.name, ckpt, k, stage, rel: norm(sub(w, anchor[stage]!)) / norm(anchor[stage]!) }));
    }
  }
  const specs = trainer.stages.map((s) => s.spec);
  trainer.dispose();
  reference.forEach((s) => s.dispose());
  if (xbSaved.length) {
    await tf.setBackend('cpu');
    for (const x of xbSaved) {
      const cpuStages = specs.map((spec, i) => {
        const st = new Stage(spec, SEED);
        importStageWeights(st, x.blobs[i]!);
        return st;
      });
      const r = replay(cpuStages, x.probe, x.batch);
      const S = specs.length;
      for (let s = 0; s < S - 1; s++) crossBackend.push({ config: cfg.name, ckpt: x.ckpt, where: `fwd${s}`, m: compare(x.probe.fwd[s]!.miner, r.fwd[s]!, s > 0 ? x.probe.fwd[s - 1]!.miner : undefined) });
      for (let s = 1; s < S; s++) crossBackend.push({ config: cfg.name, ckpt: x.ckpt, where: `bwd${s}`, m: compare(x.probe.bwd[s]!.miner, r.bwd[s]!, s < S - 1 ? x.probe.bwd[s + 1]!.miner : undefined) });
      crossBackend.push({ config: cfg.name, ckpt: x.ckpt, where: 'loss', m: { lossDiff: x.probe.lossMiner - r.loss, lossRatio: x.probe.lossMiner / r.loss } });
      cpuStages.forEach((st) => st.dispose());
    }
    // They are honest k = 0 answers from another machine: they count in the honest spread.
    for (const x of crossBackend.filter((c) => c.config === cfg.name)) samples.push({ config: `${cfg.name}/cpu-replay`, ckpt: x.ckpt, k: 0, probe: 0, who: 'honest', where: x.where, m: x.m });
    await tf.setBackend(backend);
  }
  printConfig(cfg, (performance.now() - t0) / 1000);
}

// ---------------------------------------------------------------- thresholds

type Direction = 'forward' | 'backward' | 'loss';
const DIRECTIONS: Direction[] = ['forward', 'backward', 'loss'];
const dirOf = (w: Where): Direction => (w === 'loss' ? 'loss' : w.startsWith('f') ? 'forward' : 'backward');
/** Each metric as a deviation from a perfect match (0 = identical; larger = further). */
const DEVS: Array<{ name: string; dev: (m: Metrics) => number | undefined }> = [
  { name: 'cos', dev: (m) => (m.cos === undefined ? undefined : 1 - m.cos) },
  { name: 'relErr', dev: (m) => m.relErr },
  { name: 'normRatio', dev: (m) => (m.normRatio === undefined ? undefined : lnAbs(m.normRatio)) },
  { name: 'deltaCos', dev: (m) => (m.deltaCos === undefined ? undefined : 1 - m.deltaCos) },
];
const METRICS: Record<Direction, typeof DEVS> = {
  forward: DEVS,
  backward: DEVS,
  loss: [
    { name: 'lossRelDiff', dev: (m) => (m.lossRatio === undefined ? undefined : Math.abs(m.lossRatio - 1)) },
    { name: 'lossAbsDiff', dev: (m) => (m.lossDiff === undefined ? undefined : Math.abs(m.lossDiff)) },
  ],
};
/** How a deviation threshold reads in the metric's own terms. */
function asMetric(name: string, dev: number): string {
  switch (name) {
    case 'cos':
    case 'deltaCos':
      return dev >= 1 ? `${name}: unusable (honest reaches ≤ 0)` : dev < 1e-3 ? `${name} ≥ 1 − ${sig(dev, 2)}` : `${name} ≥ ${sig(1 - dev, 4)}`;
    case 'relErr':
      return `relErr ≤ ${sig(dev, 3)}`;
    case 'normRatio':
      return dev < 1e-3 ? `|ln normRatio| ≤ ${sig(dev, 2)}` : `normRatio ∈ [${sig(Math.exp(-dev), 3)}, ${sig(Math.exp(dev), 3)}]`;
    case 'lossRelDiff':
      return `|miner/ref − 1| ≤ ${sig(dev, 3)}`;
    default:
      return `|miner − ref| ≤ ${sig(dev, 3)} nats`;
  }
}

interface MetricVerdict {
  honestWorstDev: number;
  honestWorstAt: string;
  thresholdDev: number;
  threshold: string;
  honestMarginFactor: number;
  cheats: Record<string, { bestDev: number; verdict: 'caught' | 'marginal' | 'not separable'; marginFactor: number }>;
}
interface ScopeResult {
  description: string;
  thresholds: Record<string, Record<string, MetricVerdict>>;
  honestEnvelopeByK: Record<string, Record<string, Record<number, number>>>;
  caughtBy: Record<string, string[]>;
  notSeparableBy: Record<string, string[]>;
  uncaught: string[];
}

/**
 * Per direction and metric: h = the honest worst deviation, each cheat's best
 * (smallest) deviation c; separable when c ≥ 1.2 h; threshold = h × min(2,
 * √(c_min / h)) with c_min the smallest separable c (equal factor margins both sides,
 * at most a factor 2 above the honest worst), or 2 h when none is separable.
 */
function thresholdsFor(description: string, keep: (s: Sample) => boolean, groupOf: (w: Where) => string = dirOf): ScopeResult {
  const inScope = samples.filter(keep);
  const honestIn = inScope.filter((s) => s.who === 'honest');
  const thresholds: ScopeResult['thresholds'] = {};
  const byK: ScopeResult['honestEnvelopeByK'] = {};
  const groups = [...new Set(inScope.map((s) => groupOf(s.where)))].sort((a, b) => DIRECTIONS.indexOf(dirOf(a)) - DIRECTIONS.indexOf(dirOf(b)) || a.localeCompare(b));
  for (const dir of groups) {
    thresholds[dir] = {};
    byK[dir] = {};
    for (const metric of METRICS[dirOf(dir)]) {
      const hs = honestIn.filter((s) => groupOf(s.where) === dir && metric.dev(s.m) !== undefined);
      if (!hs.length) continue;
      let worst = hs[0]!;
      for (const s of hs) if (metric.dev(s.m)! > metric.dev(worst.m)!) worst = s;
      // Floor: two honest machines never agree better than ~1e-4 (the CPU-backend replay); a zero h would make every threshold 0.
      const h = Math.max(metric.dev(worst.m)!, 1e-6);
      byK[dir]![metric.name] = {};
      for (const k of [...new Set(hs.map((s) => s.k))].sort((a, b) => a - b)) {
        byK[dir]![metric.name]![k] = sig(Math.max(...hs.filter((s) => s.k === k).map((s) => metric.dev(s.m)!)), 3);
      }
      const cheatDevs: Record<string, number> = {};
      for (const who of CHEATS) {
        const cs = inScope.filter((s) => s.who === who && groupOf(s.where) === dir && metric.dev(s.m) !== undefined);
        if (cs.length) cheatDevs[who] = Math.min(...cs.map((s) => metric.dev(s.m)!));
      }
      const separable = Object.values(cheatDevs).filter((c) => c >= 1.2 * h);
      const t = sig(h * (separable.length ? Math.min(2, Math.sqrt(Math.min(...separable) / h)) : 2), 2);
      const cheats: MetricVerdict['cheats'] = {};
      for (const [who, c] of Object.entries(cheatDevs)) {
        cheats[who] = { bestDev: sig(c, 4), verdict: c >= 1.2 * h && c > t ? 'caught' : c > h ? 'marginal' : 'not separable', marginFactor: sig(c / t, 3) };
      }
      thresholds[dir]![metric.name] = {
        honestWorstDev: sig(h, 4),
        honestWorstAt: `${worst.config} ckpt ${worst.ckpt} k ${worst.k} ${worst.where}`,
        thresholdDev: t,
        threshold: asMetric(metric.name, t),
        honestMarginFactor: sig(t / h, 3),
        cheats,
      };
    }
  }
  const caughtBy: Record<string, string[]> = {};
  const notSeparableBy: Record<string, string[]> = {};
  for (const [dir, ms] of Object.entries(thresholds)) {
    for (const [name, v] of Object.entries(ms)) {
      for (const [who, c] of Object.entries(v.cheats)) {
        if (c.verdict === 'caught') (caughtBy[who] ??= []).push(`${dir}/${name}`);
        else (notSeparableBy[`${dir}/${name}`] ??= []).push(c.verdict === 'marginal' ? `${who} (marginal)` : who);
      }
    }
  }
  const uncaught = CHEATS.filter((c) => !caughtBy[c]?.length);
  return { description, thresholds, honestEnvelopeByK: byK, caughtBy, notSeparableBy, uncaught };
}

function printScope(r: ScopeResult, brief = false): void {
  console.log(`\n===== ${r.description}`);
  console.log(`honest envelope by k (worst deviation over configs, checkpoints, stages, probes): 1−cos | relErr | |ln normRatio| | 1−deltaCos ; loss: |ratio−1| | |Δ| nats`);
  for (const dir of Object.keys(r.honestEnvelopeByK)) {
    const names = Object.keys(r.honestEnvelopeByK[dir]!);
    const ks = Object.keys(r.honestEnvelopeByK[dir]![names[0]!] ?? {}).map(Number);
    console.log(`  ${dir.padEnd(8)} ${names.map((n) => n.padStart(12)).join('')}`);
    for (const k of ks) console.log(`    k=${String(k).padStart(2)}   ${names.map((n) => String(r.honestEnvelopeByK[dir]![n]![k] ?? '—').padStart(12)).join('')}`);
  }
  if (brief) {
    console.log(`thresholds per stage (h: honest worst deviation, ×: honest margin factor; cheats: ✓ caught with margin factor, ~ marginal, ✗ inside the honest spread):`);
    for (const [g, ms] of Object.entries(r.thresholds)) {
      for (const [name, v] of Object.entries(ms)) {
        const cheats = Object.entries(v.cheats).map(([who, c]) => `${who}${c.verdict === 'caught' ? `✓${c.marginFactor}` : c.verdict === 'marginal' ? '~' : '✗'}`);
        console.log(`  ${`${g}/${name}`.padEnd(18)} ${v.threshold.padEnd(36)} h ${String(v.honestWorstDev).padEnd(8)} ×${String(v.honestMarginFactor).padEnd(5)} ${cheats.join(' ')}`);
      }
    }
    console.log(`  caught by: ${CHEATS.map((c) => `${c}: ${r.caughtBy[c]?.join(', ') ?? 'NOTHING'}`).join('; ')}`);
    return;
  }
  console.log(`thresholds (margin = factor between the threshold and a deviation):`);
  for (const [dir, ms] of Object.entries(r.thresholds)) {
    for (const [name, v] of Object.entries(ms)) {
      const cheats = Object.entries(v.cheats).map(([who, c]) => `${who} ${c.bestDev}${c.verdict === 'caught' ? ` ✓×${c.marginFactor}` : c.verdict === 'marginal' ? ' ~' : ' ✗'}`);
      console.log(`  ${`${dir}/${name}`.padEnd(21)} ${v.threshold.padEnd(34)} honest worst ${String(v.honestWorstDev).padEnd(8)} (×${v.honestMarginFactor}; ${v.honestWorstAt})`);
      console.log(`  ${''.padEnd(21)} cheats' best dev: ${cheats.join(', ')}`);
    }
  }
  console.log(`caught by: ${CHEATS.map((c) => `${c}: ${r.caughtBy[c]?.join(', ') ?? 'NOTHING'}`).join('; ')}`);
  console.log(`a single metric cannot separate: ${Object.entries(r.notSeparableBy).map(([m, w]) => `${m}: ${w.join(', ')}`).join('; ')}`);
  if (r.uncaught.length) console.log(`NOT CAUGHT by any metric in this scope: ${r.uncaught.join(', ')}`);
}

const maxK = Math.max(...CONFIGS.flatMap((c) => c.ks));
const honest = samples.filter((s) => s.who === 'honest');
const scopes = {
  all: thresholdsFor(`ALL checkpoints (incl. round 1, anchor = initial weights), k ≤ ${maxK}`, () => true),
  fromStep20: thresholdsFor(`checkpoints ≥ step 20 (after warm-up), k ≤ ${maxK}`, (s) => s.ckpt >= 20),
  fromStep20kLe10: thresholdsFor(`checkpoints ≥ step 20, k ≤ 10 (one merge interval)`, (s) => s.ckpt >= 20 && s.k <= 10),
};
const perStage = {
  all: thresholdsFor(`PER STAGE, all checkpoints, k ≤ ${maxK}`, () => true, (w) => w),
  fromStep20: thresholdsFor(`PER STAGE, checkpoints ≥ step 20, k ≤ ${maxK}`, (s) => s.ckpt >= 20, (w) => w),
  fromStep20kLe10: thresholdsFor(`PER STAGE, checkpoints ≥ step 20, k ≤ 10`, (s) => s.ckpt >= 20 && s.k <= 10, (w) => w),
  kLe1: thresholdsFor(`PER STAGE, all checkpoints, k ≤ 1 (cheats at k = 0)`, (s) => s.k <= 1, (w) => w),
};
for (const r of Object.values(scopes)) printScope(r);
for (const r of Object.values(perStage)) printScope(r, true);
console.log(`\n===== cross-backend floor (k = 0: the miner on WASM, the replay on the pure-JS CPU backend, same weights and inputs)`);
for (const x of crossBackend) console.log(`  ${x.config} ckpt ${x.ckpt} ${x.where.padEnd(5)} ${Object.entries(x.m).map(([k, v]) => `${k} ${sig(v, 6)}`).join(' ')}`);

/** The rules worth running: per stage, the metrics that catch at least one cheat, and what each catches (margin factor). */
function rules(r: ScopeResult): Record<string, Record<string, { threshold: string; honestMargin: number; catches: string[] }>> {
  const out: ReturnType<typeof rules> = {};
  for (const [g, ms] of Object.entries(r.thresholds)) {
    for (const [m, v] of Object.entries(ms)) {
      const catches = Object.entries(v.cheats).filter(([, c]) => c.verdict === 'caught').map(([who, c]) => `${who} ×${c.marginFactor}`);
      if (catches.length) (out[g] ??= {})[m] = { threshold: v.threshold, honestMargin: v.honestMarginFactor, catches };
    }
  }
  return out;
}
const floorRelErr = Math.max(0, ...crossBackend.map((x) => x.m.relErr ?? 0));
const floorLoss = Math.max(0, ...crossBackend.map((x) => Math.abs((x.m.lossRatio ?? 1) - 1)));
const recommended = {
  afterWarmup: { scope: perStage.fromStep20.description, rules: rules(perStage.fromStep20), notCaught: perStage.fromStep20.uncaught },
  afterWarmupOneInterval: { scope: perStage.fromStep20kLe10.description, rules: rules(perStage.fromStep20kLe10), notCaught: perStage.fromStep20kLe10.uncaught },
  firstRounds: { scope: perStage.all.description, rules: rules(perStage.all), notCaught: perStage.all.uncaught },
  exactReplay: {
    scope: "replay with the weights the miner actually used (k = 0, or weights the miner committed to): the honest spread is the machine floor",
    floor: { relErr: sig(floorRelErr, 3), lossRelDiff: sig(floorLoss, 3), cos: 'rounds to 1 at 6 digits' },
    rules: { relErr: '≤ 1e-2 (≥ 30× the WASM-vs-CPU floor; other backends unmeasured)', cos: '≥ 0.9999', lossRelDiff: '≤ 1e-3' },
    catches: 'every cheat here: the mildest, noise at 0.3 RMS, has relErr 0.3 (30× the threshold)',
  },
};
console.log(`\n===== recommended rules (per stage; only metrics that catch something)`);
for (const [name, rec] of Object.entries(recommended)) {
  if (!('rules' in rec) || name === 'exactReplay') continue;
  const r = rec as { scope: string; rules: ReturnType<typeof rules>; notCaught: string[] };
  console.log(`${name}: ${r.scope}`);
  for (const [g, ms] of Object.entries(r.rules)) for (const [m, v] of Object.entries(ms)) console.log(`  ${`${g}/${m}`.padEnd(18)} ${v.threshold.padEnd(36)} honest ×${String(v.honestMargin).padEnd(5)} catches ${v.catches.join(', ')}`);
  console.log(`  not caught: ${r.notCaught.join(', ') || 'none'}`);
}
console.log(`exactReplay: floor relErr ${sig(floorRelErr, 3)}, loss ${sig(floorLoss, 3)} → ${Object.entries(recommended.exactReplay.rules).map(([k, v]) => `${k} ${v}`).join('; ')}`);
if (SKIPPED.length) console.log(`skipped: ${SKIPPED.join('; ')}`);

// ---------------------------------------------------------------- the result

const honestSummary: Record<string, Record<string, Record<string, Record<string, Record<string, number>>>>> = {};
const cheatSummary: Record<string, Record<string, Record<string, Record<string, number>>>> = {};
for (const cfg of CONFIGS) {
  const hs = honest.filter((s) => s.config === cfg.name);
  honestSummary[cfg.name] = {};
  for (const ckpt of cfg.checkpoints) {
    honestSummary[cfg.name]![ckpt] = {};
    for (const k of cfg.ks) {
      const at = hs.filter((s) => s.ckpt === ckpt && s.k === k);
      honestSummary[cfg.name]![ckpt]![k] = Object.fromEntries([...new Set(at.map((s) => s.where))].map((w) => [w, honestStats(at.filter((s) => s.where === w))]));
    }
  }
  cheatSummary[cfg.name] = {};
  for (const who of CHEATS) {
    const cs = samples.filter((s) => s.config === cfg.name && s.who === who);
    if (!cs.length) continue;
    cheatSummary[cfg.name]![who] = {};
    for (const k of CHEAT_KS) {
      const at = cs.filter((s) => s.k === k);
      for (const w of new Set(at.map((s) => s.where))) cheatSummary[cfg.name]![who]![`${w}@k${k}`] = cheatStats(at.filter((s) => s.where === w));
    }
  }
}

/** A scope for the JSON: each cheat as "best deviation verdict (margin)". */
function compact(r: ScopeResult): object {
  const thresholds = Object.fromEntries(
    Object.entries(r.thresholds).map(([g, ms]) => [
      g,
      Object.fromEntries(
        Object.entries(ms).map(([m, v]) => [
          m,
          {
            threshold: v.threshold,
            thresholdDev: v.thresholdDev,
            honestWorstDev: v.honestWorstDev,
            honestWorstAt: v.honestWorstAt,
            honestMargin: v.honestMarginFactor,
            cheats: Object.fromEntries(Object.entries(v.cheats).map(([who, c]) => [who, `${c.bestDev} ${c.verdict}${c.verdict === 'caught' ? ` ×${c.marginFactor}` : ''}`])),
          },
        ]),
      ),
    ]),
  );
  return { description: r.description, honestEnvelopeByK: r.honestEnvelopeByK, thresholds, caughtBy: r.caughtBy, notSeparableBy: r.notSeparableBy, uncaught: r.uncaught };
}

(args['no-write'] ? (_: string, o: object) => console.log(JSON.stringify(o)) : finish)('spot-spread', {
  machine: machine(backend),
  seconds: Math.round((performance.now() - started) / 1000),
  method:
    'LocalTrainer, int8 codec at every boundary; reference = checkpoint weights at step ckpt; miner = the same trainer after k more AdamW steps on its own batches; fresh probe batches; each stage replayed on the miner pipeline\'s decoded input and output gradient; metrics after the codec. Cheats at k ∈ ' +
    CHEAT_KS.join(',') +
    '. Thresholds per scope: h = honest worst deviation, c_min = smallest cheat best-case deviation ≥ 1.2 h; threshold = h·min(2, √(c_min/h)), or 2h when no cheat is separable.',
  configs: CONFIGS.map(({ name, preset, stages, bottleneck, batch, peakLr, warmupSteps, totalSteps, checkpoints, ks, probes }) => ({ name, preset, stages, bottleneck, batch, peakLr, warmupSteps, totalSteps, checkpoints, ks, probes })),
  skipped: SKIPPED,
  trainLossAtCheckpoint: losses.map((l) => ({ ...l, trainLoss: Number.isFinite(l.trainLoss) ? sig(l.trainLoss) : null })),
  weightDrift: weightDrift.filter((w) => w.k === maxK || w.k === 10).map((w) => ({ ...w, rel: sig(w.rel, 3) })),
  honest: honestSummary,
  cheats: cheatSummary,
  crossBackend: crossBackend.map((x) => ({ ...x, m: Object.fromEntries(Object.entries(x.m).map(([k, v]) => [k, sig(v, 6)])) })),
  thresholds: Object.fromEntries(Object.entries(scopes).map(([n, r]) => [n, compact(r)])),
  thresholdsPerStage: Object.fromEntries(Object.entries(perStage).map(([n, r]) => [n, compact(r)])),
  recommended,
});
