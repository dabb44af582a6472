import type { FastifyBaseLogger } from 'fastify';
import type { Server, Socket } from 'socket.io';
import type { Database } from './db/database';
import { PRESETS } from '@train-at-home/model';
import { ActivationRegistry } from './activations';
import { LiveState } from './dashboard/live';
import { PhaseMachine } from './phases';
import { DEFAULT_INCENTIVES, DEFAULT_MERGE, type RunConfig } from './run-config';
import { rebalanceStages } from './socket/registration';
import { Flags } from './validator/flags';
import { DEFAULT_NETWORK, RelayBudget, networkSettings, type NetworkSettings } from './network';
import { StageMapFeed } from './stage-map';
import { Liveness } from './liveness';
import { DEFAULT_HEARTBEAT_MS } from './operator-settings';

/** The coordinator's state shared by its plugins: the run, the database, live connections. */
export class Coordinator {
  readonly sockets = new Map<string, Socket>();
  /** Bytes the coordinator carried for miners: signaling, and frames where no direct path exists. */
  readonly relayed = { signalBytes: 0, frameBytes: 0 };
  /** STUN, TURN and the relay (network.ts): what miners are told at registration and on 'ice'. */
  network: NetworkSettings = DEFAULT_NETWORK;
  /** Each miner's relayed bytes this minute, against network.relay.bytesPerMinute. */
  relayBudget = new RelayBudget(DEFAULT_NETWORK.relay.bytesPerMinute);
  readonly phases: PhaseMachine;
  /** Microbatches that exist (announced by the stage-0 miner that made them). */
  readonly activations: ActivationRegistry;
  /** Evidence against miners; a flagged miner leaves the pipeline. */
  readonly flags: Flags;
  /** What the dashboard shows as it moves: miners' own reports, transfer rates, bytes. */
  readonly live: LiveState;
  /**
   * When this coordinator process started after another had run this run: from the last
   * heartbeat that one stored to this start, nothing was recorded (the Dashboard draws it as a gap).
   */
  outage?: { from: string; to: string };
  /** socket.io's server, once the app has attached it: stage-map deltas go to its rooms. */
  io?: Server;
  /** Who holds which stage, as miners were told it (stage-map.ts). */
  readonly stageFeed: StageMapFeed;
  /** How often miners send a heartbeat: told to each when it registers (the operator's --heartbeat-ms). */
  heartbeatMs = DEFAULT_HEARTBEAT_MS;
  /** When each miner was last heard from (memory; written to the database in batches). */
  readonly liveness: Liveness;

  constructor(
    readonly db: Database,
    readonly run: RunConfig,
    readonly runId: number,
    readonly log: FastifyBaseLogger,
  ) {
    this.phases = new PhaseMachine(this);
    this.activations = new ActivationRegistry(db, runId);
    this.flags = new Flags(this);
    const preset = PRESETS[run.preset];
    this.live = new LiveState(run.stages, run.training.batchSize * preset.contextLength * preset.dModel * 4);
    this.liveness = new Liveness(db);
    this.stageFeed = new StageMapFeed(
      run.stages,
      async () => (await this.stageMap()).map((s) => s.miners.map((m) => m.id)),
      (rooms, delta) => this.io?.to(rooms).emit('stage-delta', delta),
    );
  }

  /** New network settings (checked first): later registrations and 'ice' requests get them; a changed TURN secret takes effect at once. */
  setNetwork(overrides: Partial<NetworkSettings>): void {
    this.network = networkSettings(overrides);
    this.relayBudget = new RelayBudget(this.network.relay.bytesPerMinute);
  }

  /** Loads the run by name, creating it on first start; a restart resumes the same run. */
  static async open(db: Database, run: RunConfig, log: FastifyBaseLogger): Promise<Coordinator> {
    const rows = await db.query<{ id: number; config: RunConfig }>(
      `INSERT INTO runs (name, config) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id, config`,
      [run.name, JSON.stringify(run)],
    );
    const stored = rows[0]!;
    const config = typeof stored.config === 'string' ? (JSON.parse(stored.config) as RunConfig) : stored.config;
    config.merge = { ...DEFAULT_MERGE, ...config.merge }; // runs stored before merges existed
    config.incentives = { ...DEFAULT_INCENTIVES, ...config.incentives }; // …and before incentives
    // A run's layout never changes under its miners: the stored one wins.
    const coordinator = new Coordinator(db, config, stored.id, log);
    await coordinator.phases.load();
    return coordinator;
  }

  /**
   * Drops miners whose last heartbeat is older than silentMs: they are
   * disconnected, marked dropped, and their stage is refilled if it emptied.
   * Their in-flight microbatches are re-sent by stage 0 on other pathways.
   */
  async dropSilent(silentMs: number): Promise<string[]> {
    const quiet = this.liveness.silent(silentMs);
    if (quiet.length === 0) return [];
    const silent = await this.db.query<{ id: string }>(
      `UPDATE miners SET status = 'dropped' WHERE run_id = $1 AND status = 'active' AND id = ANY($2::text[]) RETURNING id`,
      [this.runId, quiet],
    );
    for (const id of quiet) this.liveness.forget(id);
    for (const { id } of silent) {
      this.live.forget(id);
      this.sockets.get(id)?.disconnect(true);
      this.sockets.delete(id);
    }
    if (silent.length > 0) await rebalanceStages(this);
    return silent.map((r) => r.id);
  }

  /**
   * Transfers by how their two ends agree: confirmed (both reported the same
   * bytes and hash), one-sided (one end only, so far), or disputed (the ends
   * disagree: evidence for the validator).
   */
  async receiptSummary(): Promise<{ confirmed: number; oneSided: number; disputed: number }> {
    const [row] = await this.db.query<{ confirmed: number; one_sided: number; disputed: number }>(
      `SELECT count(*) FILTER (WHERE n = 2 AND variants = 1)::int AS confirmed,
              count(*) FILTER (WHERE n = 1)::int AS one_sided,
              count(*) FILTER (WHERE n = 2 AND variants = 2)::int AS disputed
       FROM (SELECT count(*) AS n, count(DISTINCT (bytes, payload_hash)) AS variants
             FROM receipts WHERE run_id = $1 GROUP BY activation_id, direction, from_miner, to_miner) t`,
      [this.runId],
    );
    return { confirmed: row?.confirmed ?? 0, oneSided: row?.one_sided ?? 0, disputed: row?.disputed ?? 0 };
  }

  async minerLeft(id: string): Promise<void> {
    this.live.forget(id);
    this.liveness.forget(id);
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

  /** Miners known to be of this run (they registered in it): ids a receipt or loss report may name. */
  private readonly knownMiners = new Set<string>();

  /** A miner registered in this run (called by the registration handler). */
  noteMiner(id: string): void {
    this.knownMiners.add(id);
  }

  /** Whether `id` is a miner of this run: remembered, else looked up once (a restart forgets). */
  async isMinerOfRun(id: string): Promise<boolean> {
    if (this.knownMiners.has(id)) return true;
    const [row] = await this.db.query('SELECT 1 FROM miners WHERE id = $1 AND run_id = $2', [id, this.runId]);
    if (row) this.knownMiners.add(id);
    return Boolean(row);
  }

  /**
   * Tells the miners that talk to a stage what changed in it (a delta per
   * changed stage, to the rooms of its neighbours), so each can pick its peers.
   */
  publishStageMap(): Promise<void> {
    return this.stageFeed.publish();
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
