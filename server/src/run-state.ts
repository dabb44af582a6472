import type { FastifyBaseLogger } from 'fastify';
import type { Database } from './db/database';
import type { RunConfig } from './run-config';

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
