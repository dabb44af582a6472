import fastifyStatic from '@fastify/static';
import Fastify, { type FastifyInstance } from 'fastify';
import { existsSync } from 'node:fs';
import { Server } from 'socket.io';
import { cryptoReady } from '@train-at-home/protocol';
import { Coordinator } from './coordinator';
import { openDatabase, type Database, type DatabaseOptions } from './db/database';
import { checkpointRoutes } from './routes/checkpoints';
import { statusRoutes } from './routes/status';
import { HeldOutEvaluator } from './validator/heldout';
import { defaultRunConfig, type RunOverrides } from './run-config';
import { attachRegistration } from './socket/registration';

export interface AppOptions {
  run?: RunOverrides;
  database?: DatabaseOptions;
  logger?: boolean;
  /** The built web app (dist/web), served at /. */
  webRoot?: string;
  /** Prepared token shards (./data), served at /data/ with HTTP ranges for browsers. */
  dataRoot?: string;
  /** A miner silent (no heartbeat) this long is dropped. */
  silentMs?: number;
}

export interface App {
  fastify: FastifyInstance;
  io: Server;
  coordinator: Coordinator;
  db: Database;
  validator: HeldOutEvaluator;
  close(): Promise<void>;
}

/**
 * The coordinator as plugins on one Fastify instance, with socket.io on the
 * same HTTP server. Tests call this and listen on port 0.
 */
export async function buildApp(options: AppOptions = {}): Promise<App> {
  await cryptoReady();
  const fastify = Fastify({ logger: options.logger ?? false, bodyLimit: 64 * 1024 });
  const db = await openDatabase(options.database ?? {});
  const coordinator = await Coordinator.open(db, defaultRunConfig(options.run), fastify.log);
  // Miners that were active when the coordinator stopped must reconnect and register again.
  await db.query(`UPDATE miners SET status = 'left' WHERE run_id = $1 AND status = 'active'`, [coordinator.runId]);
  await fastify.register(statusRoutes, { coordinator });
  await fastify.register(checkpointRoutes, { coordinator });
  if (options.dataRoot && existsSync(options.dataRoot)) {
    // Only the prepared datasets (manifest, tokenizer, shards); byte ranges let a tab fetch windows.
    await fastify.register(fastifyStatic, { root: options.dataRoot, prefix: '/data/', decorateReply: false, allowedPath: (path) => /^\/sotu-brown-[^/]+\/[\w.-]+$/.test(path) });
  }
  if (options.webRoot && existsSync(options.webRoot)) {
    await fastify.register(fastifyStatic, { root: options.webRoot, prefix: '/', decorateReply: false });
  }
  const validator = new HeldOutEvaluator(coordinator);
  // Room for one relayed frame chunk (256 KiB) and its envelope; nothing larger is accepted.
  const io = new Server(fastify.server, { maxHttpBufferSize: 300 * 1024, serveClient: false });
  attachRegistration(io, coordinator);
  const silentMs = options.silentMs ?? 15_000;
  const sweepMs = Math.min(1000, silentMs / 2);
  // When this process itself stalled (a long synchronous evaluation, a GC pause), the heartbeats
  // of that time are still queued: no miner is called silent until they have had time to land.
  let lastSweep = performance.now();
  let trustAfter = 0;
  const sweep = setInterval(() => {
    const now = performance.now();
    if (now - lastSweep > sweepMs + 2000) trustAfter = now + 5000;
    lastSweep = now;
    if (now >= trustAfter) coordinator.dropSilent(silentMs).catch((err: unknown) => fastify.log.error({ err }, 'heartbeat sweep failed'));
    coordinator.phases.tick().catch((err: unknown) => fastify.log.error({ err }, 'phase machine tick failed'));
  }, sweepMs);
  sweep.unref();
  return {
    fastify,
    io,
    coordinator,
    db,
    validator,
    async close() {
      clearInterval(sweep);
      io.close();
      // Requests in flight finish; a keep-alive connection is closed as soon as it goes idle,
      // not after Node's keep-alive timeout (72 s under Fastify: a stopped miner's last request
      // held a test's close for that long).
      const closing = fastify.close();
      const drain = setInterval(() => fastify.server.closeIdleConnections(), 100);
      try {
        await closing;
      } finally {
        clearInterval(drain);
      }
      await db.close();
    },
  };
}
