import type { Server } from 'socket.io';
import { ProtocolError, type ClientMessage, type ProtocolErrorCode, type StageDelta } from '@train-at-home/protocol';
import type { ActivationRegistry } from './activations';
import type { LiveState } from './dashboard/live';
import { LIVENESS_FLUSH_MS } from './liveness';
import type { PhaseMachine } from './phases';
import type { JobLease, MinerAction, RunContext } from './run-state';
import type { StageMapFeed } from './stage-map';
import { ProbeError } from './jobs/probe-error';

/**
 * Scale-out mode: several coordinator processes serve one run behind a load
 * balancer, with the run's state in one PostgreSQL database (DATABASE_URL)
 * and socket.io's rooms and broadcasts through Redis (REDIS_URL, the
 * `@socket.io/redis-adapter`).
 *
 * - **Singleton jobs** (the validator and settlement, local miners, the stage
 *   map's publisher, the sweep of miners whose process died) run in the one
 *   process that holds the run's JobLease, a PostgreSQL advisory lock; when that
 *   process dies its lock goes with its connection and another takes it over.
 * - **A miner's connection lives in one process.** What another process has
 *   to say to it (a relayed signal or frame, an audit, a move, a flag) goes to
 *   every process as one server-side message, and the one holding it acts
 *   (`Coordinator.toMiner`).
 * - **The stage map** is published by the lease holder, to the rooms of every
 *   process; the others mirror its deltas, so a snapshot or a REST fetch from
 *   any process follows the same numbering, and ask it to look when a miner
 *   registers or leaves with them.
 * - **The merge phases** run in the lease holder's PhaseMachine. Another
 *   process passes it its miners' `merge-ready` and `merged` (and answers
 *   each miner with the holder's answer), and every transfer whose two
 *   receipts it verified; it shows the stages' rounds as the holder publishes
 *   them each second. A new holder resumes the rounds from the database, as a
 *   restarted coordinator does.
 * - **Microbatches** announced on another process are found in the database
 *   (`ActivationRegistry.shared`: a report that waits for one looks again).
 *
 * Not yet shared (README.md, "Scale-out"): the dashboard's live figures are
 * each process's own.
 */

/** Server-side messages between the processes of one run. */
const MINER = 'tah:miner';
/** How often the lease holder looks for miners whose process died (their heartbeats stopped reaching the database). */
const ORPHAN_SWEEP_MS = 5000;
const LOOK = 'tah:stage-map';
const DELTA = 'tah:stage-delta';
const VIEWS = 'tah:stage-views';
const PHASE_CALL = 'tah:phase-call';
const VERIFIED = 'tah:verified';
const PHASES = 'tah:phases';
const PROBE = 'tah:probe';
const LIVE = 'tah:live';
/** How long a dashboard's snapshot waits for the other processes' live figures before it goes on without them. */
export const LIVE_WAIT_MS = 1500;

type PhaseCall = { kind: 'ready'; minerId: string; msg: ClientMessage<'merge-ready'>; arrived: string } | { kind: 'merged'; minerId: string; msg: ClientMessage<'merged'>; arrived: string };
type PhaseAnswer = { ok: true } | { ok: false; code: ProtocolErrorCode; message: string };

/** What scale-out uses of its process's run: the parts it shares with the other processes. */
export interface ScaleOutHost extends RunContext {
  readonly phases: PhaseMachine;
  readonly stageFeed: StageMapFeed;
  readonly activations: ActivationRegistry;
  readonly live: LiveState;
  readonly relayed: { signalBytes: number; frameBytes: number };
  /** `forwarded`: the action came from another process; it is not passed on again. */
  toMiner(action: MinerAction, forwarded?: boolean): void;
  publishStageMap(): Promise<void>;
  rebalanceStages(): Promise<void>;
}

/** One coordinator process's part in a scaled-out run (attached as `coordinator.scaleOut`). */
export class ScaleOut {
  private lastOrphanSweep = 0;
  /** The lease holder's spot checks (jobs/spot-checks.ts): a probe's payload uploaded to another process is passed to them. */
  probeAnswers?: (probeId: string, minerId: string, bytes: Uint8Array) => Promise<void>;
  /** Set when the process stops: nothing more is sent to the others. */
  private closed = false;

