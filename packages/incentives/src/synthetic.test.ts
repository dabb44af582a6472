import { describe, expect, it } from 'vitest';
import { synthesizePathways } from './synthetic';

const BASE = {
  stages: 3,
  minersPerStage: 4,
  rounds: 3,
  perRound: 8,
  noise: 0,
  lossStart: 5,
  lossDecayPerRound: 0.5,
  rotate: true,
  seed: 9,
};

describe('synthesizePathways', () => {
  it('pairs replicas as the swarm does: fixed within a round, shifted by the round when rotating', () => {
    const { observations, miners } = synthesizePathways(BASE);
    expect(miners[1]).toEqual(['s1m0', 's1m1', 's1m2', 's1m3']);
    for (const o of observations) {
      const i = Number(o.pathway[0]!.slice(3));
      expect(o.pathway).toEqual([`s0m${i}`, `s1m${(i + o.round) % 4}`, `s2m${(i + 2 * o.round) % 4}`]);
    }
    const fixed = synthesizePathways({ ...BASE, rotate: false }).observations;
    for (const o of fixed) expect(new Set(o.pathway.map((m) => m.slice(3))).size).toBe(1);
  });

  it('adds the round’s loss, planted effects and interactions (either order), and is seeded', () => {
    const { observations } = synthesizePathways({
      ...BASE,
      effects: { s1m1: 0.3 },
      interactions: [{ a: 's1m1', b: 's0m1', effect: 0.2 }],
    });
    for (const o of observations) {
      let expected = 5 - 0.5 * o.round;
      if (o.pathway[1] === 's1m1') expected += 0.3;
      if (o.pathway[0] === 's0m1' && o.pathway[1] === 's1m1') expected += 0.2;
      expect(o.loss).toBeCloseTo(expected, 12);
    }
    const noisy = { ...BASE, noise: 0.1 };
    expect(synthesizePathways(noisy)).toEqual(synthesizePathways(noisy));
    expect(synthesizePathways(noisy)).not.toEqual(synthesizePathways({ ...noisy, seed: 10 }));
  });

  it('random routing draws every stage independently', () => {
    const { observations } = synthesizePathways({ ...BASE, routing: 'random', perRound: 400 });
    const pairs = new Set(observations.map((o) => `${o.pathway[0]}|${o.pathway[1]}|${o.pathway[2]}`));
    expect(pairs.size).toBe(64);
  });
});
