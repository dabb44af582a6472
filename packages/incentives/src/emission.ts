/**
 * One epoch's emission split in proportion to scores, in integer base units.
 *
 * Money never passes through a float. Scores are floats (work × quality), so
 * each is first turned into an exact integer weight, and from there on all
 * arithmetic is bigint:
 *
 *   w_i      = round(score_i · 2³²)            fixed point, 32 fractional bits
 *   amount_i = ⌊E · w_i / W⌋                   W = Σ w_i
 *   leftover = E − Σ amount_i                  < number of accounts
 *
 * The leftover goes one base unit each to the accounts with the largest
 * exact remainders E·w_i mod W (largest remainder method), ties broken by
 * account in code-unit order. So the payouts sum to E exactly, no account is
 * ever off by more than one unit from its exact share, and the result is the
 * same whatever order the scores arrive in: anyone can recompute it.
 *
 * 32 fractional bits: a score below 2⁻³³ counts as zero, and two scores
 * closer than 2⁻³² are paid alike; scores are microbatch counts times a
 * quality in [0, 1], so that resolution is far below anything that matters.
 */

import { IncentivesError } from './errors';

/** Fixed-point scale of score weights: 2³². */
export const SCORE_SCALE = 2 ** 32;

export interface Payout {
  account: string;
  /** Base units. */
  amount: bigint;
}

export interface EmissionSplit {
  /** Sorted by account (code-unit order); accounts that get 0 are left out. */
  payouts: Payout[];
  /** Σ amounts: the emission when any weight is positive, else 0n. */
  allocated: bigint;
}

/** Exact integer weight of a score; throws on anything that is not a finite score ≥ 0. */
export function scoreWeight(score: number): bigint {
  if (!Number.isFinite(score) || score < 0) {
    throw new IncentivesError('BAD_SCORE', `score must be finite and ≥ 0, got ${score}`);
  }
  const scaled = Math.round(score * SCORE_SCALE);
  // Scaling by a power of two is exact, so only overflow (scores above ~4e298) can fail.
  if (!Number.isFinite(scaled)) throw new IncentivesError('BAD_SCORE', `score too large to scale: ${score}`);
  return BigInt(scaled);
}

export function splitEmission(
  emission: bigint,
  scores: Array<{ account: string; score: number }>,
): EmissionSplit {
  if (typeof emission !== 'bigint' || emission < 0n) {
    throw new IncentivesError('BAD_EMISSION', `emission must be a bigint ≥ 0, got ${String(emission)}`);
  }
  if (!Array.isArray(scores)) throw new IncentivesError('BAD_SCORE', 'scores must be an array');
  // Check every entry before adding any: a bad one leaves no partial split.
  const weights = scores.map(({ account, score }, i) => {
    if (typeof account !== 'string' || account.length === 0) {
      throw new IncentivesError('BAD_ACCOUNT', `score ${i} has no account`);
    }
    return scoreWeight(score);
  });

  // Several miners may pay to one address; integer sums are exact in any order.
  const byAccount = new Map<string, bigint>();
  scores.forEach(({ account }, i) => byAccount.set(account, (byAccount.get(account) ?? 0n) + weights[i]!));
  const entries = [...byAccount]
    .filter(([, weight]) => weight > 0n)
    .map(([account, weight]) => ({ account, weight, amount: 0n, remainder: 0n }));
  const total = entries.reduce((sum, e) => sum + e.weight, 0n);
  if (total === 0n) return { payouts: [], allocated: 0n };

  let assigned = 0n;
  for (const e of entries) {
    const product = emission * e.weight;
    e.amount = product / total;
    e.remainder = product % total;
    assigned += e.amount;
  }
  // Each floor loses < 1 unit, so the leftover is below the number of accounts.
  const leftover = Number(emission - assigned);
  const byRemainder = [...entries].sort(
    (x, y) => (x.remainder > y.remainder ? -1 : x.remainder < y.remainder ? 1 : compareAccounts(x.account, y.account)),
  );
  for (let i = 0; i < leftover; i++) byRemainder[i]!.amount += 1n;

  const payouts = entries
    .filter((e) => e.amount > 0n)
    .sort((x, y) => compareAccounts(x.account, y.account))
    .map(({ account, amount }) => ({ account, amount }));
  const allocated = payouts.reduce((sum, x) => sum + x.amount, 0n);
  // The invariant the ledger relies on, checked rather than assumed.
  if (allocated !== emission) throw new IncentivesError('NUMERICAL', `allocated ${allocated} of ${emission}`);
  return { payouts, allocated };
}

/** Code-unit order, not locale order: the same on every machine. */
export function compareAccounts(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
