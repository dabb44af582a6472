import type { FastifyBaseLogger } from 'fastify';
import type { Server, Socket } from 'socket.io';
import type { Database } from './db/database';
import { PRESETS } from '@train-at-home/model';
import { ActivationRegistry } from './activations';
import { AdmissionQueue } from './admission';
import { LiveState, mergeLive, type LiveSummary } from './dashboard/live';
import { PhaseMachine } from './phases';
import { DEFAULT_INCENTIVES, DEFAULT_MERGE, type RunConfig } from './run-config';
import { rebalance, type StageMember } from './assignment';
import { Flags } from './state/flags';
import { activeCounts } from './state/stage-loads';
import { DEFAULT_NETWORK, RelayBudget, networkSettings, type NetworkSettings } from './network';
import { StageMapFeed, stageRoom, type StageChange } from './stage-map';
import { DEFAULT_HEARTBEAT_MS, Liveness } from './liveness';
import type { ScaleOut } from './scale-out';
import type { MinerAction, MinerChannel, RunContext } from './run-state';

export type { MinerAction } from './run-state';

/** The coordinator's state shared by its plugins: the run, the database, live connections. */
export class Coordinator implements RunContext, MinerChannel {
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
  /** Registrations a few at a time; the rest wait in order and are told their place (admission.ts). */
  admission = new AdmissionQueue();
  /** Scale-out mode (scale-out.ts): the other coordinator processes of this run, through Redis; absent with one process. */
  scaleOut?: ScaleOut;

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
      {
        readAll: async () => {
          // Forgotten first: what changes after this is logged again, and applying it to what is read changes nothing twice.
          await db.query('DELETE FROM stage_changes WHERE run_id = $1', [runId]);
          return (await this.stageMap()).map((s) => s.miners.map((m) => m.id));
        },
        takeChanges: () =>
          db.query<StageChange>(
            `WITH taken AS (DELETE FROM stage_changes WHERE run_id = $1 RETURNING id, stage, miner_id, joined)
             SELECT stage, miner_id AS "minerId", joined FROM taken ORDER BY id`,
            [runId],
          ),
      },
      (rooms, delta) => {
        this.io?.to(rooms).emit('stage-delta', delta); // in scale-out mode, to those rooms on every process
        this.scaleOut?.deltaPublished(delta); // …and to the other processes' mirrors
      },
    );
  }

  /** New network settings (checked first): later registrations and 'ice' requests get them; a changed TURN secret takes effect at once. */
  setNetwork(overrides: Partial<NetworkSettings>): void {
    this.network = networkSettings(overrides);
    this.relayBudget = new RelayBudget(this.network.relay.bytesPerMinute);
  }

  /** Loads the run by name, creating it on first start; a restart resumes the same run. */
  /** `shared`: one of several processes of the run (scale-out.ts); its phases load when it takes the singleton jobs. */
  static async open(db: Database, run: RunConfig, log: FastifyBaseLogger, shared = false): Promise<Coordinator> {
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
    coordinator.phases.leading = !shared;
    await coordinator.phases.load(!shared);
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
    // Only rows this process's connections registered: a miner that went on to another process is that one's to judge.
    const connections = quiet.map((id) => this.sockets.get(id)?.id).filter((c): c is string => c !== undefined);
    const silent = await this.db.query<{ id: string }>(
      `UPDATE miners SET status = 'dropped' WHERE run_id = $1 AND status = 'active' AND id = ANY($2::text[]) AND connection = ANY($3::text[]) RETURNING id`,
      [this.runId, quiet, connections],
    );
    for (const id of quiet) this.liveness.forget(id);
    for (const { id } of silent) this.toMiner({ id, kind: 'disconnect' });
    if (silent.length > 0) await this.rebalanceStages();
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

  /** The miner's connection `connection` closed: it left, unless it has registered again on another since. */
  async minerLeft(id: string, connection: string): Promise<void> {
    this.live.forget(id);
    this.liveness.forget(id);
    await this.db.query(`UPDATE miners SET status = 'left' WHERE id = $1 AND status = 'active' AND connection = $2`, [id, connection]);
    await this.rebalanceStages();
  }

  /** Moves miners so no stage stays empty; tells each moved miner its new stage. */
  async rebalanceStages(): Promise<void> {
    // Most departures leave every stage held: read from the kept loads (a row per stage), not miner by miner.
    if ((await activeCounts(this.db, this.runId)).stagesHeld >= this.run.stages) return void (await this.publishStageMap());
    const members = await this.db.query<StageMember>(
      `SELECT id, stage, tokens_per_sec AS "tokensPerSec" FROM miners WHERE run_id = $1 AND status = 'active'`,
      [this.runId],
    );
    for (const move of rebalance(this.run.stages, members)) {
      await this.db.query('UPDATE miners SET stage = $1, stage_since = now() WHERE id = $2', [move.to, move.id]);
      this.toMiner({ id: move.id, kind: 'moved', from: move.from, to: move.to, reason: `stage ${move.to} had no miner` });
    }
    await this.publishStageMap();
  }

  /** The dashboard's live figures: this process's, and in scale-out mode every other process's with them. */
  async liveSummary(nowMs = Date.now()): Promise<LiveSummary> {
    const own = this.live.summary(this.relayed, nowMs);
    return this.scaleOut ? mergeLive([own, ...(await this.scaleOut.othersLive())]) : own;
  }

  /** Whether a registered miner of this run is connected here, or (scale-out) to another coordinator process. */
  async canReach(id: string): Promise<boolean> {
    if (this.sockets.has(id)) return true;
    return this.scaleOut ? this.scaleOut.isActive(id) : false;
  }

  /** Sends a miner an event: through its connection here, or (scale-out) through the process that holds it. */
  sendToMiner(id: string, event: string, payload: unknown): void {
    this.toMiner({ id, kind: 'emit', event, payload });
  }

  /**
   * Does what concerns one miner's connection: here if it is connected here,
   * else (scale-out) on the process that holds it (ScaleOut forwards it, and
   * that process calls this again with `forwarded`).
   */
  toMiner(action: MinerAction, forwarded = false): void {
    const socket = this.sockets.get(action.id);
    if (!socket) {
      if (!forwarded) this.scaleOut?.forward(action);
      return;
    }
    if (action.kind === 'emit') {
      socket.emit(action.event, action.payload);
    } else if (action.kind === 'moved') {
      (socket.data as { stage?: number }).stage = action.to;
      socket.leave(stageRoom(action.from));
      socket.join(stageRoom(action.to));
      socket.emit('reassigned', { stage: action.to, reason: action.reason });
      socket.emit('stages', this.stageFeed.snapshot(action.to));
    } else if (action.kind === 'disconnect') {
      this.live.forget(action.id);
      this.liveness.forget(action.id);
      this.sockets.delete(action.id);
      socket.disconnect(true);
    } else {
      socket.emit('flagged', { kind: action.flag, reason: action.reason });
      for (const room of socket.rooms) if (room.startsWith('stage:')) socket.leave(room);
    }
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
    return this.stageFeed.publish(); // in scale-out mode, a process that does not publish asks the one that does
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
