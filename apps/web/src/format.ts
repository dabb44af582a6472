/** Formatting shared by the pages: byte counts and token amounts. */
import type { PathSummary } from '@train-at-home/protocol';
import type { PeerPathStats } from '@train-at-home/swarm';

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 ** 2) return `${(n / 1024).toFixed(1)} KiB`;
  if (n < 1024 ** 3) return `${(n / 1024 ** 2).toFixed(1)} MiB`;
  return `${(n / 1024 ** 3).toFixed(2)} GiB`;
}

/** An arithmetic rate given in TFLOP/s, in the unit that reads best: 10.6 TFLOP/s, 84.2 GFLOP/s, 0.31 GFLOP/s. */
export function flops(tflops: number): string {
  if (!Number.isFinite(tflops) || tflops < 0) return '—';
  if (tflops >= 1) return `${tflops.toFixed(1)} TFLOP/s`;
  const g = tflops * 1000;
  return `${g >= 10 ? g.toFixed(1) : g.toPrecision(2)} GFLOP/s`;
}

/** Base units per token (10^9, as rao are to TAO). */
export const BASE_UNITS_PER_TOKEN = 10n ** 9n;

/**
 * A decimal string of base units in whole tokens, to at most `decimals` decimals
 * (truncated: never shows more than was paid; 9 shows every base unit).
 */
export function tokens(baseUnits: string, decimals = 4): string {
  const units = BigInt(baseUnits);
  const whole = units / BASE_UNITS_PER_TOKEN;
  const fraction = (units % BASE_UNITS_PER_TOKEN).toString().padStart(9, '0').slice(0, decimals).replace(/0+$/, '');
  return fraction ? `${whole}.${fraction}` : `${whole}`;
}

/** A long key or address as its first and last few characters. */
export function short(id: string, keep = 6): string {
  return id.length > 2 * keep + 1 ? `${id.slice(0, keep)}…${id.slice(-keep)}` : id;
}

/**
 * A miner's id as people read it on every page (Train, Rewards, Dashboard) and in miners' logs:
 * the first 8 hex digits of its public key, without 0x (the full key is in the tooltip).
 */
export function minerLabel(id: string): string {
  const hex = id.replace(/^0x/i, '').toLowerCase();
  return `${hex.slice(0, 8)}…`;
}

/**
 * An amount of the run's reward in its unit, "reward tokens" (10^9 base units each): never
 * plain "tokens", which on these pages means the training text's tokens.
 */
export function rewardTokens(baseUnits: string, decimals = 4): string {
  return `${tokens(baseUnits, decimals)} reward token${BigInt(baseUnits) === BASE_UNITS_PER_TOKEN ? '' : 's'}`;
}

/** How a pair's bytes travel, in words: straight between the two, through the operator's TURN server, or through the coordinator. */
export function pathLabel(path: PeerPathStats['path'], relayProtocol?: string): string {
  if (path === 'turn') return relayProtocol ? `TURN (${relayProtocol})` : 'TURN';
  if (path === 'coordinator') return 'coordinator relay';
  if (path === 'unreachable') return 'no path (its last connection attempt failed)';
  return path;
}

/** A miner's paths, summed per path: "2 direct, 3.1 MB · 1 TURN, 420 kB". */
export function pathsSummary(paths: PathSummary | undefined): string {
  const parts = (['direct', 'turn', 'coordinator'] as const).flatMap((p) => (paths?.[p] ? [`${paths[p].peers} ${pathLabel(p)}, ${bytes(paths[p].bytes)}`] : []));
  return parts.length ? parts.join(' · ') : '—';
}
