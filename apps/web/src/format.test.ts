import { describe, expect, it } from 'vitest';
import { emptyTraffic } from '@train-at-home/protocol';
import { flops, perToken, totalPerToken, trafficByKind } from './format';

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

describe('traffic by kind', () => {
  it('lists the kinds that moved anything, in order, with bytes per trained token where tokens were trained', () => {
    const t = { ...emptyTraffic(), activation: { sent: 2048, received: 0 }, coordinator: { sent: 100, received: 412 } };
    expect(trafficByKind(t, 1024)).toEqual([
      { kind: 'activation', text: 'activations 2.0 KiB sent / 0 B received (2.0 B/token)' },
      { kind: 'coordinator', text: 'coordinator 100 B sent / 412 B received (0.50 B/token)' },
    ]);
    expect(trafficByKind(t).map((k) => k.text)).toEqual(['activations 2.0 KiB sent / 0 B received', 'coordinator 100 B sent / 412 B received']);
    expect(trafficByKind(emptyTraffic(), 10)).toEqual([]);
    expect(totalPerToken(t, 1024)).toBe('2.5 B/token');
    expect(totalPerToken(t, 0)).toBeUndefined();
    expect(perToken(2960)).toBe('2.9 KiB/token');
    expect(perToken(20.4)).toBe('20 B/token');
    expect(perToken(Number.NaN)).toBe('—');
  });
});
