import { compareOutputs } from '@train-at-home/incentives';
import { describe, expect, it } from 'vitest';
import { gross, judge } from '../../src/validator/thresholds';

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

  it("passes a last stage's loss within float noise of the replay's; fails, by name and as gross, one reported at 0.7 × (the under-reporting cheat), and a loss that is not a number", () => {
    // Same backend, exact replay: measured within 3e-6 nats (bench/spot-spread.ts).
    expect(judge('loss', { reported: 3.123456, replayed: 3.123459 })).toEqual({ passed: true });
    const under = { reported: 0.7 * 3.2, replayed: 3.2 };
    expect(judge('loss', under)).toEqual({ passed: false, reason: 'LOSS_MISREPORTED: reported 2.2400, the replay computes 3.2000' });
    expect(gross('loss', under)).toBe(true);
    expect(judge('loss', { reported: Number.NaN, replayed: 3.2 })).toEqual({ passed: false, reason: 'LOSS_MISREPORTED: no finite loss to compare' });
    // Just past the bound but within the gross one: a failure, not yet a flag on its own.
    const near = { reported: 3.2 + 0.05, replayed: 3.2 };
    expect(judge('loss', near).passed).toBe(false);
    expect(gross('loss', near)).toBe(false);
  });
});
