/**
 * The products with CLASP's pair block that the block solve needs
 * (clasp-solve.ts): Aγγ·V inside conjugate gradient, and Aβγ·Z to form the
 * Schur complement. Neither matrix is ever stored dense.
 */

import type { ClaspDesign } from './clasp-design';
import type { NormalEquations } from './clasp-normal';
import type { BlockOperator } from './linalg';

/**
 * V ↦ Aγγ·V = (XγᵀWXγ − Σ_r d_r·d_rᵀ / N_r + λγ·I)·V for row-interleaved
 * columns. XγᵀWXγ is formed once, sparse: its diagonal holds each pair's
 * count, and off the diagonal two pairs of different boundaries that shared
 * cells (a pair at boundary b shares each of its cells with one pair at
 * b + 1). That is fewer entries than cells once pathways vary within a
 * round, where a pass over the cells would cost a pass over the microbatches.
 */
export function pairOperator(d: ClaspDesign, ne: NormalEquations, interactionLambda: number): BlockOperator {
  const B = d.stages - 1;
  const q = d.pairs.length;
  const offDiagonal = new Map<number, number>();
  const diagonal = new Float64Array(q);
  for (let c = 0; c < d.cellCount; c++) {
    const wc = d.cellWeight[c]!;
    for (let b = 0; b < B; b++) {
      const k = d.cellPairs[c * B + b]!;
      if (k < 0) continue;
      diagonal[k] += wc;
      for (let b2 = b + 1; b2 < B; b2++) {
        const k2 = d.cellPairs[c * B + b2]!;
        if (k2 < 0) continue;
        offDiagonal.set(k * q + k2, (offDiagonal.get(k * q + k2) ?? 0) + wc);
        offDiagonal.set(k2 * q + k, (offDiagonal.get(k2 * q + k) ?? 0) + wc);
      }
    }
  }
  // CSR rows of the off-diagonal part.
  const rowStart = new Int32Array(q + 1);
  for (const key of offDiagonal.keys()) rowStart[Math.floor(key / q) + 1] += 1;
  for (let k = 0; k < q; k++) rowStart[k + 1] += rowStart[k]!;
  const column = new Int32Array(offDiagonal.size);
  const weight = new Float64Array(offDiagonal.size);
  const fill = rowStart.slice(0, q);
  for (const [key, w] of offDiagonal) {
    const row = Math.floor(key / q);
    column[fill[row]!] = key - row * q;
    weight[fill[row]!] = w;
    fill[row] += 1;
  }
  for (let k = 0; k < q; k++) diagonal[k] += interactionLambda;

  let projection = new Float64Array(0);
  return (v, out, count) => {
    for (let k = 0; k < q; k++) {
      const o = k * count;
      const dk = diagonal[k]!;
      for (let j = 0; j < count; j++) out[o + j] = dk * v[o + j]!;
      for (let e = rowStart[k]!; e < rowStart[k + 1]!; e++) {
        const w = weight[e]!;
        const vo = column[e]! * count;
        for (let j = 0; j < count; j++) out[o + j] += w * v[vo + j]!;
      }
    }
    if (projection.length < count) projection = new Float64Array(count);
    for (const round of ne.rounds) {
      projection.fill(0, 0, count);
      for (let x = 0; x < round.pairs.length; x++) {
        const c = round.pairCounts[x]!;
        const vo = round.pairs[x]! * count;
        for (let j = 0; j < count; j++) projection[j] += c * v[vo + j]!;
      }
      const inv = 1 / round.size;
      for (let x = 0; x < round.pairs.length; x++) {
        const c = round.pairCounts[x]! * inv;
        const oo = round.pairs[x]! * count;
        for (let j = 0; j < count; j++) out[oo + j] -= c * projection[j]!;
      }
    }
  };
}

/**
 * Aβγ·Z for Z given k-major (zt[k·width + j], width columns): the sparse
 * part row by row, then the round terms through D_r = d_rᵀ·Z. Costs
 * nnz·width + Σ_r (pairs_r + miners_r)·width instead of the dense p·q·width.
 */
export function applyMinerPair(ne: NormalEquations, p: number, zt: Float64Array, width: number): Float64Array {
  const out = new Float64Array(p * width);
  for (let i = 0; i < p; i++) {
    const oo = i * width;
    for (let e = ne.gRowStart[i]!; e < ne.gRowStart[i + 1]!; e++) {
      const w = ne.gWeight[e]!;
      const zo = ne.gPair[e]! * width;
      for (let j = 0; j < width; j++) out[oo + j] += w * zt[zo + j]!;
    }
  }
  const dr = new Float64Array(width);
  for (const round of ne.rounds) {
    dr.fill(0);
    for (let x = 0; x < round.pairs.length; x++) {
      const c = round.pairCounts[x]!;
      const zo = round.pairs[x]! * width;
      for (let j = 0; j < width; j++) dr[j] += c * zt[zo + j]!;
    }
    const inv = 1 / round.size;
    for (let x = 0; x < round.miners.length; x++) {
      const ci = round.minerCounts[x]! * inv;
      const oo = round.miners[x]! * width;
      for (let j = 0; j < width; j++) out[oo + j] -= ci * dr[j]!;
    }
  }
  return out;
}
