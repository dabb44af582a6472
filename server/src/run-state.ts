import { createAdapter } from '@socket.io/redis-adapter';
import type { FastifyBaseLogger } from 'fastify';
import { Redis } from 'ioredis';
import pg from 'pg';
import { openDatabase, type Database, type DatabaseOptions } from './db/database';
import type { RunConfig } from './run-config';

/**
 * The run-state layer: what a run's processes hold in common, behind one
 * interface. Durable state (miners, receipts, rounds, scores, the ledger) is in
 * PostgreSQL: the embedded PGlite when one process serves the run, a server
 * (DATABASE_URL) that every process shares in scale-out mode. What is shared
 * but not durable is in Redis (REDIS_URL, scale-out mode only): socket.io's
 * rooms and broadcasts between processes, and the HTTP and socket rate-limit
 * counts; with one process these are its own memory. Which process runs the
 * singleton jobs is a PostgreSQL advisory lock (JobLease). The coordinator and
 * its parts see the database through RunContext; app.ts opens the store and
 * hands each library its part (the adapter, the limiters' stores, the lease).
 */

/**
 * The run as its parts see it. The coordinator (coordinator.ts) holds the run
 * and implements these; the parts it is made of (the phase machine, the flags,
 * scale-out, the socket handlers) depend on these interfaces, never on the
 * coordinator, so imports run one way: app → coordinator → parts → run-state.
 * What each part may touch is the interface it names, no more.
 */
export interface RunContext {
  /** The run's row in `runs`. */
  readonly runId: number;
  readonly run: RunConfig;
  /** The run's durable state: the embedded PGlite in one process, PostgreSQL shared by several. */
  readonly db: Database;
  readonly log: FastifyBaseLogger;
}

/** What concerns one miner's connection, wherever it is connected (MinerChannel.toMiner). */
export type MinerAction =
  | { id: string; kind: 'emit'; event: string; payload: unknown }
  | { id: string; kind: 'moved'; from: number; to: number; reason: string }
  | { id: string; kind: 'flagged'; flag: string; reason: string }
  /** Dropped (silent): its connection is closed, and its close changes nothing more. */
  | { id: string; kind: 'disconnect' };

/** Reaching miners: on this process's sockets, or (scale-out) through the process that holds the miner's connection. */
export interface MinerChannel {
  toMiner(action: MinerAction): void;
  /** Whether the miner is registered in this run and connected to some process of it. */
  canReach(minerId: string): Promise<boolean>;
}

/** The Redis clients of a scale-out process: one publishes and keeps counts, one subscribes. */
interface SharedRedis {
  readonly pub: Redis;
  readonly sub: Redis;
  close(): Promise<void>;
}

export interface RunStoreOptions {
  database?: DatabaseOptions | undefined;
  /** Scale-out mode: a Redis server that every process of the run shares (needs a PostgreSQL server). */
  redisUrl?: string | undefined;
}

/**
 * Where a run's state is, opened: the database and, in scale-out mode, Redis.
 * `scaledOut` says which form; the embedded database is the single-process one.
 */
export class RunStore {
  private constructor(
    readonly db: Database,
    /** Absent with one process. */
    private readonly redis: SharedRedis | undefined,
    private readonly databaseUrl: string | undefined,
  ) {}

  /** Opens the store: a named error, before anything is opened, for REDIS_URL without a server's DATABASE_URL. */
  static async open(options: RunStoreOptions, log: { warn(obj: object, msg: string): void }): Promise<RunStore> {
    if (options.redisUrl && !options.database?.url) throw new Error('scale-out mode (REDIS_URL) needs a PostgreSQL server (DATABASE_URL) that every process shares');
    const redis = options.redisUrl ? await redisClients(options.redisUrl, log) : undefined;
    try {
      return new RunStore(await openDatabase(options.database ?? {}), redis, options.database?.url);
    } catch (e) {
      await redis?.close();
      throw e;
    }
  }

  /** Whether several processes may serve this run (PostgreSQL server and Redis). */
  get scaledOut(): boolean {
    return this.redis !== undefined;
  }

  /** @fastify/rate-limit's store: Redis, so that an IP's budget is the run's and not each process's; else this process's memory. */
  httpRateLimits(run: string): { redis?: Redis; nameSpace?: string } {
    return this.redis ? { redis: this.redis.pub, nameSpace: `tah:${run}:rate:` } : {};
  }

  /** The socket budgets' counters (socket/rate-limits.ts): in Redis when shared, else undefined (memory). */
  socketRateLimits(run: string): { redis: Redis; prefix: string } | undefined {
    return this.redis ? { redis: this.redis.pub, prefix: `tah:${run}:socket-rate:` } : undefined;
  }

