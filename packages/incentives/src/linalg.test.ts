import { describe, expect, it } from 'vitest';
import { IncentivesError } from './errors';
import { blockConjugateGradient, cholesky, choleskyInverse, choleskySolve } from './linalg';
import { mulberry32 } from './synthetic';

/** A random symmetric positive definite n × n matrix: BᵀB + n·I. */
function spd(n: number, seed: number): Float64Array {
  const random = mulberry32(seed);
  const b = Float64Array.from({ length: n * n }, () => random() - 0.5);
  const a = new Float64Array(n * n);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      let sum = i === j ? 0.5 * n : 0;
      for (let k = 0; k < n; k++) sum += b[k * n + i]! * b[k * n + j]!;
      a[i * n + j] = sum;
    }
  }
  return a;
}

describe('linalg', () => {
  it('cholesky solves and inverts', () => {
    const n = 12;
    const a = spd(n, 1);
    const l = cholesky(a, n);
    const xTrue = Float64Array.from({ length: n }, (_, i) => i - 5);
    const b = new Float64Array(n);
    for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) b[i] += a[i * n + j]! * xTrue[j]!;
    choleskySolve(l, n, b).forEach((v, i) => expect(v).toBeCloseTo(xTrue[i]!, 10));
    const inv = choleskyInverse(l, n);
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        let sum = 0;
        for (let k = 0; k < n; k++) sum += a[i * n + k]! * inv[k * n + j]!;
        expect(sum).toBeCloseTo(i === j ? 1 : 0, 10);
      }
    }
  });

  it('cholesky refuses a matrix that is not positive definite', () => {
    const a = Float64Array.from([1, 2, 2, 1]);
    expect(() => cholesky(a, 2)).toThrow(IncentivesError);
  });

  it('block conjugate gradient solves several right-hand sides, a zero one included', () => {
    const n = 30;
    const k = 3;
    const a = spd(n, 2);
    const apply = (v: Float64Array, out: Float64Array, count: number) => {
      out.fill(0);
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < n; j++) {
          for (let c = 0; c < count; c++) out[i * count + c] += a[i * n + j]! * v[j * count + c]!;
        }
      }
    };
    const random = mulberry32(3);
    const rhs = Float64Array.from({ length: n * k }, (_, i) => (i % k === 1 ? 0 : random() - 0.5));
    const diagonal = Float64Array.from({ length: n }, (_, i) => a[i * n + i]!);
    const solved = blockConjugateGradient(apply, rhs, k, diagonal, 1e-12, 200);
    expect(solved.worstRelativeResidual).toBeLessThan(1e-10);
    const l = cholesky(a, n);
    for (let c = 0; c < k; c++) {
      const column = Float64Array.from({ length: n }, (_, i) => rhs[i * k + c]!);
      choleskySolve(l, n, column).forEach((v, i) => expect(solved.x[i * k + c]).toBeCloseTo(v, 9));
    }
  });
});
