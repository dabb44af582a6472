import * as tf from '@tensorflow/tfjs';
import type { Params } from './params';

/**
 * The transformer's pieces as pure functions of (parameters, input). Being
 * functional, one stage's forward can be differentiated with respect to its
 * input and its weights together (tf.grads), which is how a stage computes
 * its vector-Jacobian product.
 *
 * Shapes: B batch, T time, d width, H heads, V vocabulary; activations are
 * kept 2-D as [B*T, d] between blocks.
 */

const LN_EPS = 1e-5;

/** Swaps the last two axes. */
function swapLast(t: tf.Tensor): tf.Tensor {
  const perm = t.shape.map((_, i) => i);
  [perm[perm.length - 2], perm[perm.length - 1]] = [perm[perm.length - 1]!, perm[perm.length - 2]!];
  return tf.transpose(t, perm);
}

/**
 * a · b (batched over leading axes) whose gradient uses explicit transposes:
 * dA = dY · bᵀ, dB = aᵀ · dY. TensorFlow.js's own matMul gradient asks for
 * transposed matmuls, which tfjs-backend-wasm 4.22 runs about 10x slower than a
 * transpose followed by a plain matmul (measured: 30 ms against 3 ms for a
 * [2048, 64] × [64, 256] product). The result is the same on every backend.
 */
export const mmComposite = tf.customGrad(((a: tf.Tensor, b: tf.Tensor, save: tf.GradSaveFunc) => {
  save([a, b]);
  return {
    value: tf.matMul(a, b),
    gradFunc: (dy: tf.Tensor | tf.Tensor[], [sa, sb]: tf.Tensor[]) => [
      tf.matMul(dy as tf.Tensor, swapLast(sb!)),
      tf.matMul(swapLast(sa!), dy as tf.Tensor),
    ],
  };
}) as unknown as Parameters<typeof tf.customGrad>[0]) as <R extends tf.Tensor>(a: R, b: tf.Tensor) => R;

/** a · bᵀ over the last two axes, from mmComposite and an explicit transpose. */
export function mmTransposedComposite<R extends tf.Tensor>(a: R, b: tf.Tensor): R {
  return mmComposite(a, swapLast(b));
}

/** a · b, batched over leading axes: a backend's fused form where one is installed (WebGPU: transposed operands read in place), else mmComposite. */
export function mm<R extends tf.Tensor>(a: R, b: tf.Tensor): R {
  const fused = fusedOp('matMul');
  return (fused ? fused(a, b) : mmComposite(a, b)) as R;
}

/** a · bᵀ over the last two axes (attention's scores q · kᵀ). */
export function mmTransposed<R extends tf.Tensor>(a: R, b: tf.Tensor): R {
  const fused = fusedOp('matMulTransposed');
  return (fused ? fused(a, b) : mmTransposedComposite(a, b)) as R;
}

/**
 * Pieces of the model as fused kernels of one backend (WebGPU:
 * ../webgpu/layernorm.ts, ../webgpu/gelu.ts, ../webgpu/matmul.ts,
 * ../webgpu/attention.ts), each installed with
 * setFusedLayerOp once a kernel check has measured it against the composite
 * below, forward and backward. Used only while that backend is active; every
 * other backend (the validator's WASM included) runs the composites.
 */
export interface FusedLayerOps {
  layerNorm(x: tf.Tensor2D, g: tf.Tensor, b: tf.Tensor): tf.Tensor2D;
  gelu(x: tf.Tensor): tf.Tensor;
  matMul(a: tf.Tensor, b: tf.Tensor): tf.Tensor;
  matMulTransposed(a: tf.Tensor, b: tf.Tensor): tf.Tensor;
  /** causalSelfAttentionComposite's contract: qkv [B*T, 3d] → [B*T, d]. */
  attention(qkv: tf.Tensor2D, batch: number, time: number, heads: number): tf.Tensor2D;
  /** addLayerNormComposite's contract. */
  addLayerNorm(x: tf.Tensor2D, a: tf.Tensor2D, g: tf.Tensor, b: tf.Tensor, lane?: number): AddNormed;
  /** c + a · b, c of the product's shape. */
  matMulAdd(a: tf.Tensor2D, b: tf.Tensor2D, c: tf.Tensor2D): tf.Tensor2D;
}

const fusedOps: { [K in keyof FusedLayerOps]?: { backend: string; impl: FusedLayerOps[K] } } = {};

/** Installs (or, with undefined, removes) a backend's fused form of one op. */
export function setFusedLayerOp<K extends keyof FusedLayerOps>(name: K, backend: string, impl: FusedLayerOps[K] | undefined): void {
  if (impl) (fusedOps as Record<string, unknown>)[name] = { backend, impl };
  else delete fusedOps[name];
}

