import { describe, expect, it } from 'vitest';
import { splitEmission, SCORE_SCALE } from './emission';
import { mulberry32 } from './synthetic';
import { errorCode } from '@train-at-home/testkit/incentives-errors';

function shuffled<T>(items: T[], random: () => number): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

const EMISSIONS = [0n, 1n, 7n, 1000n, 123_456_789n, 10n ** 18n, 10n ** 30n, 2n ** 200n + 12345n];

describe('splitEmission', () => {
  it('sums exactly to the emission, stays within one unit of each exact share, for any input order', () => {
    for (let seed = 1; seed <= 300; seed++) {
      const random = mulberry32(seed);
      const emission = EMISSIONS[seed % EMISSIONS.length]!;
      const count = 1 + Math.floor(random() * 40);
      const scores = Array.from({ length: count }, (_, i) => {
        const kind = random();
        // Zeros, tiny scores, microbatch counts and fractions, and a few accounts shared by several miners.
        const score = kind < 0.15 ? 0 : kind < 0.3 ? random() * 1e-6 : kind < 0.8 ? Math.floor(random() * 500) : random() * 3;
        return { account: `acct-${Math.floor(i / 2) % 17}`, score };
      });
      const { payouts, allocated } = splitEmission(emission, scores);

      // The exact shares, independently: weights per account, then E·w/W.
      const weights = new Map<string, bigint>();
      for (const { account, score } of scores) {
        weights.set(account, (weights.get(account) ?? 0n) + BigInt(Math.round(score * SCORE_SCALE)));
      }
      const total = [...weights.values()].reduce((a, b) => a + b, 0n);
      const sum = payouts.reduce((a, p) => a + p.amount, 0n);
      expect(sum).toBe(allocated);
      expect(allocated).toBe(total > 0n ? emission : 0n);
      for (const { account, amount } of payouts) {
        const floor = (emission * weights.get(account)!) / total;
        expect(amount === floor || amount === floor + 1n).toBe(true);
        expect(amount > 0n).toBe(true);
      }
      expect(payouts.map((p) => p.account)).toEqual([...payouts.map((p) => p.account)].sort());

      const again = splitEmission(emission, shuffled(scores, random));
      expect(again).toEqual({ payouts, allocated });
    }
  });

  it('gives the leftover units to the largest remainders', () => {
    // 10 · 1/3 = 3.33, 10 · 2/3 = 6.67: the one leftover unit goes to b.
    expect(splitEmission(10n, [{ account: 'a', score: 1 }, { account: 'b', score: 2 }]).payouts).toEqual([
      { account: 'a', amount: 3n },
      { account: 'b', amount: 7n },
    ]);
  });

  it('breaks ties by account, whatever the input order', () => {
    const scores = [
      { account: 'carol', score: 1 },
      { account: 'alice', score: 1 },
      { account: 'bob', score: 1 },
    ];
    const expected = [
      { account: 'alice', amount: 1n },
      { account: 'bob', amount: 1n },
    ];
    expect(splitEmission(2n, scores).payouts).toEqual(expected);
    expect(splitEmission(2n, [...scores].reverse()).payouts).toEqual(expected);
    // Code-unit order, not locale order: 'B' < 'a'.
    expect(splitEmission(1n, [{ account: 'a', score: 1 }, { account: 'B', score: 1 }]).payouts).toEqual([
      { account: 'B', amount: 1n },
    ]);
  });

  it('aggregates miners that pay to one account before splitting', () => {
    const { payouts } = splitEmission(1000n, [
      { account: 'x', score: 1 },
      { account: 'y', score: 2 },
      { account: 'x', score: 1 },
    ]);
    expect(payouts).toEqual([
      { account: 'x', amount: 500n },
      { account: 'y', amount: 500n },
    ]);
  });

  it('pays nothing to zero scores, and nothing at all when every score is zero', () => {
    expect(splitEmission(100n, [{ account: 'a', score: 0 }, { account: 'b', score: 5 }]).payouts).toEqual([
      { account: 'b', amount: 100n },
    ]);
    expect(splitEmission(100n, [{ account: 'a', score: 0 }])).toEqual({ payouts: [], allocated: 0n });
    expect(splitEmission(100n, [])).toEqual({ payouts: [], allocated: 0n });
    // A positive score below the 2⁻³³ resolution counts as zero.
    expect(splitEmission(100n, [{ account: 'a', score: 1e-12 }])).toEqual({ payouts: [], allocated: 0n });
  });

  it('rejects negative or non-finite scores, a negative emission and a missing account', () => {
    const code = errorCode;
    expect(code(() => splitEmission(10n, [{ account: 'a', score: -1 }]))).toBe('BAD_SCORE');
    expect(code(() => splitEmission(10n, [{ account: 'a', score: NaN }]))).toBe('BAD_SCORE');
    expect(code(() => splitEmission(10n, [{ account: 'a', score: Infinity }]))).toBe('BAD_SCORE');
    expect(code(() => splitEmission(10n, [{ account: 'a', score: 1e300 }]))).toBe('BAD_SCORE');
    expect(code(() => splitEmission(-1n, [{ account: 'a', score: 1 }]))).toBe('BAD_EMISSION');
    expect(code(() => splitEmission(10n, [{ account: '', score: 1 }]))).toBe('BAD_ACCOUNT');
  });
});
