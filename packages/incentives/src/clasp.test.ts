import { describe, expect, it } from 'vitest';
import { clasp, type ClaspResult } from './clasp';
import { claspVerdicts } from './clasp-verdict';
import { IncentivesError } from './errors';
import { scoreMiners } from './score';
import { synthesizePathways, type SynthesizeOptions } from './synthetic';

const SMALL: SynthesizeOptions = {
  stages: 3,
  minersPerStage: 4,
  rounds: 10,
  perRound: 200,
  noise: 0.1,
  lossStart: 6,
  lossDecayPerRound: 0.1,
  rotate: true,
  seed: 1,
};

function effectOf(result: ClaspResult, minerId: string) {
  const e = result.effects.find((x) => x.minerId === minerId);
  if (!e) throw new Error(`no effect for ${minerId}`);
  return e;
}

describe('clasp: a planted bad miner', () => {
  it('with rotating partners, is ranked last and flagged, and no honest miner is', () => {
    const { observations } = synthesizePathways({ ...SMALL, effects: { s1m2: 0.3 } });
    const result = clasp(observations);
    const verdicts = claspVerdicts(result);

    const worst = [...result.effects].sort((a, b) => b.share - a.share)[0]!;
    expect(worst.minerId).toBe('s1m2');
    // Relative to its stage's mean, which includes itself: 0.3 · (1 − 1/4).
    expect(Math.abs(worst.effect - 0.225)).toBeLessThan(3 * worst.stdError);
    expect(verdicts.filter((v) => v.harmful).map((v) => v.minerId)).toEqual(['s1m2']);
    expect(verdicts.find((v) => v.minerId === 's1m2')!.quality).toBe(0);

    // Through the score: the bad miner earns nothing and comes last.
    const scores = scoreMiners(
      result.effects.map((e, i) => ({
        minerId: e.minerId,
        account: `acct-${e.minerId}`,
        stage: e.stage,
        work: e.observations,
        claspQuality: verdicts[i]!.quality,
        spotQuality: 1,
        flags: [],
      })),
    );
    expect(scores.at(-1)!.minerId).toBe('s1m2');
    expect(scores.at(-1)!.score).toBe(0);
  });

  it('with fixed partners, it is inseparable from them: nobody is flagged, and the verdict says why', () => {
    const { observations } = synthesizePathways({ ...SMALL, rotate: false, effects: { s1m2: 0.3 } });
    const result = clasp(observations);
    const verdicts = claspVerdicts(result);
    // The chain s0m2 → s1m2 → s2m2 always ran together: the ridge splits its excess.
    for (const id of ['s0m2', 's1m2', 's2m2']) expect(effectOf(result, id).partners).toBe(1);
    expect(verdicts.filter((v) => v.harmful)).toEqual([]);
    for (const id of ['s0m2', 's2m2']) {
      const v = verdicts.find((x) => x.minerId === id)!;
      expect(v.quality).toBe(1);
      expect(v.reason).toMatch(/inseparable/);
    }
  });

  it('with fixed partners and a huge effect, still flags nobody (the ridge alone would blame the partners)', () => {
    const { observations } = synthesizePathways({ ...SMALL, rotate: false, effects: { s0m2: 1.5 } });
    const result = clasp(observations);
    // The partners' split of the blame looks "significant" against the ridge's own spread...
    expect(effectOf(result, 's2m2').effect / effectOf(result, 's2m2').stdError).toBeGreaterThan(4);
    // ...but they are never flagged, and the data alone cannot place the blame either.
    expect(claspVerdicts(result).filter((v) => v.harmful)).toEqual([]);
    expect(effectOf(result, 's2m2').unpenalizedStdError).toBeGreaterThan(100 * effectOf(result, 's2m2').stdError);
  });

  it('at stage 0, with partners rotating in lock-step over 4 replicas, is confounded with stage 2 and not flagged', () => {
    // Round shift k at both boundaries: s0m_i meets s2m_{i+2k}, only i and i+2 (4 is even).
    const { observations } = synthesizePathways({ ...SMALL, effects: { s0m1: 0.3 } });
    const result = clasp(observations);
    expect(effectOf(result, 's0m1').partners).toBe(4);
    const verdicts = claspVerdicts(result);
    expect(verdicts.filter((v) => v.harmful)).toEqual([]);
    expect(verdicts.find((v) => v.minerId === 's0m1')!.reason).toMatch(/inseparable/);
  });

  it('at stage 0, with 5 replicas per stage (lock-step shifts reach every stage-2 miner), is flagged alone', () => {
    const { observations } = synthesizePathways({ ...SMALL, minersPerStage: 5, effects: { s0m1: 0.3 } });
    const verdicts = claspVerdicts(clasp(observations));
    expect(verdicts.filter((v) => v.harmful).map((v) => v.minerId)).toEqual(['s0m1']);
  });
});

