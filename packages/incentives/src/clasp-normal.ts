/**
 * The pieces of CLASP's normal equations, built from the cells (see
 * clasp-design.ts) with the per-round fixed effects projected out.
 *
 * Demeaning a column within each round makes it dense within the round, so
 * no demeaned column of the design is ever stored: every product is an
 * uncorrected sparse product minus a low-rank round term, e.g.
 *   XᵀW·M·X = XᵀW·X − Σ_r c_r·c_rᵀ / N_r
 * with c_r the per-parameter microbatch counts of round r and N_r its size
 * (M the weighted within-round demeaning, W the cell sizes).
 */

import type { ClaspDesign } from './clasp-design';

/** Per round: which miners and pairs ran in it, and on how many microbatches. */
export interface RoundCounts {
  size: number;
  miners: Int32Array;
  minerCounts: Float64Array;
  pairs: Int32Array;
  pairCounts: Float64Array;
}

export interface NormalEquations {
  /** Cell mean losses, demeaned within rounds. */
  y: Float64Array;
  /** Aββ = XβᵀWMXβ, p × p, without the ridge. */
  a: Float64Array;
  /** XβᵀWMy. */
  bBeta: Float64Array;
  /** Aγβ, dense, column of miner j at [j·q, (j+1)·q): the CG right-hand sides. */
  g: Float64Array;
  /** The uncorrected XβᵀWXγ, sparse by miner: row i is entries [rowStart[i], rowStart[i+1]). */
  gRowStart: Int32Array;
  gPair: Int32Array;
  gWeight: Float64Array;
  /** diag(Aγγ) including the interaction ridge: CG's preconditioner. */
  gammaDiagonal: Float64Array;
  /** XγᵀWMy. */
  bGamma: Float64Array;
  rounds: RoundCounts[];
}

/** Weighted within-round demeaning of a vector over the cells, in place. */
export function makeDemean(d: ClaspDesign): (u: Float64Array) => void {
  const roundSum = new Float64Array(d.rounds);
  const { cellCount, cellRound, cellWeight } = d;
  return (u) => {
    roundSum.fill(0);
    for (let c = 0; c < cellCount; c++) roundSum[cellRound[c]!] += cellWeight[c]! * u[c]!;
    for (let r = 0; r < d.rounds; r++) roundSum[r] = roundSum[r]! / d.roundWeight[r]!;
    for (let c = 0; c < cellCount; c++) u[c] -= roundSum[cellRound[c]!]!;
  };
}

export function normalEquations(d: ClaspDesign, interactionLambda: number): NormalEquations {
  const S = d.stages;
  const B = S - 1;
  const p = d.miners.length;
  const q = d.pairs.length;
  const y = Float64Array.from(d.cellMeanLoss);
  makeDemean(d)(y);

  const a = new Float64Array(p * p);
  const bBeta = new Float64Array(p);
  const g = new Float64Array(p * q);
  const gammaDiagonal = new Float64Array(q);
  const bGamma = new Float64Array(q);
  for (let c = 0; c < d.cellCount; c++) {
    const wc = d.cellWeight[c]!;
    for (let s = 0; s < S; s++) {
      const i = d.cellMiners[c * S + s]!;
      bBeta[i] += wc * y[c]!;
      for (let t = 0; t < S; t++) a[i * p + d.cellMiners[c * S + t]!] += wc;
    }
    for (let b = 0; b < B; b++) {
      const k = d.cellPairs[c * B + b]!;
      if (k < 0) continue;
      gammaDiagonal[k] += wc;
      bGamma[k] += wc * y[c]!;
      for (let s = 0; s < S; s++) g[d.cellMiners[c * S + s]! * q + k] += wc;
    }
  }
  // The sparse uncorrected XβᵀWXγ, read off g before the round terms fill it in.
  const gRowStart = new Int32Array(p + 1);
  const pairList: number[] = [];
  const weightList: number[] = [];
  for (let i = 0; i < p; i++) {
    for (let k = 0; k < q; k++) {
      const v = g[i * q + k]!;
      if (v !== 0) {
        pairList.push(k);
        weightList.push(v);
      }
    }
    gRowStart[i + 1] = pairList.length;
  }

  const rounds = roundCounts(d);
  for (const round of rounds) {
    const inv = 1 / round.size;
    for (let x = 0; x < round.miners.length; x++) {
      const i = round.miners[x]!;
      const ci = round.minerCounts[x]! * inv;
      for (let z = 0; z < round.miners.length; z++) a[i * p + round.miners[z]!] -= ci * round.minerCounts[z]!;
      for (let z = 0; z < round.pairs.length; z++) g[i * q + round.pairs[z]!] -= ci * round.pairCounts[z]!;
    }
    for (let z = 0; z < round.pairs.length; z++) gammaDiagonal[round.pairs[z]!] -= round.pairCounts[z]! ** 2 * inv;
  }
  for (let k = 0; k < q; k++) gammaDiagonal[k] += interactionLambda;
  return {
    y,
    a,
    bBeta,
    g,
    gRowStart,
    gPair: Int32Array.from(pairList),
    gWeight: Float64Array.from(weightList),
    gammaDiagonal,
    bGamma,
    rounds,
  };
}

function roundCounts(d: ClaspDesign): RoundCounts[] {
  const S = d.stages;
  const B = S - 1;
  const minerCount = new Float64Array(d.miners.length);
  const pairCount = new Float64Array(d.pairs.length);
  const cellsOfRound: number[][] = Array.from({ length: d.rounds }, () => []);
  for (let c = 0; c < d.cellCount; c++) cellsOfRound[d.cellRound[c]!]!.push(c);
  return cellsOfRound.map((cells, r) => {
    const miners: number[] = [];
    const pairs: number[] = [];
    for (const c of cells) {
      const wc = d.cellWeight[c]!;
      for (let s = 0; s < S; s++) {
        const m = d.cellMiners[c * S + s]!;
        if (minerCount[m] === 0) miners.push(m);
        minerCount[m] += wc;
      }
      for (let b = 0; b < B; b++) {
        const k = d.cellPairs[c * B + b]!;
        if (k < 0) continue;
        if (pairCount[k] === 0) pairs.push(k);
        pairCount[k] += wc;
      }
    }
    const counts: RoundCounts = {
      size: d.roundWeight[r]!,
      miners: Int32Array.from(miners),
      minerCounts: Float64Array.from(miners, (m) => minerCount[m]!),
      pairs: Int32Array.from(pairs),
      pairCounts: Float64Array.from(pairs, (k) => pairCount[k]!),
    };
    for (const m of miners) minerCount[m] = 0;
    for (const k of pairs) pairCount[k] = 0;
    return counts;
  });
}
