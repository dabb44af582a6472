/**
 * What the page reads from the coordinator's rewards routes (docs/rewards-api.md):
 * an address's balance with Merkle proofs, and its past claims. Linking and
 * claiming go through the shared client (packages/swarm rewards-client.ts),
 * the same code the Node miner uses.
 */
import { RewardsApiError, type ClaimReceipt } from '@train-at-home/swarm';

export interface EpochRewards {
  runId: number;
  epoch: number;
  /** Base units, decimal strings. */
  settled: string;
  claimed: string;
  claimable: string;
  /** The epoch's Merkle root and the proof of the leaf [address, settled]. */
  root: string;
  proof: string[];
}

export interface Rewards {
  address: string;
  /** Miner ids linked to this address. */
  miners: string[];
  totals: { settled: string; claimed: string; claimable: string };
  epochs: EpochRewards[];
}

/** When the next epoch settles: after its window (it and the holdEpochs after it) has ended and its rounds' audits are done. */
export interface Schedule {
  epochMs: number;
  holdEpochs: number;
  settleAfterMs: number;
  nextSettlement: { epoch: number; notBefore: string };
}

async function get<T>(path: string): Promise<T> {
  const res = await fetch(path);
  const json = (await res.json().catch(() => ({}))) as { error?: string; message?: string };
  if (!res.ok) throw new RewardsApiError(json.error ?? `HTTP_${res.status}`, json.message ?? res.statusText, res.status);
  return json as T;
}

export const rewardsApi = {
  // The newest 500 epochs (the route's largest page); the totals cover them all.
  rewards: (address: string) => get<Rewards>(`/api/rewards/${encodeURIComponent(address)}?limit=500`),
  schedule: () => get<Schedule>('/api/epochs?limit=1'),
  claims: (address: string) => get<{ claims: ClaimReceipt[] }>(`/api/rewards/${encodeURIComponent(address)}/claims`),
};

/** A refusal as a sentence for the page: the coordinator's code and message, and when to try again. */
export function describeError(e: unknown): string {
  if (e instanceof RewardsApiError) {
    const retry = e.retryAfterMs ? ` Try again in ${Math.ceil(e.retryAfterMs / 1000)} s.` : '';
    return `${e.message}.${retry}`;
  }
  return (e as Error)?.message ?? String(e);
}
