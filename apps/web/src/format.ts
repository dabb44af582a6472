/** Formatting shared by the pages: byte counts and token amounts. */
import { TRAFFIC_KINDS, trafficBytes, type PathSummary, type Traffic, type TrafficKind } from '@train-at-home/protocol';
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

/** What each kind of traffic is called on the pages. */
export const TRAFFIC_WORDS: Record<TrafficKind, string> = {
  activation: 'activations',
  gradient: 'gradients',
  merge: 'merges',
  audit: 'audits',
  checkpoint: 'checkpoints',
  data: 'training data',
  coordinator: 'coordinator',
};

/**
 * Traffic by kind, the kinds that moved anything: "activations 1.2 MiB (3.1 B/token) · merges …", per trained token
 * where tokens were trained, else sent / received.
 */
export function trafficByKind(t: Traffic, tokens?: number): Array<{ kind: TrafficKind; text: string }> {
  return TRAFFIC_KINDS.filter((k) => t[k].sent + t[k].received > 0).map((k) => {
    const both = t[k].sent + t[k].received;
    const per = tokens ? ` (${perToken(both / tokens)})` : '';
    return { kind: k, text: `${TRAFFIC_WORDS[k]} ${bytes(t[k].sent)} sent / ${bytes(t[k].received)} received${per}` };
  });
}

/** Bytes per token as people read it: 20 B/token, 0.35 B/token, 2.9 KiB/token. */
export function perToken(n: number): string {
  if (!Number.isFinite(n)) return '—';
  if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB/token`;
  return `${n >= 10 ? n.toFixed(0) : n.toPrecision(2)} B/token`;
}

/** All kinds together, per trained token (undefined before any token). */
export function totalPerToken(t: Traffic, tokens: number): string | undefined {
  return tokens > 0 ? perToken(trafficBytes(t) / tokens) : undefined;
}
