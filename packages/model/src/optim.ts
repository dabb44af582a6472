import * as tf from '@tensorflow/tfjs';
import type { ParamSpec } from './params';

export interface AdamWOptions {
  beta1?: number;
  beta2?: number;
  epsilon?: number;
  /** Decoupled weight decay, applied to matrices only. */
  weightDecay?: number;
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
    const n = tf.sqrt(tf.addN(Object.values(grads).map((g) => tf.sum(tf.square(g))))) as tf.Scalar;
    const scale = tf.div(maxNorm, tf.maximum(n, maxNorm));
    for (const [k, g] of Object.entries(grads)) out[k] = tf.keep(tf.mul(g, scale));
    return n;
  });
  for (const g of Object.values(grads)) g.dispose();
  return { grads: out, norm };
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
