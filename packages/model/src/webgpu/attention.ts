import * as tf from '@tensorflow/tfjs';
import { causalSelfAttentionComposite, setFusedLayerOp } from '../layers';
import { mulberry32 } from '../rng';
import { requireWebGPUBackend } from './codec-gpu';
import { checkFusedOp, foldChecks, type FusedKernelCheck } from './fused-check';
import { type MultiProgram, multiPrograms, workgroupReduce } from './multi-program';

/**
 * Causal multi-head self-attention in WGSL: 1 launch forward and 1 backward.
 *
 * tfjs composes attention (layers.ts, causalSelfAttentionComposite) from the
 * split of qkv into q, k and v (3 slices), their head layout (3 transposes),
 * q·kᵀ, the scale, the mask, the softmax, the weighted sum of v and the heads'
 * transpose back: 12 launches forward, and ~14 for its gradient, per layer.
 * Here one workgroup of THREADS threads owns one (sequence, head, position i):
 *
 * - forward (attentionProgram): the scores of row i against positions ≤ i in
 *   workgroup memory, their max and Σexp by tree reductions, then the
 *   weighted sum of v written straight into the merged [B·T, d] layout, and
 *   the row's log-sum-exp (second output) kept for the backward;
 * - backward (attentionGradProgram): from qkv, y, dy and the log-sum-exp,
 *   with Dᵢ = dyᵢ·yᵢ (= Σₛ Pᵢₛ dPᵢₛ) and dSᵢₛ = Pᵢₛ (dPᵢₛ − Dᵢ): row i's dq
 *   (Σₛ dSᵢₛ kₛ, over s ≤ i) and column i's dk (Σₜ dSₜᵢ qₜ) and dv
 *   (Σₜ Pₜᵢ dyₜ, over t ≥ i), all three written into dqkv in qkv's layout.
 *
 * The same formulas as the composite (scores scaled after the dot product,
 * masked positions weighing exactly 0), summed in another order.
 */
const THREADS = 64;

interface Shape {
  batch: number;
  time: number;
  heads: number;
  headDim: number;
}

function constants({ time, heads, headDim }: Shape): string {
  return `
const T = ${time}u;
const H = ${heads}u;
const HD = ${headDim}u;
const D = ${heads * headDim}u;
const SCALE = ${1 / Math.sqrt(headDim)};`;
}

/** qkv [B·T, 3d] → y [B·T, d] and the log-sum-exp of each (sequence, head, row) [B·H·T]. */
export function attentionProgram(s: Shape): MultiProgram {
  const d = s.heads * s.headDim;
  return {
    kind: 'tah_attention',
    key: `tah_attention_${s.time}_${s.heads}_${s.headDim}`,
    outputs: [
      { name: 'y', shape: [s.batch * s.time, d] },
      { name: 'lse', shape: [s.batch * s.heads * s.time] },
    ],
    inputs: ['qkv'],
    threads: THREADS,
    workgroups: s.batch * s.heads * s.time,
    prelude: `${constants(s)}
var<workgroup> tahScore : array<f32, ${s.time}>;
var<workgroup> tahRed : array<f32, ${THREADS}>;`,
    body: `
  let i = wg % T;
  let h = (wg / T) % H;
  let b = wg / (T * H);
  let q0 = (b * T + i) * 3u * D + h * HD;
  var m = -1.0e38;
  for (var s = lid; s <= i; s = s + ${THREADS}u) {
    let k0 = (b * T + s) * 3u * D + D + h * HD;
    var dot = 0.0;
    for (var j = 0u; j < HD; j = j + 1u) { dot = dot + qkv[q0 + j] * qkv[k0 + j]; }
    let score = dot * SCALE;
    tahScore[s] = score;
    m = max(m, score);
  }
  var mx = 0.0;
  ${workgroupReduce('tahRed', 'm', 'mx', THREADS, 'max')}
  var e = 0.0;
  for (var s = lid; s <= i; s = s + ${THREADS}u) {
    let x = exp(tahScore[s] - mx);
    tahScore[s] = x;
    e = e + x;
  }
  var total = 0.0;
  ${workgroupReduce('tahRed', 'e', 'total', THREADS)}
  for (var j = lid; j < HD; j = j + ${THREADS}u) {
    var acc = 0.0;
    for (var s = 0u; s <= i; s = s + 1u) { acc = acc + (tahScore[s] / total) * qkv[(b * T + s) * 3u * D + 2u * D + h * HD + j]; }
    y[(b * T + i) * D + h * HD + j] = acc;
  }
  if (lid == 0u) { lse[wg] = mx + log(total); }`,
  };
}