  constructor(
    private readonly io: Server,
    private readonly c: ScaleOutHost,
    readonly lease: JobLease,
    /** A miner silent this long in the database (its process died) is dropped by the lease holder. */
    private readonly silentMs: number,
  ) {
    io.on(MINER, (action: MinerAction) => c.toMiner(action, true));
    io.on(LOOK, () => {
      if (lease.held) void c.publishStageMap().catch((err: unknown) => c.log.error({ err }, 'could not publish the stage map'));
    });
    io.on(DELTA, (delta: unknown) => c.stageFeed.mirror(delta));
    io.on(VIEWS, (ack: unknown) => {
      if (typeof ack === 'function') ack(lease.held ? c.stageFeed.view([...Array(c.run.stages).keys()]) : null);
    });
    // The merge phases: the holder answers what another process's miners said; the others answer nothing.
    io.on(PHASE_CALL, (call: PhaseCall, ack: unknown) => {
      if (typeof ack !== 'function') return;
      if (!lease.held || !c.phases.leading) return ack(null);
      void this.answer(call).then((a) => ack(a));
    });
    io.on(VERIFIED, (v: { activationId: string; from: string; to: string; a: string; b: string }) => {
      if (c.phases.leading) c.phases.noteVerified(v.activationId, v.from, v.to, v.a, v.b);
    });
    io.on(PHASES, (status: unknown) => {
      if (!lease.held) c.phases.mirror(status);
    });
    // The dashboard's live figures of this process's miners, for a viewer connected to another process.
    io.on(LIVE, (ack: unknown) => {
      if (typeof ack === 'function') ack(c.live.summary(c.relayed));
    });
    io.on(PROBE, (p: { probeId: string; minerId: string; bytes: Uint8Array }, ack: unknown) => {
      if (typeof ack !== 'function') return;
      if (!lease.held || !this.probeAnswers) return ack(null);
      this.probeAnswers(p.probeId, p.minerId, new Uint8Array(p.bytes)).then(
        () => ack({ ok: true }),
        (e: unknown) => ack(e instanceof ProbeError ? { ok: false, code: e.code, message: e.detail } : { ok: false, code: 'NO_SUCH_PROBE', message: 'the validator could not take this answer' }),
      );
    });
    c.phases.remote = {
      call: (kind, minerId, msg, arrived) => this.callHolder({ kind, minerId, msg, arrived } as PhaseCall),
      verified: (activationId, from, to, a, b) => this.emit(VERIFIED, { activationId, from, to, a, b }),
    };
    c.activations.shared = true;
    lease.onChange((held) => {
      if (held) {
        void c.stageFeed.lead().catch((err: unknown) => c.log.error({ err }, 'could not publish the stage map'));
        void c.phases.lead().catch((err: unknown) => c.log.error({ err }, 'could not resume the merge phases'));
      } else {
        c.phases.leading = false;
        this.follow();
      }
    });
    if (!lease.held) this.follow();
  }

  /** The lease holder handles a merge answer another process's miner gave: the miner hears this answer. */
  private async answer(call: PhaseCall): Promise<PhaseAnswer> {
    try {
      if (call.kind === 'ready') await this.c.phases.onReady(call.minerId, call.msg, call.arrived);
      else await this.c.phases.onMerged(call.minerId, call.msg, call.arrived);
      return { ok: true };
    } catch (e) {
      if (e instanceof ProtocolError) return { ok: false, code: e.code, message: e.detail };
      this.c.log.error({ err: e }, 'a merge answer from another process failed');
      return { ok: false, code: 'OUT_OF_PHASE', message: 'the coordinator could not take this answer' };
    }
  }

  /** A probe's payload uploaded here, for the lease holder's spot checks; its answer (or named refusal) is theirs. */
  async passProbe(probeId: string, minerId: string, bytes: Uint8Array): Promise<void> {
    const answer = await this.askHolder<{ ok: boolean; code?: ProbeError['code']; message?: string }>(PROBE, { probeId, minerId, bytes }, 'the validator');
    if (typeof answer === 'string') throw new ProbeError('NO_SUCH_PROBE', answer);
    if (!answer.ok) throw new ProbeError(answer.code ?? 'NO_SUCH_PROBE', answer.message ?? 'refused');
  }

