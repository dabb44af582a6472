import { describe, expect, it } from 'vitest';
import { clasp } from './clasp';
import { cholesky, choleskyInverse, choleskySolve } from './linalg';
import { synthesizePathways } from './synthetic';

/**
 * The block solve (cells, round terms, CG on the pair block, Schur
 * complement) against the textbook: the demeaned design written out as a
 * dense matrix and the penalised normal equations solved directly.
 */
describe('clasp solve: against a dense solve of the same ridge problem', () => {
  it.each([true, false])('interactions %s', (interactions) => {
    const lambda = 1.5;
    const interactionLambda = 7;
    const { observations } = synthesizePathways({
      stages: 3,
      minersPerStage: 3,
      rounds: 4,
      perRound: 90,
      noise: 0.1,
      lossStart: 5,
      lossDecayPerRound: 0.3,
      rotate: true,
      routing: 'random',
      seed: 11,
      effects: { s0m1: 0.2, s2m0: -0.1 },
      interactions: [{ a: 's1m1', b: 's2m2', effect: 0.3 }],
    });
    // Drop a few microbatches so that rounds and cells differ in size.
    const data = observations.filter((_, i) => i % 7 !== 3);
    const result = clasp(data, { lambda, interactions, interactionLambda, minPairObservations: 3 });

    const miners = result.effects.map((e) => `${e.stage}:${e.minerId}`);
    const pairs = result.interactions!.map((g) => `${g.stage}:${g.up}|${g.down}`);
    expect(pairs.length > 0).toBe(interactions);
    const width = miners.length + pairs.length;
    const n = data.length;
    const x = new Float64Array(n * width);
    const y = Float64Array.from(data, (o) => o.loss);
    data.forEach((o, i) => {
      o.pathway.forEach((m, s) => {
        x[i * width + miners.indexOf(`${s}:${m}`)] = 1;
        const k = s > 0 ? pairs.indexOf(`${s - 1}:${o.pathway[s - 1]}|${m}`) : -1;
        if (k >= 0) x[i * width + miners.length + k] = 1;
      });
    });
    // Demean y and every column within each round.
    for (const round of new Set(data.map((o) => o.round))) {
      const rows = data.flatMap((o, i) => (o.round === round ? [i] : []));
      for (let j = -1; j < width; j++) {
        const get = (i: number) => (j < 0 ? y[i]! : x[i * width + j]!);
        const mean = rows.reduce((sum, i) => sum + get(i), 0) / rows.length;
        for (const i of rows) {
          if (j < 0) y[i] -= mean;
          else x[i * width + j] -= mean;
        }
      }
    }
    const a = new Float64Array(width * width);
    const b = new Float64Array(width);
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < width; j++) {
        const xij = x[i * width + j]!;
        if (xij === 0) continue;
        b[j] += xij * y[i]!;
        for (let k = 0; k < width; k++) a[j * width + k] += xij * x[i * width + k]!;
      }
    }
    for (let j = 0; j < width; j++) a[j * width + j] += j < miners.length ? lambda : interactionLambda;
    const l = cholesky(a, width);
    const theta = choleskySolve(l, width, b);
    const inverse = choleskyInverse(l, width);

    for (const [m, e] of result.effects.entries()) {
      // The contrast against the observation-weighted stage mean, and its variance.
      const c = new Float64Array(width);
      result.effects.forEach((peer, j) => {
        if (peer.stage === e.stage) c[j] -= peer.observations / n;
      });
      c[m] += 1;
      let effect = 0;
      let variance = 0;
      for (let i = 0; i < width; i++) {
        effect += c[i]! * theta[i]!;
        for (let j = 0; j < width; j++) variance += c[i]! * inverse[i * width + j]! * c[j]!;
      }
      expect(e.effect).toBeCloseTo(effect, 8);
      expect(e.stdError / result.residualStd).toBeCloseTo(Math.sqrt(variance), 7);
    }
    result.interactions!.forEach((g, k) => expect(g.effect).toBeCloseTo(theta[miners.length + k]!, 8));

    // Residual variance: exact degrees of freedom here; CLASP's estimate of the
    // pair part may only err towards a larger σ, and not by much.
    let rss = 0;
    for (let i = 0; i < n; i++) {
      let fitted = 0;
      for (let j = 0; j < width; j++) fitted += x[i * width + j]! * theta[j]!;
      rss += (y[i]! - fitted) ** 2;
    }
    let trace = width;
    for (let j = 0; j < width; j++) trace -= (j < miners.length ? lambda : interactionLambda) * inverse[j * width + j]!;
    const sigma = Math.sqrt(rss / (n - result.rounds - trace));
    expect(result.residualStd).toBeGreaterThanOrEqual(sigma * (1 - 1e-9));
    expect(result.residualStd).toBeLessThan(sigma * 1.02);
  });
});
