import type { OutputComparison } from '@train-at-home/incentives';

export type CheckKind = 'forward' | 'backward' | 'loss';

/**
 * How far a miner's output may be from the validator's replay of it. Replays
 * are exact: the miner had taken no inner step since the weights the
 * validator holds (see spot-checks.ts), so the only honest differences are
 * floating-point ones: another backend's rounding, and the int8 codes it
 * flips (one step of 1/127 of a row's largest value). Measured on the same
 * backend (bench/spot-spread.ts, k = 0): cosine 1.0000, relative error
 * ≤ 3·10⁻⁴, loss within 3·10⁻⁶ nats. The bounds leave room for other
 * backends and sit far from the gentlest cheat measured there (noise of
 * 0.3 × RMS: cosine 0.958; a free-rider's delta cosine 0; a 0.9 × loss:
 * 0.3 nats).
 */
export const SPOT_THRESHOLDS = {
  forward: { minCosine: 0.99, minNormRatio: 0.97, maxNormRatio: 1.03, minDeltaCosine: 0.95 },
  backward: { minCosine: 0.99, minNormRatio: 0.97, maxNormRatio: 1.03 },
  /** The last stage's reported loss against the replayed one: within maxAbsolute + maxRelative × replayed (nats). */
  loss: { maxAbsolute: 0.01, maxRelative: 0.01 },
} as const;

/**
 * Beyond these a single failed check flags the miner: no float noise comes
 * near them (an exact replay measured cosine 1.0000), only a different
 * computation does. Between SPOT_THRESHOLDS and these, two failures are
 * needed (spot-checks.ts: FLAG_AFTER_FAILURES).
 */
export const GROSS = {
  minCosine: 0.9,
  normRatio: [0.8, 1.25],
  minDeltaCosine: 0.8,
  /** Loss: more than this many nats plus this share of the replayed loss apart. */
  lossAbsolute: 0.1,
  lossRelative: 0.05,
} as const;

/** Whether a failed check is far beyond any honest difference (see GROSS). */
export function gross(kind: CheckKind, m: Partial<OutputComparison> & { reported?: number; replayed?: number }): boolean {
  if (kind === 'loss') {
    const diff = Math.abs((m.reported ?? NaN) - (m.replayed ?? NaN));
    return !(diff <= GROSS.lossAbsolute + GROSS.lossRelative * Math.abs(m.replayed ?? 0));
  }
  const ratio = m.normRatio ?? NaN;
  return !((m.cosine ?? NaN) >= GROSS.minCosine) || !(ratio >= GROSS.normRatio[0] && ratio <= GROSS.normRatio[1]) || (m.deltaCosine !== undefined && !(m.deltaCosine >= GROSS.minDeltaCosine));
}

export interface Verdict {
  passed: boolean;
  /** A named reason when it did not. */
  reason?: string;
}

export function judge(kind: CheckKind, m: Partial<OutputComparison> & { reported?: number; replayed?: number }): Verdict {
  if (kind === 'loss') {
    const t = SPOT_THRESHOLDS.loss;
    const diff = (m.reported ?? NaN) - (m.replayed ?? NaN);
    if (!Number.isFinite(diff)) return { passed: false, reason: 'LOSS_MISREPORTED: no finite loss to compare' };
    if (Math.abs(diff) > t.maxAbsolute + t.maxRelative * Math.abs(m.replayed!)) {
      return { passed: false, reason: `LOSS_MISREPORTED: reported ${m.reported!.toFixed(4)}, the replay computes ${m.replayed!.toFixed(4)}` };
    }
    return { passed: true };
  }
  const t = kind === 'forward' ? SPOT_THRESHOLDS.forward : SPOT_THRESHOLDS.backward;
  const name = kind === 'forward' ? 'OUTPUT_MISMATCH' : 'GRADIENT_MISMATCH';
  // The miner's values are the replay's, every one (relative error 0): the stage's own computation. That includes two
  // all-zero vectors, which compareOutputs gives cosine 0 (no direction to agree on): an honest miner was flagged
  // OUTPUT_MISMATCH "cosine 0.000" with relError 0 and normRatio 0 so (adversarial.test.ts, a rehearsal of e587845).
  if (m.relError === 0) return { passed: true };
  const cosine = m.cosine ?? NaN;
  const ratio = m.normRatio ?? NaN;
  if (!(cosine >= t.minCosine)) return { passed: false, reason: `${name}: cosine ${cosine.toFixed(3)} with the replay (at least ${t.minCosine})` };
  if (!(ratio >= t.minNormRatio && ratio <= t.maxNormRatio)) return { passed: false, reason: `${name}: norm ${ratio.toFixed(3)}× the replay's` };
  if (kind === 'forward' && m.deltaCosine !== undefined && !(m.deltaCosine >= SPOT_THRESHOLDS.forward.minDeltaCosine)) {
    return { passed: false, reason: `${name}: what the stage added to its input has cosine ${m.deltaCosine.toFixed(3)} with the replay's (a stage that forwards its input unchanged)` };
  }
  return { passed: true };
}

/** The flag kind a failed check raises. */
export function flagKind(kind: CheckKind): 'OUTPUT_MISMATCH' | 'GRADIENT_MISMATCH' | 'LOSS_MISREPORTED' {
  return kind === 'forward' ? 'OUTPUT_MISMATCH' : kind === 'backward' ? 'GRADIENT_MISMATCH' : 'LOSS_MISREPORTED';
}
