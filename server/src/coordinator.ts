import type { FastifyBaseLogger } from 'fastify';
import type { Socket } from 'socket.io';
import type { Database } from './db/database';
import type { RunConfig } from './run-config';
import { rebalanceStages } from './socket/registration';

/** The coordinator's state shared by its plugins: the run, the database, live connections. */
export class Coordinator {
  readonly sockets = new Map<string, Socket>();
  /** Bytes the coordinator carried for miners: signaling, and frames where no direct path exists. */
  readonly relayed = { signalBytes: 0, frameBytes: 0 };

  constructor(
    readonly db: Database,
    readonly run: RunConfig,
    readonly runId: number,
    readonly log: FastifyBaseLogger,
  ) {}

  /** Loads the run by name, creating it on first start; a restart resumes the same run. */
  static async open(db: Database, run: RunConfig, log: FastifyBaseLogger): Promise<Coordinator> {
    const rows = await db.query<{ id: number; config: RunConfig }>(
      `INSERT INTO runs (name, config) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id, config`,
      [run.name, JSON.stringify(run)],
    );
    const stored = rows[0]!;
    const config = typeof stored.config === 'string' ? (JSON.parse(stored.config) as RunConfig) : stored.config;
    // A run's layout never changes under its miners: the stored one wins.
    return new Coordinator(db, config, stored.id, log);
  }

  /**
   * Drops miners whose last heartbeat is older than silentMs: they are
   * disconnected, marked dropped, and their stage is refilled if it emptied.
   * Their in-flight microbatches are re-sent by stage 0 on other pathways.
   */
  async dropSilent(silentMs: number): Promise<string[]> {
    const silent = await this.db.query<{ id: string }>(
      `UPDATE miners SET status = 'dropped' WHERE run_id = $1 AND status = 'active' AND last_seen_at < now() - make_interval(secs => $2) RETURNING id`,
      [this.runId, silentMs / 1000],
    );
    for (const { id } of silent) {
      this.sockets.get(id)?.disconnect(true);
      this.sockets.delete(id);
    }
    if (silent.length > 0) await rebalanceStages(this);
    return silent.map((r) => r.id);
  }

  async minerLeft(id: string): Promise<void> {
    await this.db.query(`UPDATE miners SET status = 'left' WHERE id = $1 AND status = 'active'`, [id]);
    await rebalanceStages(this);
  }

  private readonly lossListeners: Array<(loss: number) => void> = [];
  onLoss(listener: (loss: number) => void): void {
    this.lossListeners.push(listener);
  }
  emitLoss(loss: number): void {
    for (const l of this.lossListeners) l(loss);
  }

  /** Tells every connected miner who holds which stage, so each can pick its neighbours. */
  async broadcastStageMap(): Promise<void> {
    const stages = (await this.stageMap()).map((s) => s.miners.map((m) => m.id));
    for (const socket of this.sockets.values()) socket.emit('stages', { stages });
  }

  async stageMap(): Promise<Array<{ stage: number; miners: Array<{ id: string; address: string; backend: string; tokensPerSec: number }> }>> {
    const rows = await this.db.query<{ id: string; address: string; backend: string; tokensPerSec: number; stage: number }>(
      `SELECT id, address, backend, tokens_per_sec AS "tokensPerSec", stage FROM miners WHERE run_id = $1 AND status = 'active' ORDER BY stage, id`,
      [this.runId],
    );
    return Array.from({ length: this.run.stages }, (_, stage) => ({
      stage,
      miners: rows.filter((r) => r.stage === stage).map(({ stage: _s, ...m }) => m),
    }));
  }
}
