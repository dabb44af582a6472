/**
 * CLASP's ridge regression, solved exactly by blocks.
 *
 * Model, per cell c (a round r and a pathway), with n_c microbatches:
 *   loss = α_r + Σ_s β[miner at s] + Σ_b γ[pair at boundary b] + noise
 * α is unpenalised and removed by demeaning the losses and every column
 * within each round, weighted by n_c (Frisch–Waugh–Lovell): loss falls as
 * training goes on, so only microbatches of the same round are compared.
 * β carries a ridge penalty λ, γ a stronger λγ.
 *
 * With A the penalised normal matrix split into the miner block (p × p,
 * dense) and the pair block (q × q, sparse plus one rank-one term per round):
 *   A = [ Aββ  Aβγ ]   the pair block is only ever applied, never inverted
 *       [ Aγβ  Aγγ ]   (see pairOperator in clasp-pairs.ts).
 * Block elimination gives the exact solution and the exact covariance of β:
 *   Z = Aγγ⁻¹·Aγβ            conjugate gradient, p + 1 right-hand sides
 *   S = Aββ − Aβγ·Z           the Schur complement, p × p, dense
 *   β = S⁻¹·(bβ − Aβγ·Aγγ⁻¹·bγ),   γ = Aγγ⁻¹·bγ − Z·β
 *   Cov(β) = σ²·S⁻¹           (the ridge posterior: [A⁻¹]ββ = S⁻¹)
 * so a miner's standard error counts what the pair effects could have
 * absorbed. Cost: the CG solves (a few to tens of products with the sparse
 * pair block, for p + 1 columns) and p³ for S⁻¹; see the benchmark in
 * clasp.test.ts.
 *
 * The ridge prior also decides how the loss of pathways that the data cannot
 * tell apart is split (a miner and its fixed partner): there S⁻¹ reports
 * the prior's spread, not ignorance. So the fit also returns the inverse of
 * the same Schur complement without the miners' ridge (a relative 1e-9
 * floor keeps it invertible): its contrast variances blow up exactly where
 * the data alone cannot separate a miner, and the verdict refuses to judge.
 */

import type { ClaspDesign } from './clasp-design';
import { makeDemean, normalEquations } from './clasp-normal';
import { applyMinerPair, pairOperator } from './clasp-pairs';
import { IncentivesError } from './errors';
import { blockConjugateGradient, cholesky, choleskyInverse, choleskySolve } from './linalg';

export interface ClaspFit {
  beta: Float64Array;
  gamma: Float64Array;
  /** S⁻¹ (p × p): Cov(β) = residualVariance · S⁻¹. */
  betaCovarianceScale: Float64Array;
  /** (S − λI + εI)⁻¹: the same without the miners' ridge prior. */
  unpenalizedCovarianceScale: Float64Array;
  residualVariance: number;
  /** tr of the hat matrix (γ part estimated from above: see below). */
  effectiveParameters: number;
}

/** CG must reach this; anything worse than CG_ACCEPT is a bug, not an estimate. */
const CG_TOLERANCE = 1e-10;
const CG_ACCEPT = 1e-6;
/** Right-hand sides per CG block: bounds CG's memory at about 5·q·32 floats. */
const CG_BLOCK = 32;
/** Floor of the unpenalized Schur complement, relative to its largest diagonal. */
const UNPENALIZED_FLOOR = 1e-9;

