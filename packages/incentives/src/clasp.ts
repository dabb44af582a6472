/**
 * CLASP: Contribution Loss Assessment via Sampling of Pathways.
 *
 * Each microbatch crosses one miner per stage (its pathway) and ends in a
 * loss. Nobody can measure one miner's output quality directly, but every
 * miner sits on many pathways with different partners, so a regression of
 * losses on "who was on the pathway" separates them:
 *
 *   loss_i = α_round(i) + Σ_s β[pathway_i[s]] + Σ_b γ[pathway_i[b], pathway_i[b+1]] + noise
 *
 * - α, one per round, absorbs the falling loss of training: a miner is only
 *   compared with the microbatches of its own round, so joining late (when
 *   losses are low) earns nothing and joining early costs nothing.
 * - β, one per miner and stage, ridge penalty λ. Within a stage only
 *   differences are identified (adding δ to every miner of a stage and −δ to
 *   every α fits equally), so each miner is reported against the
 *   observation-weighted mean of its stage: pathways through it against
 *   pathways through its stage peers.
 * - γ, one per adjacent-stage pair seen ≥ minPairObservations times, with a
 *   stronger penalty λγ: two miners that only misbehave together. Its share
 *   of the blame is split equally (the Shapley value of a two-player
 *   interaction), weighted by how often the pair ran among the miner's
 *   microbatches.
 *
 * What "main effect" means once pairs are modelled: shifting every pair of
 * miner a at one boundary by −δ and β_a by +δ fits the losses identically,
 * so no amount of data separates a miner's main effect from the average of
 * its pair effects. The penalties decide, and λγ > λ makes main effects
 * take that average: β_a is the miner's whole average effect on its own
 * pathways (main effects first), and γ only the part no miner's main effect
 * explains, which averages to about zero over each miner's pathways. So a
 * planted "a and b are bad only together" shows up mostly in β_a and β_b
 * (each charged the pair's excess on its own pathways), not as ½γ each;
 * splitting it as a sparse interaction would need a sparsity prior on γ
 * (L1, or select-then-refit), which this model does not make.
 *
 * The solve is in clasp-solve.ts (exact, by blocks); the verdicts drawn from
 * it in clasp-verdict.ts.
 */

import { buildDesign, type PathwayObservation } from './clasp-design';
import { fitClasp } from './clasp-solve';
import { IncentivesError } from './errors';

export type { PathwayObservation } from './clasp-design';

export interface ClaspOptions {
  /** Ridge penalty on main effects (default 1): only keeps the problem well posed. */
  lambda?: number;
  /** Model adjacent-stage pair effects (default true). */
  interactions?: boolean;
  /** Ridge penalty on pair effects (default 10): a pair must earn its effect. */
  interactionLambda?: number;
  /** Pairs seen fewer times get no parameter of their own (default 5). */
  minPairObservations?: number;
}

export interface MinerEffect {
  minerId: string;
  stage: number;
  observations: number;
  /**
   * Distinct adjacent-stage miners it shared pathways with. For a middle
   * stage, the smaller of its two sides: one fixed partner upstream (or
   * downstream) is enough to make the two inseparable.
   */
  partners: number;
  /** nats, relative to its stage peers; > 0 raises loss */
  effect: number;
  /** nats: σ·√(cᵀ·Cov·c) for the contrast c = miner − weighted stage mean. */
  stdError: number;
  /**
   * nats: as stdError without the ridge prior on main effects. Close to
   * stdError when the data separate the miner from its peers and partners;
   * orders of magnitude larger when they cannot (a fixed partner, partners
   * that always rotate together), where the prior alone split the blame.
   * Always set by clasp(); optional so hand-built results stay valid (the
   * verdict then has only the partner count to go on).
   */
  unpenalizedStdError?: number;
  /** effect + ½ Σ over its pairs of γ·(pair observations / its observations), nats. */
  share: number;
}

/** An adjacent-stage pair's own effect γ, beyond its two miners' main effects. */
export interface PairEffect {
  /** Stage of `up`; `down` ran the next stage. */
  stage: number;
  up: string;
  down: string;
  observations: number;
  /** nats; > 0 raises loss. */
  effect: number;
}

export interface ClaspResult {
  /** Sorted by stage, then minerId. */
  effects: MinerEffect[];
  /**
   * The modelled pairs (none when interactions are off), sorted by stage, up,
   * down. Always set by clasp(); optional so hand-built results stay valid.
   */
  interactions?: PairEffect[];
  /** nats: the noise left after rounds, miners and pairs. */
  residualStd: number;
  observations: number;
  rounds: number;
}

