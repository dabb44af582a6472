import type { Coordinator } from '../coordinator';
import { epochAt, epochWindow } from '../ledger/epochs';
import { runStartMs } from '../ledger/queries';
import { settleEpoch, settledEpochs } from '../ledger/settle';
import { verifiedWork } from './accounting';
import type { ValidatorProcess } from '../validator/client';
import { droppedOnClose } from '../validator/compute';
import type { ScoreJob, ScoreResult } from '../validator/scoring';

/** Ended epochs settled per tick at most (a coordinator back after a long stop catches up over a few ticks). */
const EPOCHS_PER_TICK = 4;

/**
 * The emission clock: once an epoch's window has ended (the epoch and the
 * `holdEpochs` after it) and the audits of its rounds are done, its evidence is gathered
 * (verified work of the epoch; CLASP's pathways, spot checks and flags over
 * the rolling window), scored by the validator process, CLASP's harmful
 * miners are flagged, and the epoch is settled in one transaction
 * (ledger/settle.ts). A validator that dies mid-way fails the attempt by
 * name; the next tick settles the epoch again from scratch, and the
 * settlement's primary key makes sure it lands exactly once.
 */
export class Settler {
  private busy = false;
  private runStartMs?: number;
  /** The last attempt's error, for operators. */
  lastError?: string;
  /** How long the validator took to score each epoch settled here (ms, by epoch). */
  readonly scoreMs = new Map<number, number>();

  constructor(
    private readonly c: Coordinator,
    private readonly validator: ValidatorProcess,
  ) {}

  async start(): Promise<number> {
    this.runStartMs ??= await runStartMs(this.c.db, this.c.runId);
    return this.runStartMs;
  }

  /** The epoch under way now. */
  async current(): Promise<number> {
    return epochAt(await this.start(), this.c.run.incentives.epochMs, Date.now());
  }