/** The fused form of an op on the active backend, if one is installed. */
function fusedOp<K extends keyof FusedLayerOps>(name: K): FusedLayerOps[K] | undefined {
  const op = fusedOps[name];
  return op && tf.getBackend() === op.backend ? (op.impl as FusedLayerOps[K]) : undefined;
}

export function layerNorm(x: tf.Tensor2D, g: tf.Tensor, b: tf.Tensor): tf.Tensor2D {
  const fused = fusedOp('layerNorm');
  return fused ? fused(x, g, b) : layerNormComposite(x, g, b);
}

/** Layer norm from tfjs ops: what every backend without fused kernels runs, and what fused kernels are checked against. */
export function layerNormComposite(x: tf.Tensor2D, g: tf.Tensor, b: tf.Tensor): tf.Tensor2D {
  const { mean, variance } = tf.moments(x, -1, true); // [N, 1]
  return tf.add(tf.mul(tf.mul(tf.sub(x, mean), tf.rsqrt(tf.add(variance, LN_EPS))), g), b);
}

/** What addLayerNorm gives: the sum (unless a lane was asked for), its norm, and the lane. */
export interface AddNormed {
  /** x + a [B*T, d]; absent when `lane` was asked for (the stream ends in the lane and the norm). */
  sum?: tf.Tensor2D;
  normed: tf.Tensor2D;
  /** The sum's first `lane` columns (the bottleneck's residual lane). */
  lane?: tf.Tensor2D;
}

/**
 * A residual add and the layer norm that reads its sum: s = x + a (x
 * zero-padded on the right when narrower than a: the bottleneck's lane
 * returning to the stream) and layerNorm(s, g, b); with `lane`, s's first
 * `lane` columns instead of s (the stream's end at a bottleneck). Fused on
 * WebGPU into one launch forward and two backward (../webgpu/add-layernorm.ts),
 * the gradient of s accumulated inside.
 */
export function addLayerNorm(x: tf.Tensor2D, a: tf.Tensor2D, g: tf.Tensor, b: tf.Tensor, lane?: number): AddNormed {
  const fused = fusedOp('addLayerNorm');
  return fused ? fused(x, a, g, b, lane) : addThenNorm(x, a, g, b, lane, layerNorm);
}

/** addLayerNorm from tfjs ops: what fused kernels are checked against. */
export function addLayerNormComposite(x: tf.Tensor2D, a: tf.Tensor2D, g: tf.Tensor, b: tf.Tensor, lane?: number): AddNormed {
  return addThenNorm(x, a, g, b, lane, layerNormComposite);
}

function addThenNorm(x: tf.Tensor2D, a: tf.Tensor2D, g: tf.Tensor, b: tf.Tensor, lane: number | undefined, norm: typeof layerNorm): AddNormed {
  const sum = tf.add(x.shape[1] === a.shape[1] ? x : padRight(x, a.shape[1]), a) as tf.Tensor2D;
  // The lane is sliced before the norm reads the sum: the order the gradients of the sum are accumulated in.
  if (lane !== undefined) {
    const laneOf = tf.slice(sum, [0, 0], [-1, lane]) as tf.Tensor2D;
    return { normed: norm(sum, g, b), lane: laneOf };
  }
  return { sum, normed: norm(sum, g, b) };
}

function padRight(x: tf.Tensor2D, width: number): tf.Tensor2D {
  return tf.pad(x, [
    [0, 0],
    [0, width - x.shape[1]],
  ]);
}

/** c + a · b: the residual lane added in the matmul's epilogue where a backend fuses it. */
export function mmAdd(a: tf.Tensor2D, b: tf.Tensor2D, c: tf.Tensor2D): tf.Tensor2D {
  const fused = fusedOp('matMulAdd');
  return fused ? fused(a, b, c) : mmAddComposite(a, b, c);
}

export function mmAddComposite(a: tf.Tensor2D, b: tf.Tensor2D, c: tf.Tensor2D): tf.Tensor2D {
  return tf.add(c, mm(a, b)) as tf.Tensor2D;
}

/** Exact GELU, 0.5·x·(1 + erf(x/√2)); erf has kernels and gradients on every backend. */
export function gelu(x: tf.Tensor): tf.Tensor {
  const fused = fusedOp('gelu');
  return fused ? fused(x) : geluComposite(x);
}

/** GELU from tfjs ops: what every backend without fused kernels runs, and what fused kernels are checked against. */
export function geluComposite(x: tf.Tensor): tf.Tensor {
  return tf.mul(tf.mul(x, 0.5), tf.add(tf.erf(tf.mul(x, Math.SQRT1_2)), 1));
}

/**
 * One-hot rows as float32. tfjs-backend-wasm 4.22's OneHot kernel writes int32
 * bits whatever dtype is asked for, so build int32 and cast (correct everywhere).
 */
