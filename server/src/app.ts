import proxyaddr from '@fastify/proxy-addr';
import rateLimit from '@fastify/rate-limit';
import fastifyStatic from '@fastify/static';
import Fastify, { type FastifyInstance } from 'fastify';
import { createReadStream, existsSync } from 'node:fs';
import { join } from 'node:path';
import { createServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { Socket } from 'node:net';
import { Server } from 'socket.io';
import { cryptoReady, DASHBOARD_NAMESPACE } from '@train-at-home/protocol';
import { Coordinator } from './coordinator';
import { DEFAULT_LOCAL_MINERS, LocalMiners, type LocalMinerOptions } from './local-miners';
import { RateLimited } from './rate-limited';
import type { Database, DatabaseOptions } from './db/database';
import { MAINTAIN_EVERY_MS, maintain } from './db/maintenance';
import { DashboardFeed } from './dashboard/feed';
import { modelRoutes } from './routes/model';
import { checkpointRoutes } from './routes/checkpoints';
import { dashboardRoutes } from './routes/dashboard';
import { incentiveRoutes } from './routes/incentives';
import { auditRoutes } from './routes/audits';
import { probeRoutes } from './routes/probes';
import { rewardRoutes } from './routes/rewards';
import { statusRoutes } from './routes/status';
import { rewardsSettings, type RewardsOptions } from './rewards/settings';
import { defaultRunConfig, type RunOverrides } from './run-config';
import { networkSettings, type NetworkSettings } from './network';
import { SocketRateLimits, type SocketRates } from './socket/rate-limits';
import { attachRegistration } from './socket/registration';
import { LIVENESS_FLUSH_MS, MIN_SILENT_MS, SILENT_HEARTBEATS } from './liveness';
import { Validator } from './jobs';
import { RunStore, type JobLease } from './run-state';
import { ScaleOut } from './scale-out';
import { AdmissionQueue, type AdmissionOptions } from './admission';

export interface AppOptions {
  run?: RunOverrides;
  database?: DatabaseOptions;
  logger?: boolean | { level: string };
  /** The built web app (dist/web), served at /. */
  webRoot?: string;
  /** Prepared token shards (./data), served at /data/ with HTTP ranges for browsers. */
  dataRoot?: string;
  /** A miner silent (no heartbeat) this long is dropped (default: 7.5 heartbeats, at least 15 s). */
  silentMs?: number;
  /** How often miners send a heartbeat (told to each when it registers); 2 s by default. */
  heartbeatMs?: number;
  /** Payout links and claims: the domain wallets sign for, challenge lifetime, rate limits, payout sink. */
  rewards?: RewardsOptions;
  /** Limits on HTTP connections (see `httpServer`) and requests. */
  http?: Partial<HttpLimits>;
  /**
   * Serve HTTPS with this certificate and key (PEM): browsers give WebGPU only to secure contexts, so a coordinator
   * that people open at an address other than localhost serves its pages over HTTPS (or behind a proxy that does).
   */
  tls?: { cert: string | Buffer; key: string | Buffer };
  /** Budgets of socket events per connection and per miner (socket/rate-limits.ts). */
  socketRates?: Partial<SocketRates>;
  /** Registrations taken at once, and how waiting ones are told their place (admission.ts). */
  admission?: Partial<AdmissionOptions>;
  /**
   * How often, at most, the validator measures the merged model's held-out loss and writes a sample of its text
   * (jobs/index.ts, EVALUATE_EVERY_MS by default): each is a forward pass over the held-out batches through
   * every stage, on the coordinator's machine.
   */
  evaluateEveryMs?: number;
  /** The dashboard's live feed: how often viewers get an update. */
  dashboard?: { pushMs?: number };
  /** STUN and TURN servers, the TURN secret and the coordinator's frame relay (network.ts); none, and the relay off, by default. */
  network?: Partial<NetworkSettings>;
  /** Headless miners the coordinator starts on its own machine for stages nobody holds (local-miners.ts); none by default. */
  localMiners?: Partial<LocalMinerOptions>;
  /**
   * Scale-out mode (scale-out.ts): a Redis server (redis://…) through which this process and the
   * run's other coordinator processes share socket.io's rooms and messages. Needs `database.url`.
   */
  redisUrl?: string;
}

export interface HttpLimits {
  /** A request's headers and body must have arrived within this (a 64 MB checkpoint on a slow uplink fits). */
  requestTimeoutMs: number;
  /** Its headers within this. */
  headersTimeoutMs: number;
  /** Open connections from one IP address (a household's tabs share one). */
  maxConnectionsPerIp: number;
  /**
   * HTTP requests one IP address may make per minute, over every route (a tab polls a few
   * routes every few seconds; a page load fetches a dozen files). The rewards routes have
   * stricter limits of their own. socket.io's own requests are not counted here (see socketRates).
   */
  requestsPerIpPerMinute: number;
  /**
   * The load balancers in front (scale-out mode; README, "Scale-out"): addresses, CIDRs or `loopback`.
   * A request from one is the client's that X-Forwarded-For names, for its rate limit; connections from
   * one are not capped per IP here (the balancer caps each client's), since every client comes through it.
   */
  trustedProxies: string[];
}

export const DEFAULT_HTTP_LIMITS: HttpLimits = { requestTimeoutMs: 120_000, headersTimeoutMs: 20_000, maxConnectionsPerIp: 256, requestsPerIpPerMinute: 1200, trustedProxies: [] };

/**
 * The HTTP server under Fastify and socket.io: a request that never finishes
 * (a body promised and not sent, a byte every few seconds) is answered 408 and
 * closed once its time is up, checked every second; connections beyond the
 * per-IP cap are closed at once.
 */
function httpServer(handler: (req: IncomingMessage, res: ServerResponse) => void, limits: HttpLimits, tls?: AppOptions['tls']): HttpServer {
  const timeouts = { requestTimeout: limits.requestTimeoutMs, headersTimeout: Math.min(limits.headersTimeoutMs, limits.requestTimeoutMs), connectionsCheckingInterval: 1000 };
  // An HTTPS server is an HTTP server over TLS: the same requests, upgrades (socket.io) and limits.
  const server = tls ? (createHttpsServer({ ...timeouts, cert: tls.cert, key: tls.key }, handler) as unknown as HttpServer) : createServer(timeouts, handler);
  const open = new Map<string, number>();
  const proxy = limits.trustedProxies.length > 0 ? proxyaddr.compile(limits.trustedProxies) : undefined;
  server.on('connection', (socket: Socket) => {
    const ip = socket.remoteAddress ?? '?';
    if (proxy?.(ip, 0)) return; // a load balancer's: it caps each client's connections itself
    const n = (open.get(ip) ?? 0) + 1;
    if (n > limits.maxConnectionsPerIp) {
      socket.destroy();
      return;
    }
    open.set(ip, n);
    socket.once('close', () => {
      const left = (open.get(ip) ?? 1) - 1;
      if (left > 0) open.set(ip, left);
      else open.delete(ip);
    });
  });
  return server;
}

export interface App {
  fastify: FastifyInstance;
  io: Server;
  coordinator: Coordinator;
  db: Database;
  /** The validator: held-out loss, spot checks, scores and settlement (its work runs in a process of its own). */
  validator: Validator;
  /** The dashboard's live feed (socket.io namespace /dashboard). */
  feed: DashboardFeed;
  /** Miners this coordinator starts for empty stages (after `localMiners.start(url)`). */
  localMiners: LocalMiners;
  /** Whether this process runs the run's singleton jobs (always, with one process; scale-out.ts). */
  lease: JobLease;
  /** Stops the coordinator; `keepLocalMiners`: its local miners stay running for a restarted coordinator to take over. */
  close(options?: { keepLocalMiners?: boolean }): Promise<void>;
}

/** A gap this much longer than the sweep's period means this process stalled (its timers ran late). */
export const STALL_MS = 2000;
/** After a stall, how long deadlines wait for the messages queued behind it before they count again. */
export const STALL_TRUST_AFTER_MS = 5000;

/** The files a dataset folder serves (scripts/prepare-data.ts writes them): no other name, no `..`. */
/** A prepared dataset's files (DATASET_NAME, a folder the shipped corpora's or an operator's own): nothing else under the data root. */
const DATASET_FILE = /^\/[a-z0-9][a-z0-9-]{0,47}-v[0-9]+-bpe[0-9]+\/(?:manifest\.json|tokenizer\.json|(?:train|heldout)-[0-9]{3}\.bin)$/;

/** Paths the web app's router owns: not the API, the data or socket.io, and no file name (a missing asset stays 404). */
const APP_PAGE = /^\/(?!(?:api|data|socket\.io)(?:\/|$))(?:[^./]*\/)*[^./]*$/;

/**
 * The web app's pages (/rewards, /dashboard…) are its router's addresses: a
 * browser opening or reloading one gets index.html, and the app shows the page.
 * Anything else not found keeps Fastify's 404.
 */
function serveAppPages(fastify: FastifyInstance, indexHtml: string): void {
  fastify.setNotFoundHandler((req, reply) => {
    const path = req.url.split('?')[0]!;
    if (req.method === 'GET' && APP_PAGE.test(path) && existsSync(indexHtml)) {
      return reply.type('text/html; charset=utf-8').header('cache-control', 'no-cache').send(createReadStream(indexHtml));
    }
    return reply.code(404).send({ message: `Route ${req.method}:${req.url} not found`, error: 'Not Found', statusCode: 404 });
  });
}

/**
 * The coordinator as plugins on one Fastify instance, with socket.io on the
 * same HTTP server. Tests call this and listen on port 0.
 */
export async function buildApp(options: AppOptions = {}): Promise<App> {
  await cryptoReady();
  const rewards = rewardsSettings(options.rewards); // a bad domain fails here, before anything opens
  const network = networkSettings(options.network); // so does a bad STUN or TURN setting
  const limits = { ...DEFAULT_HTTP_LIMITS, ...options.http };

  const fastify = Fastify({
    logger: options.logger ?? false,
    bodyLimit: 64 * 1024,
    serverFactory: (handler) => httpServer(handler, limits, options.tls),
    // Behind a load balancer, a request's client (req.ip, the rate limit's key) is the one it forwards.
    ...(limits.trustedProxies.length > 0 ? { trustProxy: limits.trustedProxies } : {}),
    // Schemas hold as written: Fastify's default Ajv turned a one-element array into the string it
    // wraps and dropped unknown fields, so a body the docs refuse (400) was taken. Query strings are
    // strings too, and their schemas say so (routes/rewards.ts).
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false } },
  });
  // A failure of the coordinator's own is logged in full and answered without its internals.
  fastify.setErrorHandler((err: Error & { statusCode?: number; validation?: unknown }, req, reply) => {
    if (err instanceof RateLimited) return reply.code(429).send(err.body);
    // A body or query that does not fit its route, JSON that does not parse: the API's named refusal.
    if (err.validation || err.statusCode === 400) return reply.code(400).send({ error: 'BAD_REQUEST', message: err.message });
    if ((err.statusCode ?? 500) < 500) return reply.send(err); // Fastify's own answer to a bad request
    req.log.error({ err }, 'request failed');
    return reply.code(500).send({ error: 'INTERNAL', message: 'the coordinator could not handle this request' });
  });
  // The run's state (run-state.ts): the database, and Redis in scale-out mode.
  const store = await RunStore.open({ database: options.database, redisUrl: options.redisUrl }, fastify.log);
  const { db } = store;
  const run = defaultRunConfig(options.run);
  // Every route, per client IP; over the limit: 429 RATE_LIMITED with the time to wait (and retry-after).
  // In scale-out mode the counts are kept in Redis, so an IP's budget is the run's, not each process's.
  await fastify.register(rateLimit, {
    global: true,
    ...store.httpRateLimits(run.name),
    max: limits.requestsPerIpPerMinute,
    timeWindow: 60_000,
    // Thrown by the plugin's hook, answered by the error handlers (here and in plugins that have their own).
    errorResponseBuilder: (_req, context) => new RateLimited(context.ttl),
  });
  const coordinator = await Coordinator.open(db, run, fastify.log, store.scaledOut);
  coordinator.setNetwork(network);
  if (!store.scaledOut) {
    // The last the previous coordinator process heard from a miner, to now: the outage a restart makes.
    const [seen] = await db.query<{ at: Date | string | null }>(`SELECT max(last_seen_at) AS at FROM miners WHERE run_id = $1`, [coordinator.runId]);
    if (seen?.at) coordinator.outage = { from: new Date(seen.at).toISOString(), to: new Date().toISOString() };
    // Miners that were active when the coordinator stopped must reconnect and register again.
    await db.query(`UPDATE miners SET status = 'left' WHERE run_id = $1 AND status = 'active'`, [coordinator.runId]);
  }
  // (In scale-out mode the others' miners are active: those of a process that died are dropped by the lease holder's sweep.)
  const validator = new Validator(coordinator, options.dataRoot);
  if (options.evaluateEveryMs !== undefined) validator.evaluateEveryMs = options.evaluateEveryMs;
  const localMiners = new LocalMiners(coordinator, { ...DEFAULT_LOCAL_MINERS, ...options.localMiners });
  await fastify.register(statusRoutes, { coordinator, localMiners });
  await fastify.register(checkpointRoutes, { coordinator });
  await fastify.register(modelRoutes, { coordinator, dataRoot: options.dataRoot });
  await fastify.register(incentiveRoutes, { coordinator });
  await fastify.register(probeRoutes, { spotChecks: validator.spotChecks });
  await fastify.register(auditRoutes, { audits: validator.audits, coordinator });
  await fastify.register(rewardRoutes, { coordinator, settings: rewards });
  if (options.dataRoot && existsSync(options.dataRoot)) {
    // Only the prepared datasets (manifest, tokenizer, shards); byte ranges let a tab fetch windows.
    await fastify.register(fastifyStatic, { root: options.dataRoot, prefix: '/data/', decorateReply: false, allowedPath: (path) => DATASET_FILE.test(path) });
  }
  if (options.webRoot && existsSync(options.webRoot)) {
    await fastify.register(fastifyStatic, { root: options.webRoot, prefix: '/', decorateReply: false });
    serveAppPages(fastify, join(options.webRoot, 'index.html'));
  }
  // Room for one relayed frame chunk (256 KiB) and its envelope; nothing larger is accepted.
  const io = new Server(fastify.server, { maxHttpBufferSize: 300 * 1024, serveClient: false, adapter: store.socketAdapter(run.name) });
  const feed = new DashboardFeed(coordinator, io.of(DASHBOARD_NAMESPACE), options.dashboard?.pushMs);
  await fastify.register(dashboardRoutes, { coordinator, feed });
  refuseOtherSocketMethods(fastify.server);
  coordinator.io = io;
  // Socket budgets shared by every process in scale-out mode (in Redis), as the HTTP ones above are.
  // A connection's address, for the registrations budget of each address: behind a trusted balancer, the client it forwards.
  const trusted = limits.trustedProxies.length > 0 ? proxyaddr.compile(limits.trustedProxies) : () => false;
  attachRegistration(io, coordinator, new SocketRateLimits(options.socketRates, store.socketRateLimits(run.name)), (socket) => proxyaddr(socket.request, trusted));
  if (options.heartbeatMs !== undefined) coordinator.heartbeatMs = options.heartbeatMs;
  if (options.admission) coordinator.admission = new AdmissionQueue(options.admission);
  const silentMs = options.silentMs ?? Math.max(MIN_SILENT_MS, SILENT_HEARTBEATS * coordinator.heartbeatMs);
  const sweepMs = Math.min(1000, silentMs / 2);
  // One process runs the singleton jobs (validator, settlement, local miners, the stage map's publisher): with one process, this one.
  const lease = store.jobLease(coordinator.runId, fastify.log);
  if (store.scaledOut) {
    coordinator.scaleOut = new ScaleOut(io, coordinator, lease, silentMs);
    coordinator.scaleOut.probeAnswers = (probeId, minerId, bytes) => validator.spotChecks.answer(probeId, minerId, bytes);
  }
  lease.start();
  // When this process itself stalled (a large checkpoint stored, a GC pause), what miners sent
  // meanwhile (heartbeats, merge answers) is still queued behind this timer: no miner is called
  // silent, and no merge phase ends on its deadline, until those messages have had time to land.
  // A sweep this late marks a stall: STALL_MS, or half the silence that drops a miner where that is shorter (a run that
  // drops miners after 1.5 s of silence cannot let a 1.5 s hiccup of its own pass for their silence).
  const stallMs = Math.min(STALL_MS, silentMs / 2);
  let lastSweep = performance.now();
  let trustAfter = 0;
  const sweep = setInterval(() => {
    const now = performance.now();
    if (now - lastSweep > sweepMs + stallMs) trustAfter = now + STALL_TRUST_AFTER_MS;
    lastSweep = now;
    const trusted = now >= trustAfter;
    if (trusted) coordinator.dropSilent(silentMs).catch((err: unknown) => fastify.log.error({ err }, 'heartbeat sweep failed'));
    coordinator.phases.tick(trusted).catch((err: unknown) => fastify.log.error({ err }, 'phase machine tick failed'));
    if (!lease.held) return;
    validator.tick();
    localMiners.tick().catch((err: unknown) => fastify.log.error({ err }, 'local miners tick failed'));
    coordinator.scaleOut?.tick().catch((err: unknown) => fastify.log.error({ err }, 'sweep of stopped processes\' miners failed'));
  }, sweepMs);
  const flushLiveness = setInterval(() => coordinator.liveness.flush().catch((err: unknown) => fastify.log.error({ err }, 'could not store heartbeat times')), LIVENESS_FLUSH_MS);
  flushLiveness.unref();
  sweep.unref();
  // The embedded database has no autovacuum: the coordinator analyses and vacuums it as one would (db/maintenance.ts).
  let maintaining: Promise<void> | undefined;
  const maintenance =
    db.kind === 'pglite'
      ? setInterval(() => {
          maintaining ??= maintain(db)
            .then(() => undefined, (err: unknown) => fastify.log.error({ err }, 'could not analyse or vacuum the embedded database'))
            .finally(() => (maintaining = undefined));
        }, MAINTAIN_EVERY_MS)
      : undefined;
  maintenance?.unref();
  return {
    fastify,
    io,
    coordinator,
    db,
    validator,
    feed,
    localMiners,
    lease,
    async close(closeOptions: { keepLocalMiners?: boolean } = {}) {
      clearInterval(sweep);
      clearInterval(flushLiveness);
      clearInterval(maintenance);
      await maintaining;
      await lease.close();
      await localMiners.close(closeOptions.keepLocalMiners);
      feed.close();
      coordinator.admission.close();
      coordinator.scaleOut?.close();
      io.close();
      await validator.close();
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
      await coordinator.liveness.flush().catch((err: unknown) => fastify.log.error({ err }, 'could not store heartbeat times'));
      await store.close();
    },
  };
}

/**
 * engine.io answers a method other than GET or POST on a live session's URL
 * (a DELETE) with a bare 500 from the transport itself: such requests are
 * refused first, by name, and never reach it.
 */
function refuseOtherSocketMethods(server: HttpServer): void {
  const engine = server.listeners('request') as Array<(req: IncomingMessage, res: ServerResponse) => void>;
  server.removeAllListeners('request');
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    if (req.url?.startsWith('/socket.io/') && req.method !== 'GET' && req.method !== 'POST') {
      res.writeHead(405, { 'content-type': 'application/json', allow: 'GET, POST' });
      res.end(JSON.stringify({ error: 'METHOD_NOT_ALLOWED', message: `socket.io takes GET and POST, not ${String(req.method).slice(0, 16)}` }));
      return;
    }
    for (const listener of engine) listener.call(server, req, res);
  });
}
