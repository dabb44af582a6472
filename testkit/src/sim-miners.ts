import { generateIdentity, PROTOCOL_VERSION, type Identity } from '@train-at-home/protocol';
import { StageMapView, register, restStageMap } from '@train-at-home/swarm';
import { io as connect, type Socket } from 'socket.io-client';
import type { Server } from 'socket.io';

/**
 * A simulated miner: a real client's connection, sr25519 registration and
 * stage-map view (the same StageMapView the miner uses), with no model. For
 * tests and benches of the coordinator under many miners.
 */
export interface SimMiner {
  socket: Socket;
  /** Its sr25519 key: the same one registers it again elsewhere. */
  identity: Identity;
  minerId: string;
  stage: number;
  view: StageMapView;
  /** The heartbeat interval the coordinator asked for. */
  heartbeatMs: number;
  /** Sends one heartbeat the way the client does; resolves with its round-trip time (ms). */
  heartbeat(): Promise<number>;
  close(): void;
}

/**
 * A load generator's simulated miners of one stage all hold the same view (the
 * same neighbourhood, the same deltas in the same order): with `shared`, each
 * stage's is kept once, each delta applied by the first socket that brings it
 * and recognised as already held (its number) by the others. Every socket
 * still receives and decodes every message; what is saved is N copies of an
 * O(N) map, which made the generator's memory grow as N² (bench:load).
 */
export class SharedStageViews {
  private readonly views = new Map<number, StageMapView>();
  constructor(private readonly url: string) {}

  /** The view of a stage's miners. */
  of(stage: number): StageMapView {
    let view = this.views.get(stage);
    if (!view) this.views.set(stage, (view = new StageMapView(restStageMap(this.url))));
    return view;
  }

  snapshot(view: StageMapView, m: unknown): void {
    const stages = (m as { stages?: Array<{ stage?: unknown; seq?: unknown }> } | null)?.stages;
    // Only a snapshot that moves some stage on: the others already hold it, or something newer.
    if (Array.isArray(stages) && stages.every((v) => typeof v?.seq === 'number' && typeof v.stage === 'number' && (view.seq(v.stage) ?? -1) >= v.seq)) return;
    view.snapshot(m);
  }

  delta(view: StageMapView, d: unknown): void {
    const { stage, seq } = (d ?? {}) as { stage?: unknown; seq?: unknown };
    if (typeof stage === 'number' && typeof seq === 'number' && (view.seq(stage) ?? Infinity) >= seq) return; // another socket brought it
    view.delta(d);
  }
}

export async function simMiner(url: string, identity: Identity = generateIdentity(), shared?: SharedStageViews): Promise<SimMiner> {
  const socket = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('connect_error', (e) => {
      socket.disconnect();
      reject(e);
    });
  });
  let view = shared ? undefined : new StageMapView(restStageMap(url));
  // Attached before registering: the snapshot comes right after the registration's answer. A shared view is known
  // once the stage is: what comes before is held until then.
  const early: Array<[string, unknown]> = [];
  const on = (event: 'stages' | 'stage-delta', m: unknown): void => {
    if (!view) return void early.push([event, m]);
    if (!shared) return event === 'stages' ? view.snapshot(m) : view.delta(m);
    if (event === 'stages') shared.snapshot(view, m);
    else shared.delta(view, m);
  };
  socket.on('stages', (m: unknown) => on('stages', m));
  socket.on('stage-delta', (d: unknown) => on('stage-delta', d));
  const { minerId, stage, heartbeatMs } = await register(socket, identity, { backend: 'wasm', tokensPerSec: 100 }).catch((e: unknown) => {
    socket.disconnect(); // not left connected, unregistered
    throw e;
  });
  if (!view) {
    view = shared!.of(stage);
    for (const [event, m] of early.splice(0)) on(event as 'stages', m);
  }
  let seq = 0;
  return {
    socket,
    identity,
    minerId,
    stage,
    view: view!,
    heartbeatMs: heartbeatMs ?? 2000,
    heartbeat: () =>
      new Promise((resolve) => {
        const t = performance.now();
        socket.emit('heartbeat', { v: PROTOCOL_VERSION, seq: seq++ }, () => resolve(performance.now() - t));
      }),
    close: () => socket.disconnect(),
  };
}

/** Registers `n` simulated miners, `concurrency` at a time; `took` collects each one's time from connecting to registered (ms). */
export async function simMiners(url: string, n: number, concurrency = 50, took?: number[]): Promise<SimMiner[]> {
  const out: SimMiner[] = [];
  const one = async (): Promise<SimMiner> => {
    const t = performance.now();
    const m = await simMiner(url);
    took?.push(performance.now() - t);
    return m;
  };
  for (let i = 0; i < n; i += concurrency) out.push(...(await Promise.all(Array.from({ length: Math.min(concurrency, n - i) }, one))));
  return out;
}

/** Counts every byte the coordinator's socket.io server writes to its connections (engine.io packets, every namespace). */
export function countSentBytes(io: Server): { bytes: number; packets: number } {
  const counter = { bytes: 0, packets: 0 };
  const watch = (conn: { on(event: 'packetCreate', fn: (p: { data?: unknown }) => void): void }): void =>
    conn.on('packetCreate', (p) => {
      counter.packets++;
      counter.bytes += 1 + (typeof p.data === 'string' ? Buffer.byteLength(p.data) : p.data instanceof Uint8Array ? p.data.byteLength : 0);
    });
  for (const s of io.of('/').sockets.values()) watch(s.conn);
  io.engine.on('connection', watch);
  return counter;
}