export function oneHotFloat(ids: tf.Tensor1D, depth: number): tf.Tensor2D {
  return tf.cast(tf.oneHot(ids, depth), 'float32') as tf.Tensor2D; // [N, depth]
}

/**
 * Token embedding lookup. The gather's own gradient needs UnsortedSegmentSum,
 * which the WASM backend lacks; the gradient here is onehot(ids)ᵀ · dy, a
 * matmul that every backend has.
 */
export function embed(wte: tf.Tensor2D, ids: tf.Tensor1D): tf.Tensor2D {
  const vocab = wte.shape[0];
  const lookup = tf.customGrad(((w: tf.Tensor) => ({
    value: tf.gather(w, ids),
    gradFunc: (dy: tf.Tensor | tf.Tensor[]) =>
      tf.matMul(tf.transpose(oneHotFloat(ids, vocab)), dy as tf.Tensor2D), // [V, d]
  })) as unknown as Parameters<typeof tf.customGrad>[0]);
  return lookup(wte) as tf.Tensor2D; // [B*T, d]
}

/** Causal multi-head self-attention on [B*T, d]: the qkv projection, the heads' attention, the output projection. */
export function attention(x: tf.Tensor2D, p: Params, prefix: string, batch: number, time: number, heads: number): tf.Tensor2D {
  const qkv = mm(x, p[`${prefix}.wqkv`]!); // [B*T, 3d]
  const fused = fusedOp('attention');
  const merged = fused ? fused(qkv, batch, time, heads) : causalSelfAttentionComposite(qkv, batch, time, heads); // [B*T, d]
  return mm(merged, p[`${prefix}.wo`]!);
}

/**
 * The heads' causal attention from tfjs ops: qkv [B*T, 3d] (q, k, v side by
 * side, head h at columns h·hd of each) → [B*T, d], heads side by side. What
 * every backend without a fused kernel runs, and what fused kernels are
 * checked against.
 */
export function causalSelfAttentionComposite(qkv: tf.Tensor2D, batch: number, time: number, heads: number): tf.Tensor2D {
  const d = qkv.shape[1] / 3;
  const hd = d / heads;
  const [q, k, v] = tf.split(qkv, 3, 1).map(
    (t) => tf.transpose(tf.reshape(t, [batch, time, heads, hd]), [0, 2, 1, 3]), // [B, H, T, hd]
  );
  const scores = tf.mul(mmTransposed(q!, k!), 1 / Math.sqrt(hd)); // [B, H, T, T]
  const masked = tf.add(scores, causalMask(time)); // future positions get -1e9
  const weights = tf.softmax(masked); // [B, H, T, T]
  const y = mm(weights, v!); // [B, H, T, hd]
  return tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [batch * time, d]) as tf.Tensor2D; // [B*T, d]
}

const masks = new Map<string, tf.Tensor2D>();

/**
 * The additive causal mask [T, T], built once per backend and length and kept
 * (on WebGPU, building it each forward cost a CPU array, an upload and three
 * kernels per layer: measured ~6% of a step's CPU time on an H100).
 */
function causalMask(time: number): tf.Tensor2D {
  const key = `${tf.getBackend()}:${time}`;
  const cached = masks.get(key);
  if (cached && !cached.isDisposed) return cached;
  const mask = tf.tidy(() => {
    const lower = tf.linalg.bandPart(tf.ones([time, time]), -1, 0); // 1 on and below the diagonal
    return tf.keep(tf.mul(tf.sub(1, lower), -1e9) as tf.Tensor2D);
  });
  masks.set(key, mask);
  return mask;
}

export function mlp(x: tf.Tensor2D, p: Params, prefix: string): tf.Tensor2D {
  const hidden = gelu(mm(x, p[`${prefix}.wfc`]!)); // [B*T, 4d]
  return mm(hidden as tf.Tensor2D, p[`${prefix}.wproj`]!); // [B*T, d]
}

/**
 * Bottleneck encoder at the end of a stage: d → b. The first b channels of the
 * residual stream (`lane`, IOTA's residual lane) pass straight through; a
 * learned projection of the normalised stream (`normed`, by the bottleneck's
 * own layer norm) is added to them.
 */
export function bottleneckDown(lane: tf.Tensor2D, normed: tf.Tensor2D, p: Params, boundary: number): tf.Tensor2D {
  return mmAdd(normed, p[`bneck.${boundary}.down`]! as tf.Tensor2D, lane);
}

/** Mean cross-entropy of logits [N, V] against target ids [N]. */
export function crossEntropy(logits: tf.Tensor2D, targets: tf.Tensor1D): tf.Scalar {
  const logp = tf.logSoftmax(logits);
  const picked = tf.sum(tf.mul(logp, oneHotFloat(targets, logits.shape[1])), -1); // [N]
  return tf.neg(tf.mean(picked)) as tf.Scalar;
}
