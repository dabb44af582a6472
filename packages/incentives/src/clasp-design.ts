/**
 * CLASP's design: pathway observations checked and indexed into parameters
 * (one main effect per miner and stage, one interaction per adjacent-stage
 * pair seen often enough) and grouped into cells.
 *
 * A cell is one (round, pathway): every observation in it has the same row
 * of the design matrix, so the regression only needs each cell's count and
 * mean loss, plus the spread inside cells for the residual variance. In the
 * swarm a replica keeps one downstream partner between merges, so a round
 * holds about one cell per stage-0 miner: 20,000 microbatches over 20 rounds
 * of 64 replicas are 1,280 cells, and every pass over the data is 15×
 * shorter than a pass over microbatches.
 */

import { IncentivesError } from './errors';

export interface PathwayObservation {
  round: number;
  /** pathway[s] = id of the miner that ran stage s for this microbatch. */
  pathway: string[];
  /** Loss of the microbatch, nats. */
  loss: number;
}

export interface PairParameter {
  /** Stage s of `up`; `down` ran stage s + 1. */
  boundary: number;
  up: number;
  down: number;
  observations: number;
}

export interface ClaspDesign {
  stages: number;
  observations: number;
  rounds: number;
  /** Parameter index → miner; sorted by stage, then id (code-unit order). */
  miners: Array<{ minerId: string; stage: number }>;
  /** [first, end) parameter indices of each stage's miners. */
  stageRange: Array<[number, number]>;
  minerObservations: Float64Array;
  /** Per miner: distinct partners on its adjacent side with fewer of them. */
  partners: Int32Array;
  pairs: PairParameter[];
  cellCount: number;
  cellRound: Int32Array;
  cellWeight: Float64Array;
  cellMeanLoss: Float64Array;
  /** cellCount × stages miner indices. */
  cellMiners: Int32Array;
  /** cellCount × (stages − 1) pair indices, −1 where the pair is not modelled. */
  cellPairs: Int32Array;
  /** Observations per round. */
  roundWeight: Float64Array;
  /** Σ (loss − its cell's mean)²: no model over pathways can explain it. */
  withinCellSumSq: number;
}

