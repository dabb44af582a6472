import { TRAFFIC_KINDS, emptyTraffic, saneTraffic, trafficBytes, trafficSince, type Traffic, type TrafficKind } from '@train-at-home/protocol';

/** Each miner's byte counters by kind and the tokens it trained, as its latest heartbeat told the coordinator. */
export type TrafficReading = Map<string, { traffic: Traffic; tokens: number }>;

export function readTraffic(live: ReadonlyMap<string, { traffic?: unknown; trainedTokens?: number }>): TrafficReading {
  return new Map([...live].filter(([, r]) => r.traffic).map(([id, r]) => [id, { traffic: saneTraffic(r.traffic), tokens: r.trainedTokens ?? 0 }]));
}

const round = (x: number): number => +x.toFixed(2);

/**
 * Per miner, what it moved per token it trained between two readings (from its start when `start` is absent), by
 * kind and in all, against its activations and gradients; and their means: the figures every swarm benchmark reports.
 */
export function bytesPerToken(end: TrafficReading, start: TrafficReading | undefined, stageOf: ReadonlyMap<string, number>) {
  const perMiner = [...end]
    .map(([id, e]) => {
      const s = start ? start.get(id) : { traffic: emptyTraffic(), tokens: 0 };
      const tokens = e.tokens - (s?.tokens ?? 0);
      if (!s || tokens <= 0) return undefined;
      const moved = trafficSince(e.traffic, s.traffic);
      const byKind = Object.fromEntries(TRAFFIC_KINDS.map((k) => [k, round((moved[k].sent + moved[k].received) / tokens)])) as Record<TrafficKind, number>;
      const total = trafficBytes(moved) / tokens;
      const boundary = trafficBytes(moved, ['activation', 'gradient']) / tokens;
      return { stage: stageOf.get(id) ?? -1, tokens, bytesPerToken: byKind, totalBytesPerToken: round(total), activationBytesPerToken: round(boundary), totalToActivation: boundary > 0 ? round(total / boundary) : null };
    })
    .filter((m) => m !== undefined)
    .sort((a, b) => a.stage - b.stage);
  const mean = (xs: number[]): number => round(xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
  return {
    totalBytesPerToken: mean(perMiner.map((m) => m.totalBytesPerToken)),
    activationBytesPerToken: mean(perMiner.map((m) => m.activationBytesPerToken)),
    mergeBytesPerToken: mean(perMiner.map((m) => m.bytesPerToken.merge)),
    auditBytesPerToken: mean(perMiner.map((m) => m.bytesPerToken.audit)),
    maxTotalToActivation: Math.max(0, ...perMiner.map((m) => m.totalToActivation ?? 0)),
    perMinerBytesPerToken: perMiner,
  };
}

/** One line per miner: its stage, bytes per trained token in all and by kind. */
export function printBytesPerToken(b: ReturnType<typeof bytesPerToken>): void {
  for (const m of b.perMinerBytesPerToken) {
    console.log(`  miner on stage ${m.stage}: ${m.totalBytesPerToken} B per trained token in all (${m.totalToActivation ?? '—'}x its activations and gradients): ${TRAFFIC_KINDS.filter((k) => m.bytesPerToken[k] > 0).map((k) => `${k} ${m.bytesPerToken[k]}`).join(', ')}`);
  }
}
