import { synthesizePathways, verifyPayout, type SynthesizeOptions } from '@train-at-home/incentives';
import { describe, expect, it } from 'vitest';
import { scoreEpoch, type ScoreJob } from '../../src/validator/scoring';

/**
 * RAISES_LOSS, the one flag CLASP raises (validator/scoring.ts), on synthetic pathway losses whose truth is known
 * (packages/incentives/synthetic.ts): 3 stages of 4 miners, partners rotating at each merge as the swarm's do, no
 * spot check failed and no flag standing, so CLASP is the only detector that can see anything.
 */
const EMISSION = 1_000_000_000n;
const RUN: SynthesizeOptions = { stages: 3, minersPerStage: 4, rounds: 20, perRound: 60, noise: 0.1, lossStart: 4, lossDecayPerRound: 0.02, rotate: true, seed: 11 };

function job(effects: Record<string, number>): { job: ScoreJob; ids: string[] } {
  const { observations, miners } = synthesizePathways({ ...RUN, effects });
  const ids = miners.flat();
  return {
    ids,
    job: {
      epoch: 3,
      emission: EMISSION.toString(),
      miners: ids.map((id, i) => ({ minerId: id, account: `5${String(i).padStart(47, 'A')}`, stage: Number(id.slice(1, id.indexOf('m'))), work: 100, flags: [], spotChecks: { passed: 3, failed: 0 } })),
      observations,
    },
  };
}

describe("CLASP's flag", () => {
  it('flags RAISES_LOSS on the one miner whose pathways carry 0.5 nats more loss than its stage peers, scores it zero and pays everyone else the whole emission', () => {
    const { job: j, ids } = job({ s1m2: 0.5 });
    const result = scoreEpoch(j);
    expect(result.newFlags.map((f) => [f.minerId, f.kind])).toEqual([['s1m2', 'RAISES_LOSS']]);
    expect(result.newFlags[0]!.reason).toMatch(/^pathways through this miner have 0\.\d+ nats more loss than through its stage peers/);
    expect(result.scores.find((s) => s.minerId === 's1m2')).toMatchObject({ flagged: true, score: 0 });
    const paid = new Set(result.payouts.flatMap((p) => p.miners));
    expect([...paid].sort()).toEqual(ids.filter((id) => id !== 's1m2').sort());
    expect(result.payouts.reduce((n, p) => n + BigInt(p.amount), 0n)).toBe(EMISSION);
    for (const p of result.payouts) expect(verifyPayout(result.merkleRoot!, p.account, p.amount, p.proof)).toBe(true);
  });

  it('flags nobody when no miner changes the loss: the same pathways, noise and training progress, every miner paid', () => {
    const { job: j, ids } = job({});
    const result = scoreEpoch(j);
    expect(result.newFlags).toEqual([]);
    expect(result.scores.filter((s) => s.flagged)).toEqual([]);
    expect(new Set(result.payouts.flatMap((p) => p.miners))).toEqual(new Set(ids));
    expect(result.payouts.reduce((n, p) => n + BigInt(p.amount), 0n)).toBe(EMISSION);
  });

  it('flags nobody for an effect inside what honest partners of unflagged cheaters were measured at (0.05 nats, below minEffect)', () => {
    expect(scoreEpoch(job({ s2m0: 0.05 }).job).newFlags).toEqual([]);
  });
});