describe('clasp: per-round fixed effects', () => {
  it('a newcomer in late rounds (low losses) is judged against its round, not the run', () => {
    const { observations } = synthesizePathways({ ...SMALL, lossDecayPerRound: 0.2, seed: 3 });
    // s1m3 joins at round 6: drop its pathways before.
    const late = observations.filter((o) => !(o.pathway[1] === 's1m3' && o.round < 6));
    const result = clasp(late);
    const newcomer = effectOf(result, 's1m3');
    expect(newcomer.observations).toBeGreaterThan(100);
    expect(newcomer.effect).toBeGreaterThan(-3 * newcomer.stdError);
    expect(Math.abs(newcomer.effect)).toBeLessThan(0.03);
    const verdict = claspVerdicts(result).find((v) => v.minerId === 's1m3')!;
    expect(verdict.harmful).toBe(false);
    expect(verdict.quality).toBe(1);

    // A naive comparison of mean losses calls it far better than its peers.
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    const newcomerLoss = mean(late.filter((o) => o.pathway[1] === 's1m3').map((o) => o.loss));
    const peersLoss = mean(late.filter((o) => o.pathway[1] !== 's1m3').map((o) => o.loss));
    expect(newcomerLoss - peersLoss).toBeLessThan(-0.3);
  });
});

describe('clasp: input checks', () => {
  const ok = { round: 0, pathway: ['a', 'b'], loss: 1 };
  const codeOf = (f: () => unknown): string | undefined => {
    try {
      f();
    } catch (e) {
      return e instanceof IncentivesError ? e.code : 'not an IncentivesError';
    }
    return undefined;
  };

  it('rejects empty, ragged, non-finite and badly named input, and bad options', () => {
    expect(codeOf(() => clasp([]))).toBe('EMPTY');
    expect(codeOf(() => clasp([ok, { round: 0, pathway: ['a'], loss: 1 }]))).toBe('RAGGED_PATHWAY');
    expect(codeOf(() => clasp([ok, { ...ok, loss: NaN }]))).toBe('NON_FINITE');
    expect(codeOf(() => clasp([ok, { ...ok, loss: Infinity }]))).toBe('NON_FINITE');
    expect(codeOf(() => clasp([ok, { ...ok, round: NaN }]))).toBe('NON_FINITE');
    expect(codeOf(() => clasp([ok, { ...ok, pathway: ['a', ''] }]))).toBe('BAD_PATHWAY');
    expect(codeOf(() => clasp([{ ...ok, pathway: [] }]))).toBe('BAD_PATHWAY');
    expect(codeOf(() => clasp([ok], { lambda: 0 }))).toBe('BAD_OPTION');
    expect(codeOf(() => clasp([ok], { interactionLambda: -1 }))).toBe('BAD_OPTION');
    expect(codeOf(() => clasp([ok], { minPairObservations: 0.5 }))).toBe('BAD_OPTION');
    expect(codeOf(() => claspVerdicts(clasp([ok]), { minZ: 1 }))).toBe('BAD_OPTION');
  });

  it('gives the same answer whatever the order of the observations', () => {
    const { observations } = synthesizePathways({ ...SMALL, rounds: 4, effects: { s1m1: 0.2 } });
    const a = clasp(observations);
    const b = clasp([...observations].reverse());
    expect(b.effects.map((e) => e.minerId)).toEqual(a.effects.map((e) => e.minerId));
    b.effects.forEach((e, i) => expect(e.effect).toBeCloseTo(a.effects[i]!.effect, 9));
  });
});

describe('clasp: scale', () => {
  it.each([4, 16, 64])('3 stages × %i miners, 20,000 microbatches', (minersPerStage) => {
    const { observations } = synthesizePathways({
      ...SMALL,
      minersPerStage,
      rounds: 20,
      perRound: 1000,
      lossDecayPerRound: 0.05,
      seed: 2,
      effects: { s1m1: 0.3 },
    });
    const started = performance.now();
    const result = clasp(observations);
    const ms = performance.now() - started;
    console.log(`clasp: ${3 * minersPerStage} miners, ${observations.length} microbatches: ${ms.toFixed(0)} ms`);
    expect(result.effects).toHaveLength(3 * minersPerStage);
    expect(claspVerdicts(result).filter((v) => v.harmful).map((v) => v.minerId)).toEqual(['s1m1']);
  });
});
