import * as tf from '@tensorflow/tfjs';
import type { ParamSpec } from './params';

export interface AdamWOptions {
  beta1?: number;
  beta2?: number;
  epsilon?: number;
  /** Decoupled weight decay, applied to matrices only. */
  weightDecay?: number;
}

/** The float32 constants of one AdamW step, as optim.ts's composite uses them (each a float64 expression rounded once). */
export interface AdamWConstants {
  beta1: number;
  oneMinusBeta1: number;
  beta2: number;
  oneMinusBeta2: number;
  c1: number;
  c2: number;
  epsilon: number;
  lr: number;
  /** 1 − lr·weightDecay for tensors with decay, 1 for the others. */
  decayFactor: number;
}

/**
 * The optimizer step as fused kernels of one backend (WebGPU:
 * ../webgpu/optim-gpu.ts), installed with setFusedAdamW once a kernel check
 * has measured it against the composite. Used only while that backend is
 * active; every other backend runs the composite below.
 */
export interface FusedAdamW {
  backend: string;
  /** Σ g² over all the tensors, as one tensor of partial sums. */
  sumSquares(gs: tf.Tensor[]): tf.Tensor1D;
  /** The global norm of the gradients (√Σ of sumSquares' partials) and the clip factor maxNorm / max(norm, maxNorm), shape [1]. */
  clip(partials: tf.Tensor1D, maxNorm: number): { norm: tf.Scalar; scale: tf.Tensor };
  /** The new weights, first and second moments; scale is the clip factor, shape [1]. */
  step(p: tf.Tensor, m: tf.Tensor, v: tf.Tensor, g: tf.Tensor, scale: tf.Tensor, k: AdamWConstants): { p: tf.Tensor; m: tf.Tensor; v: tf.Tensor };
}

let fused: FusedAdamW | undefined;

/** Installs (or, with undefined, removes) the fused optimizer step of a backend. */
export function setFusedAdamW(impl: FusedAdamW | undefined): void {
  fused = impl;
}

/** Whether steps on the active backend run fused kernels. */
export function fusedAdamWActive(): boolean {
  return fused !== undefined && tf.getBackend() === fused.backend;
}

/** AdamW (Loshchilov & Hutter): Adam moments with weight decay applied to the weights directly. */
export class AdamW {
  private readonly m: Record<string, tf.Variable> = {};
  private readonly v: Record<string, tf.Variable> = {};
  private readonly beta1: number;
  private readonly beta2: number;
  private readonly epsilon: number;
  private readonly weightDecay: number;
  step = 0;

  constructor(
    private readonly params: Record<string, tf.Variable>,
    private readonly specs: ParamSpec[],
    options: AdamWOptions = {},
  ) {
    this.beta1 = options.beta1 ?? 0.9;
    this.beta2 = options.beta2 ?? 0.95;
    this.epsilon = options.epsilon ?? 1e-8;
    this.weightDecay = options.weightDecay ?? 0.1;
    for (const s of specs) {
      this.m[s.name] = tf.variable(tf.zeros(s.shape), false);
      this.v[s.name] = tf.variable(tf.zeros(s.shape), false);
    }
  }

  apply(grads: Record<string, tf.Tensor>, lr: number): void {
    this.step++;
    const c1 = 1 - this.beta1 ** this.step;
    const c2 = 1 - this.beta2 ** this.step;
    tf.tidy(() => {
      for (const s of this.specs) {
        const g = grads[s.name];
        if (!g) continue;
        const p = this.params[s.name]!;
        const m = tf.add(tf.mul(this.m[s.name]!, this.beta1), tf.mul(g, 1 - this.beta1));
        const v = tf.add(tf.mul(this.v[s.name]!, this.beta2), tf.mul(tf.square(g), 1 - this.beta2));
        this.m[s.name]!.assign(m);
        this.v[s.name]!.assign(v);
        const update = tf.div(tf.div(m, c1), tf.add(tf.sqrt(tf.div(v, c2)), this.epsilon));
        const decayed = s.decay ? tf.mul(p, 1 - lr * this.weightDecay) : p;
        p.assign(tf.sub(decayed, tf.mul(update, lr)));
      }
    });
  }

  /**
   * Clips the gradients to a global L2 norm of at most maxNorm, then steps:
   * clipByGlobalNorm and apply, or the same arithmetic in fused kernels where
   * the active backend has them (setFusedAdamW). Takes ownership of grads
   * (disposed); returns the norm before clipping, which the caller disposes.
   */
  applyClipped(grads: Record<string, tf.Tensor>, lr: number, maxNorm: number): tf.Scalar {
    if (!fusedAdamWActive()) {
      const clipped = clipByGlobalNorm(grads, maxNorm);
      this.apply(clipped.grads, lr);
      tf.dispose(Object.values(clipped.grads));
      return clipped.norm;
    }
    const impl = fused!;
    this.step++;
    const constants = this.constants(lr);
    const norm = tf.tidy(() => {
      const { norm: n, scale } = impl.clip(impl.sumSquares(Object.values(grads)), maxNorm);
      for (const s of this.specs) {
        const g = grads[s.name];
        if (!g) continue;
        const out = impl.step(this.params[s.name]!, this.m[s.name]!, this.v[s.name]!, g, scale, { ...constants, decayFactor: s.decay ? constants.decayFactor : 1 });
        this.m[s.name]!.assign(out.m);
        this.v[s.name]!.assign(out.v);
        this.params[s.name]!.assign(out.p);
      }
      return n;
    });
    tf.dispose(Object.values(grads));
    return norm;
  }