export const CLASP_DEFAULTS = {
  lambda: 1,
  interactions: true,
  interactionLambda: 10,
  minPairObservations: 5,
} as const;

export function clasp(observations: PathwayObservation[], options: ClaspOptions = {}): ClaspResult {
  const lambda = options.lambda ?? CLASP_DEFAULTS.lambda;
  const interactions = options.interactions ?? CLASP_DEFAULTS.interactions;
  const interactionLambda = options.interactionLambda ?? CLASP_DEFAULTS.interactionLambda;
  const minPairObservations = options.minPairObservations ?? CLASP_DEFAULTS.minPairObservations;
  // λ > 0 is required, not a nicety: the stage means are not identified.
  if (!(Number.isFinite(lambda) && lambda > 0)) {
    throw new IncentivesError('BAD_OPTION', `lambda must be finite and > 0, got ${lambda}`);
  }
  if (!(Number.isFinite(interactionLambda) && interactionLambda > 0)) {
    throw new IncentivesError('BAD_OPTION', `interactionLambda must be finite and > 0, got ${interactionLambda}`);
  }
  if (!(Number.isInteger(minPairObservations) && minPairObservations >= 1)) {
    throw new IncentivesError('BAD_OPTION', `minPairObservations must be an integer ≥ 1, got ${minPairObservations}`);
  }

  const design = buildDesign(observations, interactions, minPairObservations);
  const fit = fitClasp(design, lambda, interactionLambda);
  const p = design.miners.length;
  const sigma = Math.sqrt(fit.residualVariance);

  const effect = new Float64Array(p);
  const variance = new Float64Array(p);
  const unpenalizedVariance = new Float64Array(p);
  for (const [first, end] of design.stageRange) {
    // Weights of the stage mean: each miner's share of the stage's microbatches.
    const weight = new Float64Array(end - first);
    for (let j = first; j < end; j++) weight[j - first] = design.minerObservations[j]! / design.observations;
    let mean = 0;
    for (let j = first; j < end; j++) mean += weight[j - first]! * fit.beta[j]!;
    for (let m = first; m < end; m++) effect[m] = fit.beta[m]! - mean;
    contrastVariances(fit.betaCovarianceScale, p, first, weight, variance);
    contrastVariances(fit.unpenalizedCovarianceScale, p, first, weight, unpenalizedVariance);
  }

  const interactionShare = new Float64Array(p);
  design.pairs.forEach((pair, k) => {
    const half = 0.5 * fit.gamma[k]! * pair.observations;
    interactionShare[pair.up] += half / design.minerObservations[pair.up]!;
    interactionShare[pair.down] += half / design.minerObservations[pair.down]!;
  });

  const effects: MinerEffect[] = design.miners.map(({ minerId, stage }, m) => ({
    minerId,
    stage,
    observations: design.minerObservations[m]!,
    partners: design.partners[m]!,
    effect: effect[m]!,
    stdError: sigma * Math.sqrt(variance[m]!),
    unpenalizedStdError: sigma * Math.sqrt(unpenalizedVariance[m]!),
    share: effect[m]! + interactionShare[m]!,
  }));
  const pairEffects: PairEffect[] = design.pairs.map((pair, k) => ({
    stage: pair.boundary,
    up: design.miners[pair.up]!.minerId,
    down: design.miners[pair.down]!.minerId,
    observations: pair.observations,
    effect: fit.gamma[k]!,
  }));
  return { effects, interactions: pairEffects, residualStd: sigma, observations: design.observations, rounds: design.rounds };
}

/**
 * Var(β_m − wᵀβ)/σ² = C_mm − 2(C·w)_m + wᵀ·C·w for every miner m of one
 * stage (parameters first..first + w.length), written into out[m].
 */
function contrastVariances(cov: Float64Array, p: number, first: number, weight: Float64Array, out: Float64Array): void {
  const size = weight.length;
  const covW = new Float64Array(size);
  let wCovW = 0;
  for (let i = 0; i < size; i++) {
    let sum = 0;
    for (let j = 0; j < size; j++) sum += cov[(first + i) * p + first + j]! * weight[j]!;
    covW[i] = sum;
    wCovW += weight[i]! * sum;
  }
  for (let i = 0; i < size; i++) {
    const m = first + i;
    out[m] = Math.max(0, cov[m * p + m]! - 2 * covW[i]! + wCovW);
  }
}
