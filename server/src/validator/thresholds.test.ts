import { compareOutputs } from '@train-at-home/incentives';
import { describe, expect, it } from 'vitest';
import { judge } from './thresholds';

describe('a spot check\'s verdict', () => {
  it('passes an output equal to the replay value for value, all-zero ones included; fails zeros where the replay has values, and a scaled output', () => {
    const input = Float32Array.from({ length: 64 }, (_, i) => Math.sin(i));
    const reference = Float32Array.from({ length: 64 }, (_, i) => Math.sin(i) + 0.1 * Math.cos(3 * i));
    expect(judge('forward', compareOutputs(reference.slice(), reference, input))).toEqual({ passed: true });
    // Both all zero: compareOutputs says cosine 0 (no direction), relative error 0 (no difference).
    const zeros = new Float32Array(64);
    const both = compareOutputs(zeros, zeros.slice());
    expect(both).toMatchObject({ cosine: 0, relError: 0 });
    expect(judge('forward', both)).toEqual({ passed: true });
    expect(judge('backward', both)).toEqual({ passed: true });
    // Zeros against a replay with values, and a scaled output: refused by name.
    expect(judge('forward', compareOutputs(zeros, reference, input))).toMatchObject({ passed: false, reason: expect.stringMatching(/^OUTPUT_MISMATCH: cosine 0\.000/) });
    expect(judge('backward', compareOutputs(reference.map((x) => 1.5 * x), reference))).toMatchObject({ passed: false, reason: expect.stringMatching(/^GRADIENT_MISMATCH: norm 1\.500/) });
  });
});