  /** The float32 constants of the next step's composite (this.step already counts it). */
  private constants(lr: number): AdamWConstants {
    const f = Math.fround;
    return {
      beta1: f(this.beta1),
      oneMinusBeta1: f(1 - this.beta1),
      beta2: f(this.beta2),
      oneMinusBeta2: f(1 - this.beta2),
      c1: f(1 - this.beta1 ** this.step),
      c2: f(1 - this.beta2 ** this.step),
      epsilon: f(this.epsilon),
      lr: f(lr),
      decayFactor: f(1 - lr * this.weightDecay),
    };
  }

  /**
   * The moments and step count as one blob (step as a uint32, then every
   * first moment and every second moment in parameter order, float32
   * little-endian): what a round's audit replays from, committed by hash at
   * each merge (packages/swarm/src/audit/).
   */
  async exportState(): Promise<Uint8Array> {
    const parts = (await Promise.all([...this.specs.map((s) => this.m[s.name]!.data()), ...this.specs.map((s) => this.v[s.name]!.data())])) as Float32Array[];
    const floats = parts.reduce((n, p) => n + p.length, 0);
    const out = new Uint8Array(4 + 4 * floats);
    const view = new DataView(out.buffer);
    view.setUint32(0, this.step, true);
    let at = 4;
    for (const p of parts) for (let i = 0; i < p.length; i++, at += 4) view.setFloat32(at, p[i]!, true);
    return out;
  }

  /** Restores exportState's blob; checks its size first, so a blob for another stage changes nothing. */
  importState(blob: Uint8Array): void {
    const sizes = this.specs.map((s) => s.shape.reduce((a, b) => a * b, 1));
    const floats = 2 * sizes.reduce((a, b) => a + b, 0);
    if (blob.length !== 4 + 4 * floats) throw new RangeError(`optimizer state of ${blob.length} bytes for a stage that needs ${4 + 4 * floats}`);
    const view = new DataView(blob.buffer, blob.byteOffset, blob.byteLength);
    let at = 4;
    const read = (n: number): Float32Array => {
      const a = new Float32Array(n);
      for (let i = 0; i < n; i++, at += 4) a[i] = view.getFloat32(at, true);
      return a;
    };
    const m = sizes.map(read);
    const v = sizes.map(read);
    this.specs.forEach((s, i) => {
      tf.tidy(() => {
        this.m[s.name]!.assign(tf.tensor(m[i]!, s.shape));
        this.v[s.name]!.assign(tf.tensor(v[i]!, s.shape));
      });
    });
    this.step = view.getUint32(0, true);
  }

  dispose(): void {
    for (const t of [...Object.values(this.m), ...Object.values(this.v)]) t.dispose();
  }
}

/**
 * Scales gradients so their global L2 norm is at most maxNorm. Each stage
 * clips its own gradients (a stage never sees another's), in the local
 * trainer exactly as in the swarm. Nothing is read back: the scale
 * maxNorm / max(norm, maxNorm) is computed and applied on the device (GPU
 * backends stay asynchronous; a synchronous read on WebGPU goes through
 * canvases, slow and fragile in workers). Below the limit the scale is
 * exactly 1. Returns the clipped gradients (the inputs are disposed) and the
 * norm before clipping, as a scalar the caller disposes.
 */
export function clipByGlobalNorm(grads: Record<string, tf.Tensor>, maxNorm: number): { grads: Record<string, tf.Tensor>; norm: tf.Scalar } {
  const out: Record<string, tf.Tensor> = {};
  const norm = tf.tidy(() => {
    const n = tf.sqrt(addMany(Object.values(grads).map((g) => tf.sum(tf.square(g))))) as tf.Scalar;
    const scale = tf.div(maxNorm, tf.maximum(n, maxNorm));
    for (const [k, g] of Object.entries(grads)) out[k] = tf.keep(tf.mul(g, scale));
    return n;
  });
  for (const g of Object.values(grads)) g.dispose();
  return { grads: out, norm };
}

/**
 * tf.addN of any number of tensors, at most 7 at a time: tfjs-backend-webgpu
 * binds every input of AddN as a storage buffer, and WebGPU's default limit
 * is 8 per shader stage, so a stage's ~30 gradient norms in one AddN made an
 * invalid pipeline (silently wrong sums: found on SwiftShader and an H100).
 * Chunks continue the running sum left to right, the order one AddN adds in.
 */
export function addMany(tensors: tf.Tensor[]): tf.Tensor {
  return tf.tidy(() => {
    let acc = tf.addN(tensors.slice(0, 7));
    for (let i = 7; i < tensors.length; i += 6) acc = tf.addN([acc, ...tensors.slice(i, i + 6)]);
    return acc;
  });
}

/** Linear warm-up to peakLr, then cosine decay to minRatio · peakLr at totalSteps. */
export function cosineSchedule(opts: { peakLr: number; warmupSteps: number; totalSteps: number; minRatio?: number }): (step: number) => number {
  const minRatio = opts.minRatio ?? 0.1;
  return (step) => {
    if (step < opts.warmupSteps) return (opts.peakLr * (step + 1)) / opts.warmupSteps;
    const progress = Math.min(1, (step - opts.warmupSteps) / Math.max(1, opts.totalSteps - opts.warmupSteps));
    return opts.peakLr * (minRatio + (1 - minRatio) * 0.5 * (1 + Math.cos(Math.PI * progress)));
  };
}
