import { generateIdentity, PROTOCOL_VERSION } from '@train-at-home/protocol';
import { StageMapView, register, restStageMap } from '@train-at-home/swarm';
import { io as connect, type Socket } from 'socket.io-client';
import type { Server } from 'socket.io';
import { afterEach } from 'vitest';
import { buildApp, type App, type AppOptions } from '../app';
import { testDatabase } from '../db/test-database';

/**
 * A simulated miner: a real client's connection, sr25519 registration and
 * stage-map view (the same StageMapView the miner uses), with no model. For
 * tests and benches of the coordinator under many miners.
 */
export interface SimMiner {
  socket: Socket;
  minerId: string;
  stage: number;
  view: StageMapView;
  /** Sends one heartbeat the way the client does; resolves with its round-trip time (ms). */
  heartbeat(): Promise<number>;
  close(): void;
}

export async function simMiner(url: string): Promise<SimMiner> {
  const socket = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('connect_error', reject);
  });
  const view = new StageMapView(restStageMap(url));
  // Attached before registering: the snapshot comes right after the registration's answer.
  socket.on('stages', (m: unknown) => view.snapshot(m));
  socket.on('stage-delta', (d: unknown) => view.delta(d));
  const { minerId, stage } = await register(socket, generateIdentity(), { backend: 'wasm', tokensPerSec: 100 });
  let seq = 0;
  return {
    socket,
    minerId,
    stage,
    view,
    heartbeat: () =>
      new Promise((resolve) => {
        const t = performance.now();
        socket.emit('heartbeat', { v: PROTOCOL_VERSION, seq: seq++ }, () => resolve(performance.now() - t));
      }),
    close: () => socket.disconnect(),
  };
}

/** Registers `n` simulated miners, `concurrency` at a time. */
export async function simMiners(url: string, n: number, concurrency = 50): Promise<SimMiner[]> {
  const out: SimMiner[] = [];
  for (let i = 0; i < n; i += concurrency) out.push(...(await Promise.all(Array.from({ length: Math.min(concurrency, n - i) }, () => simMiner(url)))));
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

/**
 * A test's coordinator (`tiny`, on the test database, listening on a free
 * loopback port) and its simulated miners, all closed after each test.
 * Simulated miners send no heartbeats unless told: silence is 10 minutes.
 */
export function simHarness() {
  const h = {
    app: undefined as App | undefined,
    miners: [] as SimMiner[],
    async start(name: string, stages = 3, options: Omit<AppOptions, 'database' | 'run'> = {}): Promise<string> {
      h.app = await buildApp({ silentMs: 600_000, ...options, run: { name, preset: 'tiny', stages, bottleneck: 32 }, database: await testDatabase() });
      return h.app.fastify.listen({ port: 0, host: '127.0.0.1' });
    },
  };
  afterEach(async () => {
    h.miners.splice(0).forEach((m) => m.close());
    await h.app?.close();
    h.app = undefined;
  });
  return h;
}