  /** A merge answer of a miner connected here, for the phases the lease holder runs. */
  private async callHolder(call: PhaseCall): Promise<void> {
    const answer = await this.askHolder<PhaseAnswer>(PHASE_CALL, call, 'the merge phases');
    if (typeof answer === 'string') throw new ProtocolError('OUT_OF_PHASE', answer);
    if (!answer.ok) throw new ProtocolError(answer.code, answer.message);
  }

  /**
   * Sends every other process a request that only the lease holder answers (the others answer null): its
   * answer, or why there is none (a sentence naming `what` the holder runs).
   */
  private async askHolder<T extends { ok: boolean }>(event: string, payload: unknown, what: string): Promise<T | string> {
    let answers: unknown[];
    try {
      answers = await this.io.serverSideEmitWithAck(event, payload);
    } catch {
      return `the coordinator process that runs ${what} did not answer in time`;
    }
    return answers.find((a): a is T => typeof a === 'object' && a !== null && 'ok' in a) ?? `no coordinator process runs ${what} right now`;
  }

  private follow(): void {
    this.c.stageFeed.follow(
      () => this.emit(LOOK),
      () => this.resync(),
    );
    this.resync();
  }

  /** A follower's mirror from the publisher (when it starts following, and after a missed delta). */
  private resync(): void {
    if (this.closed) return;
    // Every other process answers (the adapter waits up to its requestsTimeout, 5 s); the lease holder's answer is the map.
    this.io.serverSideEmitWithAck(VIEWS).then(
      (answers: unknown[]) => {
        for (const views of answers) if (views) this.c.stageFeed.replace(views);
      },
      (err: unknown) => this.c.log.warn({ err }, 'not every coordinator process answered for the stage map'),
    );
  }

  /**
   * Every other process's live figures (LiveState.summary), as answered within LIVE_WAIT_MS: a process slow to
   * answer is left out of this snapshot rather than hold the dashboard (the adapter itself waits 5 s).
   */
  othersLive(): Promise<unknown[]> {
    if (this.closed) return Promise.resolve([]);
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve([]), LIVE_WAIT_MS);
      this.io.serverSideEmit(LIVE, (_err: Error | null, answers: unknown[]) => {
        clearTimeout(timer);
        resolve(Array.isArray(answers) ? answers : []);
      });
    });
  }

  /** Whether a miner of this run is active (connected to some process). */
  async isActive(id: string): Promise<boolean> {
    const [row] = await this.c.db.query(`SELECT 1 FROM miners WHERE id = $1 AND run_id = $2 AND status = 'active'`, [id, this.c.runId]);
    return Boolean(row);
  }

  /** Sends what concerns a miner connected to another process to every process; the one holding it acts. */
  forward(action: MinerAction): void {
    this.emit(MINER, action);
  }

  private emit(event: string, ...args: unknown[]): void {
    if (!this.closed) this.io.serverSideEmit(event, ...args);
  }

  /** The process stops: what its departing connections would tell the others is not sent. */
  close(): void {
    this.closed = true;
  }

  /** The publisher's delta, for the other processes' mirrors. */
  deltaPublished(delta: StageDelta): void {
    if (this.lease.held) this.emit(DELTA, delta);
  }

  /**
   * The lease holder's sweep: miners still active in the database whose
   * heartbeats stopped reaching it (each process writes its miners' times every
   * LIVENESS_FLUSH_MS) belonged to a process that died. They are dropped, and
   * their stages refilled, as a silent miner is.
   */
  async tick(): Promise<void> {
    if (!this.lease.held) return;
    // The stages' rounds and phases, for the other processes' registrations, loss reports and status.
    if (this.c.phases.leading) this.emit(PHASES, this.c.phases.status());
    if (Date.now() - this.lastOrphanSweep < ORPHAN_SWEEP_MS) return;
    this.lastOrphanSweep = Date.now();
    const gone = await this.c.db.query<{ id: string }>(
      `UPDATE miners SET status = 'dropped' WHERE run_id = $1 AND status = 'active' AND last_seen_at < now() - make_interval(secs => $2) RETURNING id`,
      [this.c.runId, (this.silentMs + 2 * LIVENESS_FLUSH_MS) / 1000],
    );
    if (gone.length === 0) return;
    this.c.log.warn({ miners: gone.length }, 'dropped miners whose coordinator process stopped');
    // One still connected somewhere (its process's writes stalled) is disconnected, and registers again.
    for (const { id } of gone) this.c.toMiner({ id, kind: 'disconnect' });
    await this.c.rebalanceStages();
  }
}