export function buildDesign(
  observations: readonly PathwayObservation[],
  interactions: boolean,
  minPairObservations: number,
): ClaspDesign {
  const stages = validate(observations);
  const n = observations.length;

  // Miner indices sorted by stage then id, so results never depend on input order.
  const idsByStage: Array<Set<string>> = Array.from({ length: stages }, () => new Set());
  for (const o of observations) o.pathway.forEach((id, s) => idsByStage[s]!.add(id));
  const miners: ClaspDesign['miners'] = [];
  const indexByStage: Array<Map<string, number>> = [];
  const stageRange: Array<[number, number]> = [];
  for (let s = 0; s < stages; s++) {
    const index = new Map<string, number>();
    const first = miners.length;
    for (const minerId of [...idsByStage[s]!].sort(byCodeUnits)) {
      index.set(minerId, miners.length);
      miners.push({ minerId, stage: s });
    }
    indexByStage.push(index);
    stageRange.push([first, miners.length]);
  }
  const p = miners.length;

  const roundIndex = new Map<number, number>();
  for (const r of [...new Set(observations.map((o) => o.round))].sort((a, b) => a - b)) {
    roundIndex.set(r, roundIndex.size);
  }

  const minerObservations = new Float64Array(p);
  const upPartners: Array<Set<number>> = Array.from({ length: p }, () => new Set());
  const downPartners: Array<Set<number>> = Array.from({ length: p }, () => new Set());
  const pairCount = new Map<number, number>();
  const cellOf = new Int32Array(n);
  const cellKey = new Map<string, number>();
  const cellRoundList: number[] = [];
  const cellMinerList: number[] = [];
  const cellWeightList: number[] = [];
  const cellSumList: number[] = [];
  const path = new Int32Array(stages);
  for (let i = 0; i < n; i++) {
    const o = observations[i]!;
    for (let s = 0; s < stages; s++) {
      const m = indexByStage[s]!.get(o.pathway[s]!)!;
      path[s] = m;
      minerObservations[m] += 1;
      if (s > 0) {
        const up = path[s - 1]!;
        downPartners[up]!.add(m);
        upPartners[m]!.add(up);
        const key = up * p + m;
        pairCount.set(key, (pairCount.get(key) ?? 0) + 1);
      }
    }
    const round = roundIndex.get(o.round)!;
    const key = `${round}:${path.join(',')}`;
    let cell = cellKey.get(key);
    if (cell === undefined) {
      cell = cellKey.size;
      cellKey.set(key, cell);
      cellRoundList.push(round);
      cellMinerList.push(...path);
      cellWeightList.push(0);
      cellSumList.push(0);
    }
    cellOf[i] = cell;
    cellWeightList[cell] += 1;
    cellSumList[cell] += o.loss;
  }

  const cellCount = cellKey.size;
  const cellWeight = Float64Array.from(cellWeightList);
  const cellMeanLoss = new Float64Array(cellCount);
  for (let c = 0; c < cellCount; c++) cellMeanLoss[c] = cellSumList[c]! / cellWeight[c]!;
  let withinCellSumSq = 0;
  for (let i = 0; i < n; i++) {
    const d = observations[i]!.loss - cellMeanLoss[cellOf[i]!]!;
    withinCellSumSq += d * d;
  }

  // Pairs in key order: key = up·p + down, and up indices follow the stages.
  const pairs: PairParameter[] = [];
  const pairIndex = new Map<number, number>();
  if (interactions) {
    for (const key of [...pairCount.keys()].sort((a, b) => a - b)) {
      const count = pairCount.get(key)!;
      if (count < minPairObservations) continue;
      const up = Math.floor(key / p);
      pairIndex.set(key, pairs.length);
      pairs.push({ boundary: miners[up]!.stage, up, down: key - up * p, observations: count });
    }
  }
  const cellMiners = Int32Array.from(cellMinerList);
  const cellPairs = new Int32Array(cellCount * Math.max(0, stages - 1)).fill(-1);
  for (let c = 0; c < cellCount; c++) {
    for (let b = 0; b + 1 < stages; b++) {
      const key = cellMiners[c * stages + b]! * p + cellMiners[c * stages + b + 1]!;
      cellPairs[c * (stages - 1) + b] = pairIndex.get(key) ?? -1;
    }
  }

  const roundWeight = new Float64Array(roundIndex.size);
  for (let c = 0; c < cellCount; c++) roundWeight[cellRoundList[c]!] += cellWeight[c]!;

  const partners = new Int32Array(p);
  for (let m = 0; m < p; m++) {
    const stage = miners[m]!.stage;
    const sides: number[] = [];
    if (stage > 0) sides.push(upPartners[m]!.size);
    if (stage + 1 < stages) sides.push(downPartners[m]!.size);
    // One fixed partner on either side and the two are one unit to the data.
    partners[m] = sides.length === 0 ? 0 : Math.min(...sides);
  }

  return {
    stages,
    observations: n,
    rounds: roundIndex.size,
    miners,
    stageRange,
    minerObservations,
    partners,
    pairs,
    cellCount,
    cellRound: Int32Array.from(cellRoundList),
    cellWeight,
    cellMeanLoss,
    cellMiners,
    cellPairs,
    roundWeight,
    withinCellSumSq,
  };
}

/** Checks everything before indexing anything; returns the number of stages. */
function validate(observations: readonly PathwayObservation[]): number {
  if (!Array.isArray(observations) || observations.length === 0) {
    throw new IncentivesError('EMPTY', 'no pathway observations');
  }
  const first = observations[0]!.pathway;
  if (!Array.isArray(first) || first.length === 0) {
    throw new IncentivesError('BAD_PATHWAY', 'observation 0 has no pathway');
  }
  const stages = first.length;
  observations.forEach((o, i) => {
    if (!Array.isArray(o.pathway) || o.pathway.length !== stages) {
      throw new IncentivesError('RAGGED_PATHWAY', `observation ${i} crosses ${o.pathway?.length} stages, not ${stages}`);
    }
    for (const id of o.pathway) {
      if (typeof id !== 'string' || id.length === 0) {
        throw new IncentivesError('BAD_PATHWAY', `observation ${i} names a miner that is not a non-empty string`);
      }
    }
    if (!Number.isFinite(o.loss)) throw new IncentivesError('NON_FINITE', `observation ${i} has loss ${o.loss}`);
    if (!Number.isFinite(o.round)) throw new IncentivesError('NON_FINITE', `observation ${i} has round ${o.round}`);
  });
  return stages;
}

function byCodeUnits(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