/** qkv, y, dy [B·T, d] and lse → dqkv [B·T, 3d]. */
export function attentionGradProgram(s: Shape): MultiProgram {
  const d = s.heads * s.headDim;
  return {
    kind: 'tah_attention_grad',
    key: `tah_attention_grad_${s.time}_${s.heads}_${s.headDim}`,
    outputs: [{ name: 'dqkv', shape: [s.batch * s.time, 3 * d] }],
    inputs: ['qkv', 'y', 'dy', 'lse'],
    threads: THREADS,
    workgroups: s.batch * s.heads * s.time,
    prelude: `${constants(s)}
var<workgroup> tahRowDs : array<f32, ${s.time}>;
var<workgroup> tahColP : array<f32, ${s.time}>;
var<workgroup> tahColDs : array<f32, ${s.time}>;`,
    body: `
  let i = wg % T;
  let h = (wg / T) % H;
  let b = wg / (T * H);
  let lse0 = (b * H + h) * T;
  let q0 = (b * T + i) * 3u * D + h * HD;
  let k0 = q0 + D;
  let v0 = q0 + 2u * D;
  let o0 = (b * T + i) * D + h * HD;
  var di = 0.0;
  for (var j = 0u; j < HD; j = j + 1u) { di = di + dy[o0 + j] * y[o0 + j]; }
  // Row i: dS over s <= i.
  for (var s = lid; s <= i; s = s + ${THREADS}u) {
    let ks = (b * T + s) * 3u * D + D + h * HD;
    var qk = 0.0;
    var dp = 0.0;
    for (var j = 0u; j < HD; j = j + 1u) {
      qk = qk + qkv[q0 + j] * qkv[ks + j];
      dp = dp + dy[o0 + j] * qkv[ks + D + j];
    }
    let p = exp(qk * SCALE - lse[lse0 + i]);
    tahRowDs[s] = p * (dp - di);
  }
  // Column i: P and dS over t >= i.
  for (var t = i + lid; t < T; t = t + ${THREADS}u) {
    let qt = (b * T + t) * 3u * D + h * HD;
    let ot = (b * T + t) * D + h * HD;
    var qk = 0.0;
    var dp = 0.0;
    var dt = 0.0;
    for (var j = 0u; j < HD; j = j + 1u) {
      qk = qk + qkv[qt + j] * qkv[k0 + j];
      dp = dp + dy[ot + j] * qkv[v0 + j];
      dt = dt + dy[ot + j] * y[ot + j];
    }
    let p = exp(qk * SCALE - lse[lse0 + t]);
    tahColP[t] = p;
    tahColDs[t] = p * (dp - dt);
  }
  workgroupBarrier();
  for (var j = lid; j < HD; j = j + ${THREADS}u) {
    var dq = 0.0;
    for (var s = 0u; s <= i; s = s + 1u) { dq = dq + tahRowDs[s] * qkv[(b * T + s) * 3u * D + D + h * HD + j]; }
    var dk = 0.0;
    var dv = 0.0;
    for (var t = i; t < T; t = t + 1u) {
      dk = dk + tahColDs[t] * qkv[(b * T + t) * 3u * D + h * HD + j];
      dv = dv + tahColP[t] * dy[(b * T + t) * D + h * HD + j];
    }
    dqkv[q0 + j] = dq * SCALE;
    dqkv[k0 + j] = dk * SCALE;
    dqkv[v0 + j] = dv;
  }`,
  };
}

