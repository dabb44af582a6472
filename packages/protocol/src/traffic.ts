/**
 * What a miner moves, by kind: the pipeline's boundary tensors (activations forward, gradients back), the merge's
 * all-reduce partitions, audit answers (round records and spot-checked payloads), checkpoints (uploaded after a
 * merge, downloaded when a stage is taken), the training data, and the coordinator's own messages. Peer bytes
 * are counted as framed (headers included), whether they went direct, through TURN or through the coordinator's relay.
 */
export const TRAFFIC_KINDS = ['activation', 'gradient', 'merge', 'audit', 'checkpoint', 'data', 'coordinator'] as const;
export type TrafficKind = (typeof TRAFFIC_KINDS)[number];
export type Traffic = Record<TrafficKind, { sent: number; received: number }>;

export function emptyTraffic(): Traffic {
  return Object.fromEntries(TRAFFIC_KINDS.map((k) => [k, { sent: 0, received: 0 }])) as Traffic;
}

/** Bytes both ways, summed over the kinds given (all by default). */
export function trafficBytes(t: Traffic, kinds: readonly TrafficKind[] = TRAFFIC_KINDS): number {
  return kinds.reduce((n, k) => n + t[k].sent + t[k].received, 0);
}

/** Per kind, the difference `later − earlier` of two readings of one meter. */
export function trafficSince(later: Traffic, earlier: Traffic): Traffic {
  const out = emptyTraffic();
  for (const k of TRAFFIC_KINDS) out[k] = { sent: later[k].sent - earlier[k].sent, received: later[k].received - earlier[k].received };
  return out;
}

const count = (x: unknown): number => (typeof x === 'number' && Number.isSafeInteger(x) && x >= 0 ? x : 0);

/** Counters read from elsewhere (another process's report, a dashboard update): a kind missing or not a byte count is 0. */
export function saneTraffic(x: unknown): Traffic {
  const out = emptyTraffic();
  if (typeof x !== 'object' || x === null) return out;
  for (const k of TRAFFIC_KINDS) {
    const v = (x as Record<string, { sent?: unknown; received?: unknown } | undefined>)[k];
    out[k] = { sent: count(v?.sent), received: count(v?.received) };
  }
  return out;
}
