import * as tf from '@tensorflow/tfjs';
import { setFusedAdamW, type AdamWConstants, type FusedAdamW } from '../optim';
import { mulberry32 } from '../rng';
import { requireWebGPUBackend } from './codec-gpu';
import { multiPrograms } from './multi-program';
import { SUM_INPUTS, SUM_PARTIALS, SumSquaresProgram, adamwProgram, clipProgram } from './optim-programs';

function flat(t: tf.Tensor): tf.Tensor {
  return t.dtype === 'float32' ? tf.reshape(t, [t.size]) : tf.cast(tf.reshape(t, [t.size]), 'float32');
}

/** The optimizer step in WGSL (./optim-programs.ts): 1 launch per parameter tensor, one per SUM_INPUTS gradients for the norm and one for the clip factor, instead of ~18 per tensor. */
export const fusedAdamWGPU: FusedAdamW = {
  backend: 'webgpu',
  sumSquares(gs) {
    const backend = requireWebGPUBackend();
    const total = gs.length * SUM_PARTIALS;
    // One output; each gradient's program writes its own SUM_PARTIALS floats of it.
    const out = backend.makeTensorInfo([total], 'float32');
    for (let i = 0; i < gs.length; i += SUM_INPUTS) {
      const fs = gs.slice(i, i + SUM_INPUTS).map(flat);
      backend.runWebGPUProgram(new SumSquaresProgram(total, fs.length), fs, 'float32', [{ type: 'int32', data: [i * SUM_PARTIALS] }], out);
      tf.dispose(fs);
    }
    return tf.engine().makeTensorFromTensorInfo(out) as tf.Tensor1D;
  },
  clip(partials, maxNorm) {
    const [norm, scale] = multiPrograms.run(clipProgram(partials.size, maxNorm), [partials]);
    partials.dispose();
    return { norm: norm as tf.Scalar, scale: scale! };
  },
  step(p, m, v, g, scale, k) {
    const [fp, fm, fv, fg, fs] = [flat(p), flat(m), flat(v), flat(g), flat(scale)];
    const [np, nm, nv] = multiPrograms.run(adamwProgram(p.shape, k), [fp!, fm!, fv!, fg!, fs!]);
    tf.dispose([fp!, fm!, fv!, fg!, fs!]);
    return { p: np!, m: nm!, v: nv! };
  },
};

/**
 * optim.ts's composite step (clipByGlobalNorm, then AdamW.apply) written out
 * in JS, one float32 rounding per tfjs operation, as the WASM and CPU
 * backends compute it: the reference the fused kernels are held to. The
 * scale is passed in (the norm's summation order is the one thing the
 * backends may differ in).
 */
export function adamwReference(p: Float32Array, m: Float32Array, v: Float32Array, g: Float32Array, scale: number, k: AdamWConstants): { p: Float32Array; m: Float32Array; v: Float32Array } {
  const f = Math.fround;
  const out = { p: new Float32Array(p.length), m: new Float32Array(p.length), v: new Float32Array(p.length) };
  for (let i = 0; i < p.length; i++) {
    const gc = f(g[i]! * scale);
    const mi = f(f(m[i]! * k.beta1) + f(gc * k.oneMinusBeta1));
    const vi = f(f(v[i]! * k.beta2) + f(f(gc * gc) * k.oneMinusBeta2));
    const update = f(f(mi / k.c1) / f(f(Math.sqrt(f(vi / k.c2))) + k.epsilon));
    out.m[i] = mi;
    out.v[i] = vi;
    out.p[i] = f(f(p[i]! * k.decayFactor) - f(update * k.lr));
  }
  return out;
}

export interface OptimizerKernelCheck {
  elements: number;
  /** Largest |GPU − reference| over weights and moments, relative to the magnitudes of the two terms each output sums. */
  maxRelativeDiff: number;
  /** The output where maxRelativeDiff was found. */
  worst: 'p' | 'm' | 'v';
  /** Relative difference of Σ g² (partial sums on the GPU against float64), and of the norm and clip factor from them. */
  sumSquaresRelativeDiff: number;
  /** What the kernels promise: a few float32 ulps (1.2e-7 each) of the terms, for FMA contraction and the GPU's division and sqrt (WGSL allows 2.5 ulps each). */
  tolerance: number;
  ok: boolean;
  /** Wall time of one fused step after a warm-up. */
  ms: number;
}

/**
 * Runs the fused kernels on seeded data (weights, moments and gradients of
 * mixed magnitudes; a clip scale below 1; a decaying tensor) and compares
 * them with adamwReference. Throws WebGPUBackendRequiredError off WebGPU.
 */