  /** Settles every epoch ended at least settleAfterMs ago and not yet settled, oldest first. */
  async tick(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const inc = this.c.run.incentives;
      const current = epochAt(await this.start(), inc.epochMs, Date.now() - inc.settleAfterMs);
      const settled = new Set(await settledEpochs(this.c.db, this.c.runId));
      let done = 0;
      // A window's earnings wait for its audits: epoch e waits for those of every round through epoch e + hold.
      const hold = inc.holdEpochs ?? 0;
      for (let e = 0; e + hold < current && done < EPOCHS_PER_TICK; e++) {
        if (settled.has(e)) continue;
        // An epoch is not settled while an audit drawn before its window's last epoch was due, or drawn from a
        // round with work in its window (begun before the window's end), is still running (each is bounded by
        // auditTimeoutMs and its replay), so a failed audit's flag lands first and zeroes the epoch. A round begun
        // before the window's end is drawn only when it closes (a cheat caught in the round that straddles the end
        // would otherwise be paid for the epoch): the epoch waits for that too, at most holdMs past its due time (a
        // stage nobody trains never closes its round).
        const { startsAt } = epochWindow(await this.start(), inc.epochMs, e);
        const { endsAt } = epochWindow(await this.start(), inc.epochMs, e + hold);
        const due = new Date(endsAt.getTime() + inc.settleAfterMs);
        const m = this.c.run.merge;
        // A round with work lasts at most about this long; one begun earlier and still open is a stage nobody trains.
        const holdMs = m.maxTrainingMs + m.readyMs + m.roundMs + (inc.auditTimeoutMs ?? 30_000);
        const [held] = await this.c.db.query<{ pending: number }>(
          `SELECT count(*)::int AS pending FROM audits a LEFT JOIN audit_rounds r ON r.run_id = a.run_id AND r.stage = a.stage AND r.round = a.round
           WHERE a.run_id = $1 AND a.status IN ('open', 'replaying', 'expired') AND (a.created_at <= $2 OR r.created_at < $3)`,
          [this.c.runId, due, endsAt],
        );
        if ((held?.pending ?? 0) > 0) break;
        if (Date.now() < due.getTime() + holdMs) {
          // Rounds still to be drawn, of stages miners are training now (a stage nobody holds has no round to close):
          // miners connected here, or (scale-out) to any process (Coordinator.canReach): the miners of the process
          // settling are not all the run's.
          const undrawn = await this.c.db.query<{ stage: number }>(
            `SELECT DISTINCT r.stage FROM audit_rounds r JOIN miners m ON m.run_id = r.run_id AND m.stage = r.stage
             WHERE r.run_id = $1 AND r.created_at < $2 AND r.created_at >= $3 AND r.revealed_at IS NULL AND r.rate > 0 AND m.status = 'active' AND ($5 OR m.id = ANY($4::text[]))`,
            [this.c.runId, endsAt, new Date(startsAt.getTime() - holdMs), [...this.c.sockets.keys()], Boolean(this.c.scaleOut)],
          );
          if (undrawn.length > 0) break;
        }
        await this.settle(e);
        done++;
      }
      this.lastError = undefined;
    } catch (e) {
      this.lastError = (e as Error).message;
      if (!droppedOnClose(e)) this.c.log.warn({ err: e }, 'settlement attempt failed; retrying on the next tick');
    } finally {
      this.busy = false;
    }
  }

  /** Scores and settles one ended epoch; `settled: false` if it already was. */
  async settle(epoch: number): Promise<{ settled: boolean; result: ScoreResult }> {
    const c = this.c;
    const inc = c.run.incentives;
    const start = await this.start();
    const window = epochWindow(start, inc.epochMs, epoch);
    const from = epochWindow(start, inc.epochMs, Math.max(0, epoch - inc.windowEpochs + 1)).startsAt;
    const { work } = await verifiedWork(c.db, c.runId, window.startsAt, window.endsAt);
    const { microbatches } = await verifiedWork(c.db, c.runId, from, window.endsAt);
    const flags = await c.flags.standing();
    const checks = await c.db.query<{ miner_id: string; passed: number; failed: number }>(
      `SELECT miner_id, count(*) FILTER (WHERE passed)::int AS passed, count(*) FILTER (WHERE NOT passed)::int AS failed
       FROM spot_checks WHERE run_id = $1 AND created_at >= $2 AND created_at < $3 GROUP BY miner_id`,
      [c.runId, from, window.endsAt],
    );
    const ids = [...work.keys()];
    const miners = ids.length
      ? await c.db.query<{ id: string; address: string; stage: number }>('SELECT m.id, coalesce(l.address, m.address) AS address, m.stage FROM miners m LEFT JOIN payout_addresses l ON l.miner_id = m.id WHERE m.run_id = $1 AND m.id = ANY($2)', [c.runId, ids])
      : [];
    const info = new Map(miners.map((m) => [m.id, m]));
    const job: ScoreJob = {
      epoch,
      emission: BigInt(inc.emissionPerEpoch).toString(),
      miners: ids.map((id) => ({
        minerId: id,
        // The payout account: the wallet the miner linked when it settles (payout_addresses), else the miner's own SS58 address.
        account: info.get(id)?.address ?? id,
        stage: info.get(id)?.stage ?? null,
        work: work.get(id)!,
        flags: (flags.get(id) ?? []).map((f) => ({ kind: f.kind, reason: f.reason })),
        spotChecks: { passed: checks.find((r) => r.miner_id === id)?.passed ?? 0, failed: checks.find((r) => r.miner_id === id)?.failed ?? 0 },
      })),
      // CLASP weighs honest pathways only: a flagged miner's losses say nothing about its partners.
      observations: microbatches.filter((m) => !m.pathway.some((id) => flags.has(id))).map((m) => ({ round: m.round, pathway: m.pathway, loss: m.loss })),
    };
    const started = performance.now();
    const result = await this.validator.request<ScoreResult>({ kind: 'score', score: job });
    this.scoreMs.set(epoch, performance.now() - started);
    for (const f of result.newFlags) await c.flags.raise(f.minerId, f.kind, f.reason, f.evidence);
    const { settled } = await settleEpoch(c.db, {
      runId: c.runId,
      epoch,
      startsAt: window.startsAt,
      endsAt: window.endsAt,
      emission: BigInt(job.emission),
      allocated: BigInt(result.allocated),
      scores: result.scores,
      payouts: result.payouts.map((p) => ({ ...p, amount: BigInt(p.amount) })),
      merkleRoot: result.merkleRoot,
    });
    if (settled) c.log.info({ epoch, payouts: result.payouts.length, allocated: result.allocated }, 'epoch settled');
    return { settled, result };
  }
}
