/**
 * From CLASP's estimates to a verdict per miner: harmful or not, and a
 * quality in [0, 1] that scales its pay.
 *
 * A miner is harmful only when four things hold at once:
 * - its share (main effect plus half its pair effects) raises the loss by
 *   more than minEffect nats: smaller harm is not worth a dispute;
 * - its main effect is minZ standard errors above its peers: not noise;
 * - it ran at least minObservations microbatches;
 * - it had at least minPartners partners on each adjacent side. A miner that
 *   always ran with the same partner is one unit with it to the data: the
 *   ridge splits their joint effect between them, and flagging either would
 *   punish the honest one. Such a miner is never flagged; the cure is
 *   routing, not statistics (rotate partners at merges);
 * - the data alone separate it: its unpenalized standard error is at most
 *   MAX_PRIOR_INFLATION times its standard error. Enough partners is not
 *   enough: when partners rotate in lock-step at every boundary, a miner at
 *   stage 0 can be confounded with a set at stage 2 though it met four
 *   partners. There too the ridge prior, not the data, decides who is blamed,
 *   and the z of a large effect would look convincing.
 *
 * Quality falls linearly from 1 to 0 as the evidence grows from "not above
 * its peers" (z < 2 or share < minEffect/2) to "harmful"; it is 0 exactly
 * when harmful, and 1 when the evidence cannot single the miner out.
 */

import type { ClaspResult } from './clasp';
import { IncentivesError } from './errors';

export interface ClaspVerdict {
  minerId: string;
  stage: number;
  harmful: boolean;
  /** effect / stdError. */
  z: number;
  /** In [0, 1]: the factor its pay is multiplied by. */
  quality: number;
  reason?: string;
}

export interface VerdictOptions {
  /** nats; default 0.05. */
  minEffect?: number;
  /** default 4. */
  minZ?: number;
  /** default 20. */
  minObservations?: number;
  /** default 2. */
  minPartners?: number;
}

export const VERDICT_DEFAULTS = { minEffect: 0.05, minZ: 4, minObservations: 20, minPartners: 2 } as const;

/** Below this z a miner is "not significantly above its peers". */
const SIGNIFICANT_Z = 2;
/**
 * unpenalizedStdError / stdError above which the data cannot separate the
 * miner. Where the data do, the ratio is 1 + O(λ / observations); where they
 * do not, it is in the hundreds: any threshold between works.
 */
export const MAX_PRIOR_INFLATION = 2;

export function claspVerdicts(result: ClaspResult, options: VerdictOptions = {}): ClaspVerdict[] {
  const minEffect = options.minEffect ?? VERDICT_DEFAULTS.minEffect;
  const minZ = options.minZ ?? VERDICT_DEFAULTS.minZ;
  const minObservations = options.minObservations ?? VERDICT_DEFAULTS.minObservations;
  const minPartners = options.minPartners ?? VERDICT_DEFAULTS.minPartners;
  if (!(Number.isFinite(minEffect) && minEffect > 0)) {
    throw new IncentivesError('BAD_OPTION', `minEffect must be finite and > 0, got ${minEffect}`);
  }
  // The quality ramp runs from z = 2 to z = minZ: it needs minZ above 2.
  if (!(Number.isFinite(minZ) && minZ > SIGNIFICANT_Z)) {
    throw new IncentivesError('BAD_OPTION', `minZ must be finite and > ${SIGNIFICANT_Z}, got ${minZ}`);
  }
  if (!(minObservations >= 0) || !(minPartners >= 0)) {
    throw new IncentivesError('BAD_OPTION', 'minObservations and minPartners must be ≥ 0');
  }

  return result.effects.map((e) => {
    const z = zScore(e.effect, e.stdError);
    const base = { minerId: e.minerId, stage: e.stage, z };
    if (e.partners < minPartners) {
      return {
        ...base,
        harmful: false,
        quality: 1,
        reason:
          `inseparable: ${e.partners} partner(s) on an adjacent stage (< ${minPartners}); ` +
          'its effect cannot be told from its partner’s, so it is never flagged',
      };
    }
    if (e.unpenalizedStdError !== undefined && !(e.unpenalizedStdError <= MAX_PRIOR_INFLATION * e.stdError)) {
      return {
        ...base,
        harmful: false,
        quality: 1,
        reason:
          'inseparable: its pathways cannot be told from those of a set of peers and partners ' +
          `(standard error without the ridge ${e.unpenalizedStdError.toPrecision(3)} against ` +
          `${e.stdError.toPrecision(3)} nats), so it is never flagged`,
      };
    }
    if (e.observations < minObservations) {
      return {
        ...base,
        harmful: false,
        quality: 1,
        reason: `too few microbatches to judge: ${e.observations} < ${minObservations}`,
      };
    }
    if (e.share > minEffect && z > minZ) {
      return {
        ...base,
        harmful: true,
        quality: 0,
        reason: `raises loss by ${e.share.toFixed(3)} nats against its stage peers (z = ${z.toFixed(1)})`,
      };
    }
    // Either ramp reaching 1 is enough: small, or not significant.
    const bySize = clamp01((minEffect - e.share) / (minEffect / 2));
    const bySignificance = clamp01((minZ - z) / (minZ - SIGNIFICANT_Z));
    return { ...base, harmful: false, quality: Math.max(bySize, bySignificance) };
  });
}

/** A zero standard error (a noiseless fit) makes any nonzero effect certain. */
function zScore(effect: number, stdError: number): number {
  if (stdError > 0) return effect / stdError;
  return effect > 0 ? Infinity : effect < 0 ? -Infinity : 0;
}

function clamp01(x: number): number {
  return Math.min(1, Math.max(0, x));
}
