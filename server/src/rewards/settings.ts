import { isRewardsDomain } from '@train-at-home/protocol';
import { ledgerPayoutSink, type PayoutSink } from '../ledger/claims';

export interface RateLimit {
  /** Requests allowed per window, per key (an IP, or an address), per route. */
  max: number;
  timeWindowMs: number;
}

/** The coordinator's settings for payout links and claims (not the run's: they may change between restarts). */
export interface RewardsSettings {
  /** Named in every message a wallet signs; a message naming another domain is refused. */
  domain: string;
  /** How long a challenge (its nonce) can be used. */
  challengeTtlMs: number;
  /** Challenge, link and claim are each limited per IP and per address. */
  rateLimit: { perIp: RateLimit; perAddress: RateLimit };
  payoutSink: PayoutSink;
  /** The clock for nonces' expiry (tests move it). */
  now: () => number;
}

export type RewardsOptions = Partial<Omit<RewardsSettings, 'rateLimit'>> & { rateLimit?: Partial<RewardsSettings['rateLimit']> };

export const DEFAULT_REWARDS: RewardsSettings = {
  domain: 'localhost',
  challengeTtlMs: 5 * 60_000,
  // A person links or claims a few times a day; a tab links once per start. Generous still, for
  // shared IPs (a household, a classroom) and wallets that retry.
  rateLimit: { perIp: { max: 60, timeWindowMs: 60_000 }, perAddress: { max: 20, timeWindowMs: 60_000 } },
  payoutSink: ledgerPayoutSink,
  now: () => Date.now(),
};

export class RewardsConfigError extends Error {
  override name = 'RewardsConfigError';
}

export function rewardsSettings(options: RewardsOptions = {}): RewardsSettings {
  const settings: RewardsSettings = {
    ...DEFAULT_REWARDS,
    ...options,
    domain: (options.domain ?? DEFAULT_REWARDS.domain).toLowerCase(),
    rateLimit: { ...DEFAULT_REWARDS.rateLimit, ...options.rateLimit },
  };
  if (!isRewardsDomain(settings.domain)) throw new RewardsConfigError(`domain "${settings.domain}" is not a host name (with a port if any)`);
  if (!Number.isSafeInteger(settings.challengeTtlMs) || settings.challengeTtlMs < 1000) throw new RewardsConfigError('challengeTtlMs must be an integer ≥ 1000');
  for (const [name, limit] of Object.entries(settings.rateLimit)) {
    if (!Number.isSafeInteger(limit.max) || limit.max < 1 || !Number.isSafeInteger(limit.timeWindowMs) || limit.timeWindowMs < 1) {
      throw new RewardsConfigError(`rateLimit.${name} needs positive integers max and timeWindowMs`);
    }
  }
  return settings;
}
