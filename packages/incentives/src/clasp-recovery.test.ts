import { describe, expect, it } from 'vitest';
import { clasp, type ClaspResult } from './clasp';
import { synthesizePathways } from './synthetic';

/**
 * Recovery of planted effects when miners interact. Routing is random (each
 * stage's miner drawn independently), the design in which pair effects are
 * estimable at all; 20,000 microbatches, noise 0.05 nats.
 *
 * Stated error: every main effect within 0.01 nats of its target (observed:
 * ≤ 0.007 over seeds 7–9).
 */
const MAIN: Record<string, number> = { s0m1: 0.1, s1m0: 0.05, s1m2: -0.08, s2m3: 0.15 };
const PAIRS = [
  { a: 's0m0', b: 's1m1', effect: 0.2 },
  { a: 's1m2', b: 's2m2', effect: -0.15 },
  { a: 's1m3', b: 's2m0', effect: 0.1 },
];
const STATED_ERROR = 0.01;

function synthesize(interactions: typeof PAIRS) {
  return synthesizePathways({
    stages: 3,
    minersPerStage: 4,
    rounds: 10,
    perRound: 2000,
    noise: 0.05,
    lossStart: 6,
    lossDecayPerRound: 0.05,
    rotate: true,
    routing: 'random',
    seed: 7,
    effects: MAIN,
    interactions,
  });
}

/** Microbatches per miner and per adjacent pair ("up|down"). */
function counts(observations: Array<{ pathway: string[] }>) {
  const miner = new Map<string, number>();
  const pair = new Map<string, number>();
  for (const { pathway } of observations) {
    pathway.forEach((m, s) => {
      miner.set(m, (miner.get(m) ?? 0) + 1);
      if (s > 0) pair.set(`${pathway[s - 1]}|${m}`, (pair.get(`${pathway[s - 1]}|${m}`) ?? 0) + 1);
    });
  }
  return { miner, pair };
}

/** Each miner's value relative to the observation-weighted mean of its stage. */
function relativeToStage(result: ClaspResult, miners: string[][], value: (m: string) => number, n: Map<string, number>) {
  const total = result.observations;
  return new Map(
    result.effects.map((e) => {
      const mean = miners[e.stage]!.reduce((sum, m) => sum + (value(m) * n.get(m)!) / total, 0);
      return [e.minerId, value(e.minerId) - mean];
    }),
  );
}

describe('clasp: recovery with interacting stages', () => {
  it('without planted interactions, recovers every main effect and fits no pair effect', () => {
    const { observations, miners } = synthesize([]);
    const result = clasp(observations);
    const n = counts(observations);
    const planted = relativeToStage(result, miners, (m) => MAIN[m] ?? 0, n.miner);
    for (const e of result.effects) expect(Math.abs(e.effect - planted.get(e.minerId)!)).toBeLessThan(STATED_ERROR);
    expect(result.interactions!.length).toBe(32); // every one of the 2 × 16 pairs is modelled
    for (const g of result.interactions!) expect(Math.abs(g.effect)).toBeLessThan(0.02);
  });

  it('with planted interactions, main effects take each pair’s average over the miner’s pathways', () => {
    const { observations, miners } = synthesize(PAIRS);
    const result = clasp(observations);
    const n = counts(observations);
    // The average planted interaction on each miner's own pathways.
    const absorbed = (m: string) =>
      PAIRS.filter((p) => p.a === m || p.b === m).reduce(
        (sum, p) => sum + (p.effect * (n.pair.get(`${p.a}|${p.b}`) ?? 0)) / n.miner.get(m)!,
        0,
      );
    const target = relativeToStage(result, miners, (m) => (MAIN[m] ?? 0) + absorbed(m), n.miner);
    const planted = relativeToStage(result, miners, (m) => MAIN[m] ?? 0, n.miner);
    let worstAgainstPlanted = 0;
    for (const e of result.effects) {
      expect(Math.abs(e.effect - target.get(e.minerId)!)).toBeLessThan(STATED_ERROR);
      worstAgainstPlanted = Math.max(worstAgainstPlanted, Math.abs(e.effect - planted.get(e.minerId)!));
    }
    // Not the planted main effects themselves: a main effect and the mean of a
    // miner's pair effects are not separable from losses (see clasp.ts), and
    // the ridge gives that mean to the main effect.
    expect(worstAgainstPlanted).toBeGreaterThan(0.03);

    // The pair effects keep what no main effect explains: the planted pair
    // stands out among the pairs of its two miners, with the planted sign.
    for (const p of PAIRS) {
      const neighbours = result.interactions!.filter((g) => g.up === p.a || g.down === p.b);
      const strongest = neighbours.reduce((x, y) => (Math.abs(y.effect) > Math.abs(x.effect) ? y : x));
      expect([strongest.up, strongest.down]).toEqual([p.a, p.b]);
      expect(Math.sign(strongest.effect)).toBe(Math.sign(p.effect));
    }
  });

  it('shares add half of every modelled pair effect, weighted by the pair’s part of the miner’s pathways', () => {
    const { observations } = synthesize(PAIRS);
    const result = clasp(observations);
    for (const e of result.effects) {
      const half = result.interactions!
        .filter((g) => g.up === e.minerId || g.down === e.minerId)
        .reduce((sum, g) => sum + (0.5 * g.effect * g.observations) / e.observations, 0);
      expect(e.share - e.effect).toBeCloseTo(half, 12);
    }
    // With every pair modelled, the remainders average out on each miner's pathways.
    for (const e of result.effects) expect(Math.abs(e.share - e.effect)).toBeLessThan(0.005);
  });
});
