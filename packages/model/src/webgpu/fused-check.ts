import * as tf from '@tensorflow/tfjs';

/** The outcome of checking a fused op against its composite on one backend. */
export interface FusedKernelCheck {
  /** The shapes checked (odd sizes, sizes either side of a workgroup). */
  shapes: number[][];
  /** Largest |fused − composite| / max |composite| over every output (forward and gradients) of every shape. */
  maxRelativeDiff: number;
  /** Which output of which shape that was. */
  worst: string;
  tolerance: number;
  ok: boolean;
  ms: number;
}

/**
 * Runs `fused` and `composite` (same signature) forward and backward — the
 * value, and tf.grads of it for a seeded random upstream gradient — on each
 * set of inputs, and compares every output relative to its largest magnitude
 * (the two sum in different orders, so they differ by float32 rounding; a
 * wrong formula, index or reduction differs by O(1)).
 */
export async function checkFusedOp(
  name: string,
  fused: (...xs: tf.Tensor[]) => tf.Tensor,
  composite: (...xs: tf.Tensor[]) => tf.Tensor,
  cases: Array<{ inputs: tf.Tensor[]; dy: tf.Tensor }>,
  tolerance: number,
): Promise<FusedKernelCheck> {
  const started = performance.now();
  let maxRelativeDiff = 0;
  let worst = '';
  for (const { inputs, dy } of cases) {
    const both = (f: (...xs: tf.Tensor[]) => tf.Tensor): tf.Tensor[] => [f(...inputs), ...tf.grads((...xs: tf.Tensor[]) => f(...xs))(inputs, dy)];
    const got = both(fused);
    const want = both(composite);
    for (let k = 0; k < want.length; k++) {
      const [g, w] = [(await got[k]!.data()) as Float32Array, (await want[k]!.data()) as Float32Array];
      let scale = 0;
      let diff = g.length === w.length ? 0 : Infinity;
      for (let i = 0; i < w.length; i++) {
        scale = Math.max(scale, Math.abs(w[i]!));
        const d = Math.abs(g[i]! - w[i]!);
        diff = Math.max(diff, Number.isNaN(d) ? Infinity : d);
      }
      const rel = diff / Math.max(scale, 1e-30);
      if (rel > maxRelativeDiff || worst === '') [maxRelativeDiff, worst] = [rel, `${k === 0 ? name : `${name}, gradient of input ${k - 1}`} of [${inputs[0]!.shape.join(', ')}]`];
    }
    tf.dispose([...got, ...want]);
  }
  const shapes = cases.map((c) => c.inputs[0]!.shape);
  for (const c of cases) tf.dispose([...c.inputs, c.dy]);
  return { shapes, maxRelativeDiff, worst, tolerance, ok: maxRelativeDiff <= tolerance, ms: performance.now() - started };
}

/** Several checks as one: the worst difference, every shape, ok only if all are, the time of all. */
export function foldChecks(checks: FusedKernelCheck[]): FusedKernelCheck {
  const worst = checks.reduce((a, b) => (b.maxRelativeDiff > a.maxRelativeDiff ? b : a));
  return { ...worst, shapes: checks.flatMap((c) => c.shapes), ok: checks.every((c) => c.ok), ms: checks.reduce((a, c) => a + c.ms, 0) };
}
