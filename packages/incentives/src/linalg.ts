/**
 * The few numerical kernels CLASP needs, on plain Float64Arrays so the
 * package runs unchanged in a browser tab and in Node (no tfjs, no BLAS).
 *
 * Dense matrices are row-major n×n. Every matrix CLASP factors is a ridge
 * normal matrix XᵀX + Λ with Λ > 0, hence symmetric positive definite: a
 * failed pivot means a bug or non-finite input, and throws rather than
 * returning a silently wrong answer.
 */

import { IncentivesError } from './errors';

/**
 * Cholesky factor L (lower triangle, row-major, upper triangle zeroed) with
 * A = L·Lᵀ. Cost n³/3 multiply-adds: 2.4 M for the 192 miners of a large
 * swarm, a few milliseconds.
 */
export function cholesky(a: Float64Array, n: number): Float64Array {
  const l = new Float64Array(n * n);
  for (let i = 0; i < n; i++) {
    const rowI = i * n;
    for (let j = 0; j <= i; j++) {
      const rowJ = j * n;
      let sum = a[rowI + j]!;
      for (let k = 0; k < j; k++) sum -= l[rowI + k]! * l[rowJ + k]!;
      if (i === j) {
        // A relative floor: round-off on a huge diagonal must not pass as positive.
        if (!(sum > 1e-12 * Math.abs(a[rowI + i]!))) {
          throw new IncentivesError('NUMERICAL', `matrix not positive definite at pivot ${i} (${sum})`);
        }
        l[rowI + i] = Math.sqrt(sum);
      } else {
        l[rowI + j] = sum / l[rowJ + j]!;
      }
    }
  }
  return l;
}

/** Solves L·Lᵀ·x = b for x, given the Cholesky factor L. */
export function choleskySolve(l: Float64Array, n: number, b: Float64Array): Float64Array {
  const y = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    let sum = b[i]!;
    for (let k = 0; k < i; k++) sum -= l[i * n + k]! * y[k]!;
    y[i] = sum / l[i * n + i]!;
  }
  const x = new Float64Array(n);
  for (let i = n - 1; i >= 0; i--) {
    let sum = y[i]!;
    for (let k = i + 1; k < n; k++) sum -= l[k * n + i]! * x[k]!;
    x[i] = sum / l[i * n + i]!;
  }
  return x;
}

/**
 * The full inverse A⁻¹ = L⁻ᵀ·L⁻¹ from the Cholesky factor. CLASP needs more
 * than the diagonal: a miner's effect is a contrast against its stage's
 * weighted mean, whose variance involves the off-diagonal terms too.
 */
export function choleskyInverse(l: Float64Array, n: number): Float64Array {
  // M = L⁻¹, lower triangular, column by column.
  const m = new Float64Array(n * n);
  for (let j = 0; j < n; j++) {
    m[j * n + j] = 1 / l[j * n + j]!;
    for (let i = j + 1; i < n; i++) {
      let sum = 0;
      for (let k = j; k < i; k++) sum -= l[i * n + k]! * m[k * n + j]!;
      m[i * n + j] = sum / l[i * n + i]!;
    }
  }
  // A⁻¹[i][j] = Σ_k M[k][i]·M[k][j], k ≥ max(i, j); symmetric, so fill both halves.
  const inv = new Float64Array(n * n);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j <= i; j++) {
      let sum = 0;
      for (let k = i; k < n; k++) sum += m[k * n + i]! * m[k * n + j]!;
      inv[i * n + j] = sum;
      inv[j * n + i] = sum;
    }
  }
  return inv;
}

/**
 * y = A·X for a symmetric operator applied to `count` vectors at once, laid
 * out row-interleaved: X[row·count + column]. One pass over the operator's
 * structure serves every column, and the inner loops run over contiguous
 * memory: several times faster than `count` separate applications.
 */
export type BlockOperator = (x: Float64Array, y: Float64Array, count: number) => void;

export interface BlockCgResult {
  /** Solutions, interleaved like the right-hand sides. */
  x: Float64Array;
  /** Iterations until the slowest column converged. */
  iterations: number;
  /** The worst ‖b − A·x‖ / ‖b‖ over the columns at exit. */
  worstRelativeResidual: number;
}

