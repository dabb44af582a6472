import { describe, expect, it } from 'vitest';
import { IncentivesError } from './errors';
import { compareOutputs } from './spot-check';
import { mulberry32 } from './synthetic';

const f32 = (...values: number[]) => Float32Array.from(values);

describe('compareOutputs', () => {
  it('identical outputs: cosine 1, norm ratio 1, no error', () => {
    const x = f32(1, -2, 3);
    expect(compareOutputs(x, x)).toEqual({ cosine: 1, normRatio: 1, relError: 0 });
  });

  it('a scaled output keeps the cosine but not the norm', () => {
    const c = compareOutputs(f32(2, -4, 6), f32(1, -2, 3));
    expect(c.cosine).toBeCloseTo(1, 12);
    expect(c.normRatio).toBeCloseTo(2, 12);
    expect(c.relError).toBeCloseTo(1, 12);
    expect(compareOutputs(f32(-1, 2, -3), f32(1, -2, 3)).cosine).toBeCloseTo(-1, 12);
  });

  it('zero vectors give numbers, never NaN', () => {
    expect(compareOutputs(f32(0, 0), f32(1, 2))).toEqual({ cosine: 0, normRatio: 0, relError: 1 });
    expect(compareOutputs(f32(1, 2), f32(0, 0))).toEqual({ cosine: 0, normRatio: Infinity, relError: Infinity });
    expect(compareOutputs(f32(0, 0), f32(0, 0))).toEqual({ cosine: 0, normRatio: 0, relError: 0 });
    expect(compareOutputs(f32(), f32())).toEqual({ cosine: 0, normRatio: 0, relError: 0 });
  });

  it('catches a stage that forwards its input: a high cosine, but no delta', () => {
    const random = mulberry32(5);
    const n = 4096;
    const input = Float32Array.from({ length: n }, () => random() - 0.5);
    // The residual stream: output = input + a small update.
    const update = Float32Array.from({ length: n }, () => 0.1 * (random() - 0.5));
    const reference = input.map((x, i) => x + update[i]!);
    const lazy = compareOutputs(input, reference, input);
    expect(lazy.cosine).toBeGreaterThan(0.99);
    expect(lazy.deltaCosine).toBe(0);
    const honest = compareOutputs(
      reference.map((x) => x * (1 + 1e-3 * (random() - 0.5))),
      reference,
      input,
    );
    expect(honest.deltaCosine).toBeGreaterThan(0.99);
  });

  it('a non-finite output is the worst output; a non-finite reference or a length mismatch throws', () => {
    expect(compareOutputs(f32(NaN, 1), f32(1, 1))).toEqual({ cosine: 0, normRatio: Infinity, relError: Infinity });
    expect(compareOutputs(f32(Infinity, 1), f32(1, 1), f32(0, 0)).deltaCosine).toBe(0);
    const code = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        return e instanceof IncentivesError ? e.code : 'other';
      }
      return undefined;
    };
    expect(code(() => compareOutputs(f32(1), f32(1, 2)))).toBe('LENGTH_MISMATCH');
    expect(code(() => compareOutputs(f32(1, 2), f32(1, 2), f32(1)))).toBe('LENGTH_MISMATCH');
    expect(code(() => compareOutputs(f32(1, 2), f32(NaN, 2)))).toBe('NON_FINITE');
    expect(code(() => compareOutputs(f32(1, 2), f32(1, 2), f32(NaN, 0)))).toBe('NON_FINITE');
  });
});