  /** socket.io's adapter: through Redis (rooms and broadcasts reach every process), else socket.io's in-memory one. */
  socketAdapter(run: string): ReturnType<typeof createAdapter> | undefined {
    return this.redis ? createAdapter(this.redis.pub, this.redis.sub, { key: `tah:${run}` }) : undefined;
  }

  /** Who runs the singleton jobs: this process from the start with one process, else whoever holds the run's advisory lock. */
  jobLease(runId: number, log: { warn(obj: object, msg: string): void; info(obj: object, msg: string): void }): JobLease {
    return new JobLease(this.redis ? this.databaseUrl : undefined, runId, log);
  }

  async close(): Promise<void> {
    await this.redis?.close();
    await this.db.close();
  }
}

/**
 * Redis clients for socket.io's adapter (publish and subscribe), connected, or a named error. A
 * connection that breaks later is logged and reconnected by ioredis; once closed, nothing is logged
 * (a departure handled during shutdown may still try to publish).
 */
async function redisClients(url: string, log: { warn(obj: object, msg: string): void }): Promise<SharedRedis> {
  const pub = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 3 });
  const sub = pub.duplicate();
  let closed = false;
  for (const client of [pub, sub]) client.on('error', (err: Error) => void (closed || log.warn({ err }, 'Redis connection error')));
  try {
    await Promise.all([pub.connect(), sub.connect()]);
  } catch (e) {
    pub.disconnect();
    sub.disconnect();
    throw new Error(`could not reach Redis at REDIS_URL (${(e as Error).message})`);
  }
  return {
    pub,
    sub,
    async close() {
      closed = true;
      await Promise.allSettled([pub.quit(), sub.quit()]);
    },
  };
}

/** The first key of the advisory lock that names a run's singleton-job holder (the second is the run's id). */
export const JOBS_LOCK = 0x7a5;
/** How often a process without the lease tries for it, and the holder checks its connection. */
export const LEASE_RETRY_MS = 1000;

/**
 * Whether this process runs the run's singleton jobs. With the embedded
 * database there is one process: it holds the lease from the start. With a
 * PostgreSQL server, the lease is a session advisory lock on a connection of
 * its own: tried every LEASE_RETRY_MS until taken, checked as often while held
 * (a connection that broke lost the lock with it: PostgreSQL releases a dead
 * session's locks, which is how another process takes over from one killed).
 */
export class JobLease {
  held = false;
  private client?: pg.Client;
  private timer?: NodeJS.Timeout;
  private closed = false;
  private readonly listeners: Array<(held: boolean) => void> = [];

  constructor(
    private readonly url: string | undefined,
    private readonly runId: number,
    private readonly log: { warn(obj: object, msg: string): void; info(obj: object, msg: string): void },
    private readonly retryMs = LEASE_RETRY_MS,
  ) {}

  /** Called with true when this process takes the lease, false when it loses it. */
  onChange(listener: (held: boolean) => void): void {
    this.listeners.push(listener);
  }

  start(): void {
    if (!this.url) return this.set(true);
    void this.attempt();
  }

  private set(held: boolean): void {
    if (held === this.held) return;
    this.held = held;
    this.log.info({ held, runId: this.runId }, held ? 'this process runs the singleton jobs' : 'this process lost the singleton jobs');
    for (const l of this.listeners) l(held);
  }

  private async attempt(): Promise<void> {
    if (this.closed) return;
    try {
      if (!this.client) {
        const client = new pg.Client({ connectionString: this.url, keepAlive: true });
        client.on('error', () => this.lost(client));
        client.on('end', () => this.lost(client));
        this.client = client;
        await client.connect();
      }
      const client = this.client;
      if (this.held) await client.query('SELECT 1'); // still ours while this session lives
      else {
        const { rows } = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1, $2) AS ok', [JOBS_LOCK, this.runId]);
        if (rows[0]?.ok && !this.closed) this.set(true);
      }
    } catch (err) {
      if (this.client) this.lost(this.client, err);
    }
    if (!this.closed) this.timer = setTimeout(() => void this.attempt(), this.retryMs);
  }

  private lost(client: pg.Client, err?: unknown): void {
    if (this.client !== client) return;
    this.client = undefined;
    client.end().catch(() => {});
    if (!this.closed) this.log.warn({ err }, 'the singleton jobs lease connection broke');
    this.set(false);
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.timer);
    const client = this.client;
    this.client = undefined;
    this.set(false);
    await client?.end().catch(() => {}); // the lock goes with the session
  }
}
