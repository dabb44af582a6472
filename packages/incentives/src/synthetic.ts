/**
 * Synthetic pathway losses with planted miner effects, for CLASP's tests and
 * benchmark: the truth is known, so the estimates can be checked against it.
 *
 * Routing follows the swarm (packages/swarm/src/pipeline.ts): stage 0 hands
 * out microbatches round-robin over its replicas, and between merges each
 * replica keeps one partner downstream: in round r, stage-s miner i forwards
 * to stage-(s+1) miner (i + shift) mod n, shift = r when partners rotate at
 * each merge, 0 when they never do. With rotation a round's pathways are a
 * chain per stage-0 miner, so each pathway is a fixed function of the round
 * and its first miner; `routing: 'random'` instead draws every stage's miner
 * independently per microbatch (what a validator's probe routing could do),
 * which is what makes pair effects separable from main effects.
 */

import type { PathwayObservation } from './clasp-design';
import { IncentivesError } from './errors';

export interface SynthesizeOptions {
  stages: number;
  minersPerStage: number;
  rounds: number;
  /** Microbatches per round. */
  perRound: number;
  /** Planted main effects, nats, by miner id (`s{stage}m{i}`); others 0. */
  effects?: Record<string, number>;
  /** Planted effects of two adjacent-stage miners on the same pathway, nats. */
  interactions?: Array<{ a: string; b: string; effect: number }>;
  /** Standard deviation of the per-microbatch noise, nats. */
  noise: number;
  /** Loss of round 0 before effects, nats. */
  lossStart: number;
  /** Training progress: every round's losses are this much lower, nats. */
  lossDecayPerRound: number;
  rotate: boolean;
  seed: number;
  /** 'swarm' (default): fixed partners within a round; 'random': independent draws. */
  routing?: 'swarm' | 'random';
}

export interface SyntheticPathways {
  observations: PathwayObservation[];
  /** miners[s][i] = `s{s}m{i}`. */
  miners: string[][];
}

export function synthesizePathways(o: SynthesizeOptions): SyntheticPathways {
  for (const [name, value] of [
    ['stages', o.stages],
    ['minersPerStage', o.minersPerStage],
    ['rounds', o.rounds],
    ['perRound', o.perRound],
  ] as const) {
    if (!(Number.isInteger(value) && value >= 1)) {
      throw new IncentivesError('BAD_OPTION', `${name} must be an integer ≥ 1, got ${value}`);
    }
  }
  for (const [name, value] of [
    ['noise', o.noise],
    ['lossStart', o.lossStart],
    ['lossDecayPerRound', o.lossDecayPerRound],
  ] as const) {
    if (!Number.isFinite(value)) throw new IncentivesError('NON_FINITE', `${name} is ${value}`);
  }
  const n = o.minersPerStage;
  const miners = Array.from({ length: o.stages }, (_, s) => Array.from({ length: n }, (_, i) => `s${s}m${i}`));
  const effects = o.effects ?? {};
  const pairEffect = new Map<string, number>();
  for (const { a, b, effect } of o.interactions ?? []) {
    // Either order: the caller names a pair, not a direction.
    pairEffect.set(`${a}\u0000${b}`, (pairEffect.get(`${a}\u0000${b}`) ?? 0) + effect);
    if (a !== b) pairEffect.set(`${b}\u0000${a}`, (pairEffect.get(`${b}\u0000${a}`) ?? 0) + effect);
  }

  const random = mulberry32(o.seed);
  const gaussian = gaussianFrom(random);
  const observations: PathwayObservation[] = [];
  for (let round = 0; round < o.rounds; round++) {
    const shift = o.rotate ? round : 0;
    const base = o.lossStart - o.lossDecayPerRound * round;
    for (let j = 0; j < o.perRound; j++) {
      const pathway: string[] = [];
      let i = j % n;
      for (let s = 0; s < o.stages; s++) {
        if (o.routing === 'random') i = Math.floor(random() * n);
        else if (s > 0) i = (i + shift) % n;
        pathway.push(miners[s]![i]!);
      }
      let loss = base + o.noise * gaussian();
      for (let s = 0; s < o.stages; s++) {
        loss += effects[pathway[s]!] ?? 0;
        if (s > 0) loss += pairEffect.get(`${pathway[s - 1]}\u0000${pathway[s]}`) ?? 0;
      }
      observations.push({ round, pathway, loss });
    }
  }
  return { observations, miners };
}

/** mulberry32: a small, fast, seedable PRNG returning floats in [0, 1). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Standard normal draws by Box–Muller (one of each pair kept: simpler, cheap enough). */
function gaussianFrom(random: () => number): () => number {
  return () => {
    const u = 1 - random(); // (0, 1]: log(0) never happens
    const v = random();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  };
}
