/**
 * A miner's score for one epoch: the work it did, scaled by how much that
 * work can be trusted. The score feeds splitEmission (emission.ts).
 *
 * - work: what it was asked for and did (verified microbatches, say);
 *   the caller decides the unit, the split only uses ratios.
 * - quality: the weaker of CLASP's verdict (clasp-verdict.ts) and the spot
 *   checks, each in [0, 1]: a miner must pass both, so the minimum, not a
 *   mean that would let a good loss record buy back a failed replay.
 * - flags (a failed spot check, a disputed merge, a wrong all-reduce
 *   partition) are evidence of misbehaviour, not of noise: any flag sets
 *   quality to 0 for the epoch.
 */

import { IncentivesError } from './errors';

export interface MinerEvidence {
  minerId: string;
  /** Where its pay goes; several miners may share one. */
  account: string;
  /** null for a miner that held no stage this epoch (it still may have done work, e.g. audits). */
  stage: number | null;
  work: number;
  claspQuality: number;
  spotQuality: number;
  flags: Array<{ kind: string; reason: string }>;
}

export interface MinerScore {
  minerId: string;
  account: string;
  stage: number | null;
  work: number;
  /** In [0, 1]. */
  quality: number;
  /** work × quality. */
  score: number;
  flagged: boolean;
}

export function scoreMiners(evidence: MinerEvidence[]): MinerScore[] {
  if (!Array.isArray(evidence)) throw new IncentivesError('BAD_EVIDENCE', 'evidence must be an array');
  const seen = new Set<string>();
  // Check all evidence first: one bad entry must not leave a partial ranking.
  for (const [i, e] of evidence.entries()) {
    if (typeof e.minerId !== 'string' || e.minerId.length === 0) {
      throw new IncentivesError('BAD_EVIDENCE', `evidence ${i} has no minerId`);
    }
    if (seen.has(e.minerId)) throw new IncentivesError('DUPLICATE_MINER', `miner ${e.minerId} appears twice`);
    seen.add(e.minerId);
    if (typeof e.account !== 'string' || e.account.length === 0) {
      throw new IncentivesError('BAD_ACCOUNT', `miner ${e.minerId} has no account`);
    }
    if (!(Number.isFinite(e.work) && e.work >= 0)) {
      throw new IncentivesError('BAD_EVIDENCE', `miner ${e.minerId} has work ${e.work}`);
    }
    // NaN would survive the clamp as NaN and poison the split: reject it.
    if (!Number.isFinite(e.claspQuality) || !Number.isFinite(e.spotQuality)) {
      throw new IncentivesError('BAD_EVIDENCE', `miner ${e.minerId} has a non-finite quality`);
    }
    if (!Array.isArray(e.flags)) throw new IncentivesError('BAD_EVIDENCE', `miner ${e.minerId} has no flag list`);
  }

  const scores = evidence.map((e): MinerScore => {
    const flagged = e.flags.length > 0;
    const quality = flagged ? 0 : clamp01(Math.min(e.claspQuality, e.spotQuality));
    return {
      minerId: e.minerId,
      account: e.account,
      stage: e.stage,
      work: e.work,
      quality,
      score: e.work * quality,
      flagged,
    };
  });
  return scores.sort((a, b) => b.score - a.score || (a.minerId < b.minerId ? -1 : a.minerId > b.minerId ? 1 : 0));
}

function clamp01(x: number): number {
  return Math.min(1, Math.max(0, x));
}
