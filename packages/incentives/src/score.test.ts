import { describe, expect, it } from 'vitest';
import { splitEmission } from './emission';
import { scoreMiners, type MinerEvidence } from './score';
import { errorCode } from '@train-at-home/testkit/incentives-errors';

const miner = (minerId: string, over: Partial<MinerEvidence> = {}): MinerEvidence => ({
  minerId,
  account: `acct-${minerId}`,
  stage: 0,
  work: 100,
  claspQuality: 1,
  spotQuality: 1,
  flags: [],
  ...over,
});

describe('scoreMiners', () => {
  it('scales work by the weaker quality, zeroes flagged miners, sorts by score then id', () => {
    const scores = scoreMiners([
      miner('d', { work: 50 }),
      miner('a', { claspQuality: 0.5, spotQuality: 0.9 }),
      miner('c', { flags: [{ kind: 'spot-check', reason: 'output cosine 0.2' }] }),
      miner('b', { work: 50 }),
      miner('e', { claspQuality: 1.5, spotQuality: -0.2, stage: null }),
    ]);
    expect(scores.map((s) => [s.minerId, s.quality, s.score, s.flagged])).toEqual([
      ['a', 0.5, 50, false],
      ['b', 1, 50, false],
      ['d', 1, 50, false],
      ['c', 0, 0, true],
      ['e', 0, 0, false],
    ]);
    expect(scores.find((s) => s.minerId === 'e')!.stage).toBeNull();
  });

  it('feeds the emission split, miners sharing an account paid together', () => {
    const scores = scoreMiners([
      miner('m1', { account: 'pool' }),
      miner('m2', { account: 'pool', claspQuality: 0.5 }),
      miner('m3', { account: 'solo', work: 50 }),
    ]);
    expect(splitEmission(1000n, scores).payouts).toEqual([
      { account: 'pool', amount: 750n },
      { account: 'solo', amount: 250n },
    ]);
  });

  it('rejects duplicate miners, negative work and non-finite qualities', () => {
    const code = errorCode;
    expect(code(() => scoreMiners([miner('a'), miner('a')]))).toBe('DUPLICATE_MINER');
    expect(code(() => scoreMiners([miner('a', { work: -1 })]))).toBe('BAD_EVIDENCE');
    expect(code(() => scoreMiners([miner('a', { work: NaN })]))).toBe('BAD_EVIDENCE');
    expect(code(() => scoreMiners([miner('a', { spotQuality: NaN })]))).toBe('BAD_EVIDENCE');
    expect(code(() => scoreMiners([miner('a', { account: '' })]))).toBe('BAD_ACCOUNT');
  });
});