/**
 * Jacobi-preconditioned conjugate gradient for a symmetric positive definite
 * operator, run on `count` right-hand sides in lock-step: each column is its
 * own CG (its own step sizes), only the operator passes are shared. A column
 * that has converged stops moving (its search direction is zeroed).
 *
 * CLASP's pair block is diagonally dominant (each pair's count plus its
 * penalty against a few co-occurrences), so the Jacobi preconditioner alone
 * brings it to tolerance in a few to a few tens of iterations.
 */
export function blockConjugateGradient(
  apply: BlockOperator,
  b: Float64Array,
  count: number,
  diagonal: Float64Array,
  relativeTolerance = 1e-10,
  maxIterations = 1000,
): BlockCgResult {
  const n = diagonal.length;
  const k = count;
  const x = new Float64Array(n * k);
  const r = Float64Array.from(b);
  const p = new Float64Array(n * k);
  const ap = new Float64Array(n * k);
  const target = new Float64Array(k);
  const rz = new Float64Array(k);
  const scratch = new Float64Array(k);
  const rr = new Float64Array(k);
  const alpha = new Float64Array(k);
  const beta = new Float64Array(k);
  const active = new Uint8Array(k);
  const keep = new Float64Array(k);

  columnDots(b, b, n, k, target);
  for (let j = 0; j < k; j++) {
    target[j] = relativeTolerance * Math.sqrt(target[j]!);
    active[j] = target[j]! > 0 ? 1 : 0; // a zero right-hand side is solved by x = 0
  }
  for (let i = 0; i < n; i++) {
    const inv = 1 / diagonal[i]!;
    for (let j = 0; j < k; j++) {
      const zij = active[j]! ? r[i * k + j]! * inv : 0;
      p[i * k + j] = zij;
      rz[j] += r[i * k + j]! * zij;
    }
  }
  let iterations = 0;
  // Three passes over the vectors per iteration (plus the operator): the
  // loops are fused because at these sizes memory traffic is the cost.
  while (iterations < maxIterations && active.some((a) => a === 1)) {
    apply(p, ap, k);
    columnDots(p, ap, n, k, scratch);
    for (let j = 0; j < k; j++) {
      if (active[j] && !(scratch[j]! > 0)) {
        throw new IncentivesError('NUMERICAL', `operator not positive definite (pᵀAp = ${scratch[j]})`);
      }
      alpha[j] = active[j] ? rz[j]! / scratch[j]! : 0;
    }
    rr.fill(0);
    scratch.fill(0);
    for (let i = 0; i < n; i++) {
      const inv = 1 / diagonal[i]!;
      const o = i * k;
      for (let j = 0; j < k; j++) {
        const step = alpha[j]!;
        x[o + j] += step * p[o + j]!;
        const res = r[o + j]! - step * ap[o + j]!;
        r[o + j] = res;
        rr[j] += res * res;
        scratch[j] += res * res * inv; // rᵀ·z with z = r / diagonal
      }
    }
    for (let j = 0; j < k; j++) {
      if (active[j] && Math.sqrt(rr[j]!) <= target[j]!) active[j] = 0;
      beta[j] = active[j] ? scratch[j]! / rz[j]! : 0;
      rz[j] = scratch[j]!;
      keep[j] = active[j]!; // 0 stops a converged column: p = 0
    }
    for (let i = 0; i < n; i++) {
      const inv = 1 / diagonal[i]!;
      const o = i * k;
      for (let j = 0; j < k; j++) p[o + j] = keep[j]! * (r[o + j]! * inv + beta[j]! * p[o + j]!);
    }
    iterations++;
  }
  columnDots(r, r, n, k, rr);
  let worstRelativeResidual = 0;
  for (let j = 0; j < k; j++) {
    if (target[j]! > 0) {
      worstRelativeResidual = Math.max(worstRelativeResidual, (Math.sqrt(rr[j]!) * relativeTolerance) / target[j]!);
    }
  }
  return { x, iterations, worstRelativeResidual };
}

/** out[j] = Σ_i a[i·k + j]·b[i·k + j]: the k column dot products at once. */
function columnDots(a: Float64Array, b: Float64Array, n: number, k: number, out: Float64Array): void {
  out.fill(0);
  for (let i = 0; i < n * k; i += k) {
    for (let j = 0; j < k; j++) out[j] += a[i + j]! * b[i + j]!;
  }
}
