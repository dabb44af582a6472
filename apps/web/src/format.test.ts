import { describe, expect, it } from 'vitest';
import { flops } from './format';

describe('flops', () => {
  it('says a rate in TFLOP/s or GFLOP/s, whichever reads best, and nothing for a rate that is not one', () => {
    expect(flops(10.593)).toBe('10.6 TFLOP/s');
    expect(flops(1)).toBe('1.0 TFLOP/s');
    expect(flops(0.0842)).toBe('84.2 GFLOP/s');
    expect(flops(0.00031)).toBe('0.31 GFLOP/s');
    expect(flops(0)).toBe('0.0 GFLOP/s');
    expect(flops(NaN)).toBe('—');
    expect(flops(-1)).toBe('—');
  });
});