export async function optimizerKernelCheck(n = 4099): Promise<OptimizerKernelCheck> {
  requireWebGPUBackend();
  const random = mulberry32(20261124);
  const fill = (f: () => number) => Float32Array.from({ length: n }, f);
  const p = fill(() => (random() * 2 - 1) * 0.05);
  const m = fill(() => (random() * 2 - 1) * 1e-3);
  const v = fill(() => random() * 1e-6);
  const g = fill(() => (random() * 2 - 1) * 10 ** (-1 - 4 * random()));
  const k: AdamWConstants = { beta1: Math.fround(0.9), oneMinusBeta1: Math.fround(0.1), beta2: Math.fround(0.95), oneMinusBeta2: Math.fround(1 - 0.95), c1: Math.fround(1 - 0.9 ** 7), c2: Math.fround(1 - 0.95 ** 7), epsilon: Math.fround(1e-8), lr: Math.fround(3e-4), decayFactor: Math.fround(1 - 3e-4 * 0.1) };
  const scale = Math.fround(0.37);
  const want = adamwReference(p, m, v, g, scale, k);
  let sum64 = 0;
  for (const x of g) sum64 += x * x;

  const [tp, tm, tv, tg] = [p, m, v, g].map((a) => tf.tensor1d(a));
  const ts = tf.tensor1d([scale]);
  try {
    const run = async () => {
      const t0 = performance.now();
      const out = fusedAdamWGPU.step(tp!, tm!, tv!, tg!, ts, k);
      const got = { p: (await out.p.data()) as Float32Array, m: (await out.m.data()) as Float32Array, v: (await out.v.data()) as Float32Array };
      tf.dispose([out.p, out.m, out.v]);
      return { got, ms: performance.now() - t0 };
    };
    await run();
    const { got, ms } = await run();
    // Each output is a sum of two terms (β1·m + (1−β1)·ĝ; β2·v + (1−β2)·ĝ²; p·(1−lr·wd) − lr·update), and a
    // difference is measured against the terms' magnitudes: where they nearly cancel, one ulp of a term is
    // a large fraction of the result, whichever side rounds.
    const f = Math.fround;
    let maxRelativeDiff = 0;
    let worst: 'p' | 'm' | 'v' = 'p';
    for (let i = 0; i < n; i++) {
      const gc = f(g[i]! * scale);
      const terms = {
        m: Math.abs(m[i]! * k.beta1) + Math.abs(gc * k.oneMinusBeta1),
        v: Math.abs(v[i]! * k.beta2) + gc * gc * k.oneMinusBeta2,
        p: Math.abs(p[i]! * k.decayFactor) + Math.abs(want.p[i]! - p[i]! * k.decayFactor),
      };
      for (const key of ['p', 'm', 'v'] as const) {
        const d = Math.abs(got[key][i]! - want[key][i]!) / Math.max(terms[key], 1e-30);
        const e = Number.isNaN(d) ? Infinity : d;
        if (e > maxRelativeDiff) [maxRelativeDiff, worst] = [e, key];
      }
    }
    // Σ g² of g and of g reversed, alternately, SUM_INPUTS + 2 of them through one shared output (two launches, the
    // second at an offset): that many times the float64 sum.
    const reversed = tf.reverse(tg!);
    const copies = SUM_INPUTS + 2;
    const partials = fusedAdamWGPU.sumSquares(Array.from({ length: copies }, (_, i) => (i % 2 === 0 ? tg! : reversed)));
    const sum = ((await partials.data()) as Float32Array).reduce((a, b) => a + b, 0) / copies;
    // The clip launch on those partials: the norm √(copies·Σg²), and the factor for a limit half of it.
    const norm64 = Math.sqrt(copies * sum64);
    const clipped = fusedAdamWGPU.clip(partials, norm64 / 2);
    const [gotNorm, gotScale] = [(await clipped.norm.data())[0]!, (await clipped.scale.data())[0]!];
    tf.dispose([clipped.norm, clipped.scale, reversed]);
    const sumSquaresRelativeDiff = Math.max(Math.abs(sum - sum64) / sum64, Math.abs(gotNorm - norm64) / norm64, Math.abs(gotScale - 0.5) / 0.5);
    const tolerance = 1e-6;
    return { elements: n, maxRelativeDiff, worst, sumSquaresRelativeDiff, tolerance, ok: maxRelativeDiff <= tolerance && sumSquaresRelativeDiff <= tolerance, ms };
  } finally {
    tf.dispose([tp!, tm!, tv!, tg!, ts]);
  }
}

/** Runs optimizerKernelCheck and, when it holds, makes AdamW.applyClipped use the fused kernels on WebGPU. */
export async function useFusedOptimizer(): Promise<OptimizerKernelCheck> {
  const check = await optimizerKernelCheck();
  setFusedAdamW(check.ok ? fusedAdamWGPU : undefined);
  return check;
}