/** The fused attention for one shape: forward keeps qkv, y and the log-sum-exp; the gradient is one launch. */
function fusedAttentionOp(batch: number, time: number, heads: number): (qkv: tf.Tensor2D) => tf.Tensor2D {
  return tf.customGrad(((qkv: tf.Tensor2D, save: tf.GradSaveFunc) => {
    const shape = { batch, time, heads, headDim: qkv.shape[1] / 3 / heads };
    const [y, lse] = multiPrograms.run(attentionProgram(shape), [qkv]);
    save([qkv, y!, lse!]);
    lse!.dispose();
    return {
      value: y!,
      gradFunc: (dy: tf.Tensor | tf.Tensor[], [sq, sy, sl]: tf.Tensor[]) => multiPrograms.run(attentionGradProgram(shape), [sq!, sy!, dy as tf.Tensor, sl!]),
    };
  }) as unknown as Parameters<typeof tf.customGrad>[0]) as unknown as (qkv: tf.Tensor2D) => tf.Tensor2D;
}

export const fusedAttentionGPU = (qkv: tf.Tensor2D, batch: number, time: number, heads: number): tf.Tensor2D => {
  if (qkv.shape[1] % (3 * heads) !== 0) throw new RangeError(`attention: qkv width ${qkv.shape[1]} is not 3 × ${heads} heads × a head width`);
  return fusedAttentionOp(batch, time, heads)(qkv);
};

/**
 * The fused attention against the composite (tfjs's ops on the same
 * backend), forward and backward (dqkv), on seeded random shapes: odd
 * lengths, head widths and batch sizes, a length over one workgroup's
 * THREADS, the `small` preset's shape. TOLERANCE 1e-4 of each output's largest
 * magnitude: the two sum the same products in another order (exp of the
 * log-sum-exp against Σexp, a max from a tree), and a wrong index, mask or
 * formula is O(1) off.
 */
export async function attentionKernelCheck(): Promise<FusedKernelCheck> {
  requireWebGPUBackend();
  const random = mulberry32(28);
  const shapes = [
    { batch: 2, time: 7, heads: 3, headDim: 5 },
    { batch: 1, time: 70, heads: 2, headDim: 33 },
    { batch: 3, time: 17, heads: 4, headDim: 8 },
    { batch: 1, time: 128, heads: 8, headDim: 32 },
  ];
  const values = (n: number, scale: number): Float32Array => Float32Array.from({ length: n }, () => (random() * 2 - 1) * scale);
  const cases = shapes.map((s) => {
    const rows = s.batch * s.time;
    const d = s.heads * s.headDim;
    return { shape: s, inputs: [tf.tensor2d(values(rows * 3 * d, 1.5), [rows, 3 * d])], dy: tf.tensor2d(values(rows * d, 1), [rows, d]) };
  });
  // One check per shape (checkFusedOp's functions take the tensors only), folded into one.
  const results: FusedKernelCheck[] = [];
  for (const c of cases) {
    const { batch, time, heads } = c.shape;
    const f = (qkv: tf.Tensor) => fusedAttentionGPU(qkv as tf.Tensor2D, batch, time, heads);
    const g = (qkv: tf.Tensor) => causalSelfAttentionComposite(qkv as tf.Tensor2D, batch, time, heads);
    results.push(await checkFusedOp(`attention (batch ${batch}, ${heads} heads of ${c.shape.headDim})`, f, g, [{ inputs: c.inputs, dy: c.dy }], 1e-4));
  }
  return foldChecks(results);
}

/** Runs attentionKernelCheck and, when it holds, makes attention use the fused kernels on WebGPU. */
export async function useFusedAttention(): Promise<FusedKernelCheck> {
  const check = await attentionKernelCheck();
  setFusedLayerOp('attention', 'webgpu', check.ok ? fusedAttentionGPU : undefined);
  return check;
}