export function fitClasp(d: ClaspDesign, lambda: number, interactionLambda: number): ClaspFit {
  const p = d.miners.length;
  const q = d.pairs.length;
  const ne = normalEquations(d, interactionLambda);
  const a = ne.a;
  const rhs = Float64Array.from(ne.bBeta);

  // Z and Aγγ⁻¹·bγ side by side, k-major: zt[k·width + j], column p = Aγγ⁻¹·bγ.
  const width = p + 1;
  const zt = new Float64Array(q * width);
  if (q > 0) {
    const applyPairs = pairOperator(d, ne, interactionLambda);
    for (let first = 0; first < width; first += CG_BLOCK) {
      const count = Math.min(CG_BLOCK, width - first);
      const block = new Float64Array(q * count);
      for (let j = 0; j < count; j++) {
        const column = first + j;
        for (let k = 0; k < q; k++) block[k * count + j] = column < p ? ne.g[column * q + k]! : ne.bGamma[k]!;
      }
      const solved = blockConjugateGradient(applyPairs, block, count, ne.gammaDiagonal, CG_TOLERANCE, 20 * q + 100);
      if (!(solved.worstRelativeResidual <= CG_ACCEPT)) {
        throw new IncentivesError('NUMERICAL', `pair block did not converge (${solved.worstRelativeResidual})`);
      }
      for (let k = 0; k < q; k++) {
        for (let j = 0; j < count; j++) zt[k * width + first + j] = solved.x[k * count + j]!;
      }
    }
    // S = Aββ − Aβγ·Z (symmetric in exact arithmetic: average the halves), rhs −= Aβγ·Aγγ⁻¹·bγ.
    const product = applyMinerPair(ne, p, zt, width);
    for (let i = 0; i < p; i++) {
      rhs[i] -= product[i * width + p]!;
      for (let j = 0; j < p; j++) a[i * p + j] -= 0.5 * (product[i * width + j]! + product[j * width + i]!);
    }
  }

  // λ as a lower bound of the scale: with no contrasts in the data at all (one
  // cell per round) the unpenalized complement is 0, and its floor must not be.
  let maxDiagonal = lambda;
  for (let i = 0; i < p; i++) maxDiagonal = Math.max(maxDiagonal, a[i * p + i]!);
  const unpenalized = Float64Array.from(a);
  for (let i = 0; i < p; i++) {
    unpenalized[i * p + i] += UNPENALIZED_FLOOR * maxDiagonal;
    a[i * p + i] += lambda;
  }
  const l = cholesky(a, p);
  const beta = choleskySolve(l, p, rhs);
  const betaCovarianceScale = choleskyInverse(l, p);
  const unpenalizedCovarianceScale = choleskyInverse(cholesky(unpenalized, p), p);
  const gamma = new Float64Array(q);
  for (let k = 0; k < q; k++) {
    let v = zt[k * width + p]!;
    for (let j = 0; j < p; j++) v -= zt[k * width + j]! * beta[j]!;
    gamma[k] = v;
  }

  // Residuals: the spread inside cells plus the misfit of the cell means.
  const S = d.stages;
  const B = S - 1;
  const fitted = new Float64Array(d.cellCount);
  for (let c = 0; c < d.cellCount; c++) {
    let f = 0;
    for (let s = 0; s < S; s++) f += beta[d.cellMiners[c * S + s]!]!;
    for (let b = 0; b < B; b++) {
      const k = d.cellPairs[c * B + b]!;
      if (k >= 0) f += gamma[k]!;
    }
    fitted[c] = f;
  }
  makeDemean(d)(fitted);
  let rss = d.withinCellSumSq;
  for (let c = 0; c < d.cellCount; c++) rss += d.cellWeight[c]! * (ne.y[c]! - fitted[c]!) ** 2;

  // Effective parameters tr(H) = Σ_j (1 − λ_j·[A⁻¹]_jj). Exact for β; for γ
  // [A⁻¹]_kk ≥ 1/A_kk, so 1/A_kk over-counts the parameters a little and
  // errs towards a larger residual variance, i.e. towards fewer flags.
  let traceS = 0;
  for (let i = 0; i < p; i++) traceS += betaCovarianceScale[i * p + i]!;
  let effectiveParameters = p - lambda * traceS;
  for (let k = 0; k < q; k++) effectiveParameters += 1 - interactionLambda / ne.gammaDiagonal[k]!;
  const dof = Math.max(1, d.observations - d.rounds - effectiveParameters);
  return {
    beta,
    gamma,
    betaCovarianceScale,
    unpenalizedCovarianceScale,
    residualVariance: rss / dof,
    effectiveParameters,
  };
}
