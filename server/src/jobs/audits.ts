// One file over 400 lines: the whole-round audit is one lifecycle (draw, deadline, intake, replay, sweep, restarts) over one
// table, and its parts share the Auditor's state; issue 40 splits it by role along with the run state it queries.
import { auditCommitment, drawRateOf, isAudited } from '@train-at-home/incentives';
import { PROTOCOL_VERSION } from '@train-at-home/protocol';
import { EXACT_REPLAY_BACKEND, MAX_RECORD_BYTES, REPLAY_TOLERANCE, RecordError, decodeRecord, recordFloorBytes, roundPrecision, type AuditInputs, type AuditVerdict, type ConfirmedTransfer, type ReplayTolerance, type RoundRecord } from '@train-at-home/swarm';
import { PRESETS, countStageParameters, stageSpecs } from '@train-at-home/model';
import { randomBytes } from 'node:crypto';
import type { Coordinator } from '../coordinator';
import type { Queryable } from '../db/database';
import type { ValidatorProcess } from '../validator/client';
import type { AuditJob } from '../validator/compute';
import { droppedOnClose } from '../validator/compute';

export type { AuditJob } from '../validator/compute';

export { MAX_RECORD_BYTES };

/** A miner given a new stage may still have its previous stage's sends in flight this long: not part of the new stage's round. */
export const STAGE_TAKEN_GRACE_MS = 5_000;

/**
 * Replays waiting in the validator halve the audit rate of the next rounds drawn, once for every round's worth
 * (merge.maxTrainingMs + merge.roundMs) of replay time they hold at the validator's mean time per replay (this
 * before the first replay finished). Counted in replays alone (8), one stage's round of 9 replicas drawn at once
 * halved the rate though the validator cleared it in seconds: the adversarial test's cheats went unaudited for epochs.
 */
export const FIRST_REPLAY_MS_GUESS = 1_000;
/**
 * A replica with fewer audits passed than this in the run is drawn at the full rate (incentives.unprovenAuditRate,
 * 1 by default) whatever the backlog (the rate a backlog lowers is that of replicas with a record), and its replays
 * go first in the validator's queue: the validator's time goes where there is least evidence, so a cheat from a
 * miner's first rounds is caught in its first rounds, however far behind the validator is. Only an audit of a round
 * with at least PROVEN_STEPS microbatches trained counts: a round of one proves little of the next (bench:audit's
 * cheaters passed such rounds, then went undrawn at the run's rate for two epochs).
 */
export const PROVEN_AUDITS = 2;
/*
 * An audit whose record is replaying, of a round with at least PROVEN_STEPS microbatches trained (as the record
 * says: a record that says otherwise fails its replay), counts toward PROVEN_AUDITS for the draw while it
 * replays: each new identity costs the validator at most PROVEN_AUDITS replays at a time beyond the run's rate.
 * Counted only when decided, every round of every new miner was drawn until the validator caught up, which on a
 * busy validator it never did: its backlog (and every settlement waiting on it) grew with each new miner (the
 * newcomer e2e test's first epoch waited more than 6 minutes on 2 cores). Detection stays certain for a miner
 * that cheats in every round: such a replay fails, and it flags the miner before any later epoch settles (an
 * epoch waits for every audit drawn before it was due). One that passes too little work, or is skipped, stops
 * counting, and the miner is drawn at the full rate again; an audit not yet answered never counts.
 */
/** Microbatches trained (optimizer steps replayed) an audited round must hold for its pass to count toward PROVEN_AUDITS. */
export const PROVEN_STEPS = 2;
/** A replay not finished this long after its audit's deadline is taken as lost (skipped: the validator's fault, not the miner's). */
export const AUDIT_REPLAY_LIMIT_MS = 300_000;
/**
 * The process that took a record marks its audit as still replaying (audits.replay_seen) at every tick; one not
 * marked for this long was lost with its process (a restart, or a scale-out process that died). It is asked of its
 * miner again (miners keep their last few rounds' records), and, unanswered, skipped rather than held against the
 * miner: before, it held every settlement until AUDIT_REPLAY_LIMIT_MS past its deadline.
 */
export const REPLAY_LOST_MS = 30_000;

/**
 * A miner whose upload rate has not been measured yet (it uploaded no record) is given the time its record takes at
 * this rate: 5 Mbit/s, a slow home uplink.
 */
export const ASSUMED_UPLOAD_BYTES_PER_SEC = 625_000;
/** Smaller uploads say little of a line's rate (latency dominates them): not measured. */
export const MEASURED_UPLOAD_MIN_BYTES = 256 * 1024;
/**
 * The hard bound unless the run sets one (incentives.auditGraceMs): an answer is taken and replayed for this long
 * after its deadline, so an honest miner on a slow or busy line is replayed, not flagged; only one that has not answered
 * 10 minutes past its deadline is flagged AUDIT_UNANSWERED, and the epochs its round is in wait for it meanwhile.
 */
export const AUDIT_GRACE_MS = 600_000;

/**
 * An audit's deadline, from when it is drawn: the run's allowance (auditTimeoutMs: finding and encoding the record,
 * the request's way there) plus the upload, at its miner's measured rate (the assumed rate until one is measured), of
 * the record and of those of its audits still open (a miner uploads them one at a time, oldest first). A record's
 * size: the larger of its floor (start weights and optimizer moments: record.ts) and the miner's last record.
 */
export function auditDeadlineMs(timeoutMs: number, recordBytes: number, uploadBytesPerSec?: number | null): number {
  const rate = uploadBytesPerSec && uploadBytesPerSec > 0 ? uploadBytesPerSec : ASSUMED_UPLOAD_BYTES_PER_SEC;
  return Math.ceil(timeoutMs + (1000 * recordBytes) / rate);
}

/** An open audit is sent to its miner again this often until answered (one sent while its socket was down is lost). */
export const AUDIT_RESEND_MS = 10_000;

/** The backend the validator replays on: a round is bit-exact only on the same one. */
export const AUDIT_BACKEND = EXACT_REPLAY_BACKEND;

export class AuditError extends Error {
  override name = 'AuditError';
  constructor(
    readonly code: 'NO_SUCH_AUDIT' | 'NOT_YOUR_AUDIT' | 'WRONG_RECORD' | 'BAD_RECORD' | 'TOO_LARGE',
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

/** Where the window of a round's sends (those its record must hold) comes from (kept with the verdict: evidence for an AUDIT_INCOMPLETE). */
export type WindowSource = 'anchor-merged' | 'anchor-closed' | 'previous-ready' | 'stage-given' | 'restarted' | 'none';

/**
 * When a miner's audited round began, as the coordinator saw it: the sends it confirmed from then until its
 * merge-ready must all be in its record.
 *   - its report of the anchor merge (the round's sends come after it on the same socket): `anchor-merged`;
 *   - without that report, after its previous merge-ready (`previous-ready`), and not before the anchor's merge round
 *     closed (`anchor-closed`): a record anchored at that round began when the miner closed the one before it for
 *     that merge, and what it sent until the round closed is paid as the anchor round's or earlier (accounting.ts,
 *     drawableRounds), not this one's. This holds with no previous merge-ready as well: a replica whose merge-ready
 *     for the anchor was refused (late for it) closed its record all the same and commits the next round from there;
 *   - a round begun by taking the stage up: from when it was given the stage, after a grace (`stage-given`);
 *   - and never before the miner's restart, when this is the first round its new process committed (`restarted`):
 *     what its previous process sent before is in no record it has (and is not paid: accounting.ts, restarts).
 */
export function roundWindow(w: RoundTimes & { restarted?: Date | string | null }): { from: string; by: WindowSource } {
  const found = windowBeforeRestart(w);
  if (w.restarted && new Date(w.restarted) > new Date(found.from)) return { from: iso(w.restarted), by: 'restarted' };
  return found;
}

type RoundTimes = { anchorRound: number; anchorMerged?: string | null; anchorEnded?: Date | string | null; previousReady?: Date | string | null; given?: Date | string | null };
const iso = (t: Date | string): string => new Date(t).toISOString();

function windowBeforeRestart(w: RoundTimes): { from: string; by: WindowSource } {
  if (w.anchorMerged) return { from: iso(w.anchorMerged), by: 'anchor-merged' };
  // (A stage taken up from a checkpoint of the anchor round: that round closed before the miner came.)
  const base = w.previousReady ? { at: new Date(w.previousReady), by: 'previous-ready' as const } : w.given ? { at: new Date(w.given), by: 'stage-given' as const } : undefined;
  const closed = w.anchorRound > 0 && w.anchorEnded ? new Date(w.anchorEnded) : undefined;
  if (closed && (!base || closed > base.at)) return { from: iso(closed), by: 'anchor-closed' };
  return base ? { from: iso(base.at), by: base.by } : { from: new Date(0).toISOString(), by: 'none' };
}

/**
 * Whole-round audits (the guarantee that a cheat a miner could time does not
 * pay):
 *
 *   1. Commit, then choose: when a stage's round begins the coordinator
 *      commits to a secret (audit_rounds); replicas commit to their round's
 *      end and to their merge contribution's Merkle root with merge-ready
 *      (round_commitments; owners refuse slices the root does not prove),
 *      and to every transfer with receipts. When the round closed the secret is revealed, and the pairs
 *      it draws (audit-choice.ts) are asked for their record.
 *   2. The record (the miner's, audit/record.ts) is replayed whole in the
 *      validator's process (audit/replay.ts): from the checkpoint and the
 *      committed optimizer state, every op in order, each byte checked
 *      against a confirmed transfer, each output, gradient, loss and the end
 *      state against what the miner sent and committed.
 *   3. A failed audit, or none answered by the deadline while the miner is
 *      still here, flags the miner: it earns nothing in the window (scores
 *      are zero for flagged miners) and leaves the run.
 *
 * Rounds that cannot be replayed through no fault of the miner (its
 * backend is not the validator's, the checkpoint is gone) are recorded as
 * skipped, never failed.
 */
export class Auditor {
  readonly stats = { drawn: 0, passed: 0, failed: 0, unanswered: 0, skipped: 0, reopened: 0, validatorMs: 0, replayedOps: 0, rateLowered: 0, clippedDrawn: 0 };
  private busy = false;
  /** When each open audit was last sent to its miner (a request sent while its socket was down is sent again). */
  private readonly sentAt = new Map<string, number>();
  /** Audits whose record this process took and is replaying (or has queued at its validator). */
  private readonly replaying = new Set<string>();

  constructor(
    private readonly c: Coordinator,
    private readonly validator: ValidatorProcess,
  ) {
    this.stageParameters = stageSpecs(PRESETS[c.run.preset], c.run).map(countStageParameters);
  }

  /** Each stage's parameter count (what its records hold at least). */
  private readonly stageParameters: number[];

  private get rate(): number {
    return this.c.run.incentives.auditRate ?? 0;
  }

  /** The allowance a drawn miner has before its record's upload (auditDeadlineMs). */
  private get timeoutMs(): number {
    return this.c.run.incentives.auditTimeoutMs ?? 30_000;
  }

  /** How long past its deadline an answer is still taken (the hard bound). */
  private get graceMs(): number {
    return this.c.run.incentives.auditGraceMs ?? AUDIT_GRACE_MS;
  }

  /**
   * Commits to the audit draw of a stage's round before any of its work (idempotent), at the run's
   * audit rate, halved for every round's worth of replay time the validator has waiting (FIRST_REPLAY_MS_GUESS):
   * the rate is committed with the draw (anyone can check it), and every lowered one is counted.
   */
  async commit(stage: number, round: number): Promise<void> {
    const secret = randomBytes(32).toString('hex');
    const [behind] = await this.c.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM audits WHERE run_id = $1 AND status = 'replaying'`, [this.c.runId]);
    const replays = this.stats.passed + this.stats.failed;
    const perReplayMs = replays > 0 ? this.stats.validatorMs / replays : FIRST_REPLAY_MS_GUESS;
    const roundMs = this.c.run.merge.maxTrainingMs + this.c.run.merge.roundMs;
    const halvings = Math.min(10, Math.floor(((behind?.n ?? 0) * perReplayMs) / roundMs));
    // Unproven replicas are drawn at the full rate, committed beside the round's (a run from before it had none: its own rate).
    const full = this.rate > 0 ? Math.max(this.rate, this.c.run.incentives.unprovenAuditRate ?? this.rate) : 0;
    const [row] = await this.c.db.query(
      `INSERT INTO audit_rounds (run_id, stage, round, commitment, secret, rate, full_rate) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (run_id, stage, round) DO NOTHING RETURNING round`,
      [this.c.runId, stage, round, auditCommitment(secret), secret, this.rate / 2 ** halvings, full],
    );
    if (row && halvings > 0) this.stats.rateLowered++;
  }

  /** A stage's round closed: reveal its draw, ask the drawn replicas for their records, and commit to the next round. */
  async roundClosed(stage: number, round: number, participants: string[]): Promise<void> {
    await this.commit(stage, round + 1);
    if (this.rate <= 0) return;
    // A replica restarted since it committed the round (restarts, below) keeps no record of it: not drawn, and not paid for it (accounting.ts).
    const committed = await this.c.db.query<{ miner_id: string }>(
      `SELECT miner_id FROM round_commitments c WHERE run_id = $1 AND stage = $2 AND round = $3
         AND NOT EXISTS (SELECT 1 FROM miner_restarts x WHERE x.run_id = c.run_id AND x.miner_id = c.miner_id AND x.at > c.ready_at)`,
      [this.c.runId, stage, round],
    );
    const eligible = committed.map((r) => r.miner_id).filter((id) => participants.includes(id));
    // Replicas with too few audits passed yet are drawn at the full rate (PROVEN_AUDITS, unprovenAuditRate): named with the reveal, so anyone can check the draw.
    const passed = await passedAudits(this.c, eligible, { inFlight: true });
    const unproven = eligible.filter((id) => (passed.get(id) ?? 0) < PROVEN_AUDITS);
    const [draw] = await this.c.db.query<{ secret: string; rate: number; full_rate: number | null }>(
      `UPDATE audit_rounds SET revealed_at = now(), unproven = $4 WHERE run_id = $1 AND stage = $2 AND round = $3 RETURNING secret, rate, full_rate`,
      [this.c.runId, stage, round, JSON.stringify(unproven)],
    );
    // No commitment made before the round (it began before this process did): nothing is drawn.
    if (!draw) return;
    const rateOf = drawRateOf({ rate: draw.rate, fullRate: draw.full_rate ?? undefined, unproven });
    // And, whatever the draw, each replica whose contribution both owners of every partition clipped (CenteredClip: farther
    // from its stage peers' than the radius, all along its vector, as a scaled or random one is; an honest one is clipped
    // here and there, in a partition or two): evidence anyone can read in the round's merge events, so it is audited for sure.
    const clipped = await this.c.db.query<{ miner_id: string }>(
      `SELECT miner_id FROM (SELECT miner_id FROM merge_events WHERE run_id = $1 AND stage = $2 AND round = $3 AND kind = 'clipped' AND miner_id IS NOT NULL
         GROUP BY miner_id, detail ->> 'partition' HAVING count(DISTINCT reporter) >= 2) pairs
       GROUP BY miner_id HAVING count(*) >= (SELECT jsonb_array_length(participants) FROM epochs WHERE run_id = $1 AND stage = $2 AND epoch = $3)`,
      [this.c.runId, stage, round],
    );
    const outliers = new Set(clipped.map((r) => r.miner_id));
    const drawn = eligible.filter((id) => isAudited(draw.secret, stage, round, id, rateOf(id)));
    const forced = eligible.filter((id) => outliers.has(id) && !drawn.includes(id));
    this.stats.clippedDrawn += forced.length;
    const chosen = [...drawn, ...forced];
    for (const minerId of chosen) {
      const [miner] = await this.c.db.query<{ backend: string; upload_bytes_per_sec: number | null; record_bytes: number | null }>(
        'SELECT backend, upload_bytes_per_sec, record_bytes FROM miners WHERE id = $1 AND run_id = $2',
        [minerId, this.c.runId],
      );
      const id = randomBytes(16).toString('hex');
      this.stats.drawn++;
      if (miner?.backend !== AUDIT_BACKEND && !REPLAY_TOLERANCE[miner?.backend ?? '']) {
        // Another backend's arithmetic differs in its last bits: an exact replay would fail an honest miner, and none is measured for this one.
        await this.insert(id, stage, round, minerId, 'skipped', 'BACKEND', { backend: miner?.backend ?? null }, 0);
        this.stats.skipped++;
        continue;
      }
      // A record of this stage could not be uploaded (the miner keeps none: audit/record.ts).
      const floor = recordFloorBytes(this.stageParameters[stage] ?? 0, miner?.backend !== EXACT_REPLAY_BACKEND);
      if (floor > MAX_RECORD_BYTES) {
        await this.insert(id, stage, round, minerId, 'skipped', 'RECORD_TOO_LARGE', { bytes: floor, limit: MAX_RECORD_BYTES }, 0);
        this.stats.skipped++;
        continue;
      }
      const recordBytes = Math.max(floor, miner?.record_bytes ?? 0);
      // A miner uploads its records one at a time, oldest first: those of its audits still open go before this one.
      const [ahead] = await this.c.db.query<{ bytes: number }>(
        `SELECT coalesce(sum((detail ->> 'recordBytes')::float8), 0)::float8 AS bytes FROM audits WHERE run_id = $1 AND miner_id = $2 AND status = 'open'`,
        [this.c.runId, minerId],
      );
      const queuedBytes = Number(ahead?.bytes ?? 0);
      const deadlineMs = auditDeadlineMs(this.timeoutMs, queuedBytes + recordBytes, miner?.upload_bytes_per_sec);
      const detail = { recordBytes, queuedBytes, uploadBytesPerSec: miner?.upload_bytes_per_sec ?? null, deadlineMs, graceMs: this.graceMs };
      await this.insert(id, stage, round, minerId, 'open', null, detail, deadlineMs);
      this.c.sendToMiner(minerId, 'audit', { v: PROTOCOL_VERSION, auditId: id, stage, round, deadlineMs, finalMs: deadlineMs + this.graceMs });
      this.sentAt.set(id, Date.now());
    }
  }

  private async insert(id: string, stage: number, round: number, minerId: string, status: string, reason: string | null, detail: object | null, timeoutMs: number): Promise<void> {
    await this.c.db.query(
      `INSERT INTO audits (id, run_id, stage, round, miner_id, status, reason, detail, deadline, finished_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9), CASE WHEN $6 = 'open' THEN NULL ELSE now() END)
       ON CONFLICT (run_id, stage, round, miner_id) DO NOTHING`,
      [id, this.c.runId, stage, round, minerId, status, reason, detail ? JSON.stringify(detail) : null, timeoutMs / 1000],
    );
  }

  /**
   * A miner's answer: its round's record, taken until the hard bound (a late one is replayed as any other, its
   * lateness kept with the verdict). Refused by name (and the audit left open until its hard bound) when it is not
   * for an open audit of this miner, not a record, or a record of another round, stage, run or miner. `uploadMs`:
   * how long the upload took (its request's body, as the route received it): the miner's measured upload rate.
   */
  async answer(auditId: string, minerId: string, bytes: Uint8Array, uploadMs?: number): Promise<void> {
    const [audit] = await this.c.db.query<{ stage: number; round: number; miner_id: string; status: string; late_ms: number }>(
      `SELECT stage, round, miner_id, status, greatest(0, (extract(epoch FROM now() - deadline) * 1000)::int) AS late_ms FROM audits WHERE id = $1 AND run_id = $2`,
      [auditId, this.c.runId],
    );
    if (!audit || audit.status !== 'open') throw new AuditError('NO_SUCH_AUDIT', 'no audit with that id is open (never drawn, answered already, or past its hard bound)');
    if (audit.miner_id !== minerId) throw new AuditError('NOT_YOUR_AUDIT', 'this audit was drawn for another miner');
    if (bytes.length > MAX_RECORD_BYTES) throw new AuditError('TOO_LARGE', `a record of at most ${MAX_RECORD_BYTES} bytes`);
    let record: RoundRecord;
    try {
      record = decodeRecord(bytes);
    } catch (e) {
      if (e instanceof RecordError) throw new AuditError('BAD_RECORD', e.message);
      throw e;
    }
    if (record.runId !== this.c.runId || record.minerId !== minerId || record.stage !== audit.stage || record.round !== audit.round) {
      throw new AuditError('WRONG_RECORD', `the audit is of stage ${audit.stage}, round ${audit.round}: this record is of run ${record.runId}, stage ${record.stage}, round ${record.round}`);
    }
    // Taken: nobody answers twice, whatever the replay says.
    // The microbatches it says it trained (checked by the replay): a replay of a round with work counts toward the draw's PROVEN_AUDITS.
    const steps = record.ops.filter((o) => o.kind === 'backward' && o.applied).length;
    const [taken] = await this.c.db.query(
      `UPDATE audits SET status = 'replaying', replay_seen = now(), detail = coalesce(detail, '{}'::jsonb) || jsonb_build_object('steps', $2::int, 'lateMs', $3::int, 'uploadMs', $4::int, 'takenAt', now())
       WHERE id = $1 AND status = 'open' RETURNING id`,
      [auditId, steps, audit.late_ms, uploadMs === undefined ? null : Math.round(uploadMs)],
    );
    if (!taken) throw new AuditError('NO_SUCH_AUDIT', 'answered already');
    // The line's rate, for this miner's next deadline (auditDeadlineMs): measured on uploads big enough to tell.
    if (uploadMs !== undefined && bytes.length >= MEASURED_UPLOAD_MIN_BYTES) {
      const rate = (1000 * bytes.length) / Math.max(1, uploadMs);
      await this.c.db.query('UPDATE miners SET upload_bytes_per_sec = $3, record_bytes = $4 WHERE id = $1 AND run_id = $2', [minerId, this.c.runId, rate, bytes.length]);
      await this.requeue(minerId, rate);
    } else await this.c.db.query('UPDATE miners SET record_bytes = $3 WHERE id = $1 AND run_id = $2', [minerId, this.c.runId, bytes.length]);
    this.replaying.add(auditId);
    void this.replay(auditId, audit.stage, audit.round, minerId, record, bytes)
      .catch((e: unknown) => droppedOnClose(e) || this.c.log.error({ err: e, auditId }, 'audit failed to run'))
      .finally(() => this.replaying.delete(auditId));
  }

  /**
   * A miner's line was just measured: its audits still open, which it uploads one after another from now, oldest
   * first, get deadlines at that rate, counted from now (never earlier than they had). Drawn at the assumed rate on a
   * slower line, the later ones of a queue would otherwise pass their hard bound while the first still uploaded.
   */
  private async requeue(minerId: string, bytesPerSec: number): Promise<void> {
    const open = await this.c.db.query<{ id: string; bytes: number | null }>(
      `SELECT id, (detail ->> 'recordBytes')::float8 AS bytes FROM audits WHERE run_id = $1 AND miner_id = $2 AND status = 'open' ORDER BY created_at, id`,
      [this.c.runId, minerId],
    );
    let queued = 0;
    for (const a of open) {
      queued += Number(a.bytes ?? 0);
      const ms = auditDeadlineMs(this.timeoutMs, queued, bytesPerSec);
      await this.c.db.query(
        `UPDATE audits SET deadline = greatest(deadline, now() + make_interval(secs => $2)), detail = coalesce(detail, '{}'::jsonb) || jsonb_build_object('requeuedMs', $3::int) WHERE id = $1 AND status = 'open'`,
        [a.id, ms / 1000, ms],
      );
    }
  }

  private async replay(auditId: string, stage: number, round: number, minerId: string, record: RoundRecord, bytes: Uint8Array): Promise<void> {
    const c = this.c;
    const [end] = await c.db.query<{ weights_hash: string; optimizer_hash: string; ready_at: Date; outer_root: string | null; average_root: string | null; start_round: number | null; start_hash: string | null; start_optimizer: string | null }>(
      'SELECT weights_hash, optimizer_hash, ready_at, outer_root, average_root, start_round, start_hash, start_optimizer FROM round_commitments WHERE run_id = $1 AND stage = $2 AND round = $3 AND miner_id = $4',
      [c.runId, stage, round, minerId],
    );
    // Computed on another backend than this validator's: replayed within that backend's measured spread (REPLAY_TOLERANCE, swarm/audit/replay.ts).
    const [registered] = await c.db.query<{ backend: string }>('SELECT backend FROM miners WHERE id = $1 AND run_id = $2', [minerId, c.runId]);
    const tolerance = registered && registered.backend !== AUDIT_BACKEND ? REPLAY_TOLERANCE[registered.backend] : undefined;
    const [start] = record.anchorRound > 0
      ? await c.db.query<{ optimizer_hash: string }>('SELECT optimizer_hash FROM round_commitments WHERE run_id = $1 AND stage = $2 AND round = $3 AND miner_id = $4', [c.runId, stage, record.anchorRound, minerId])
      : [];
    // The round began when the miner's report of the anchor's merge arrived (its sends of the round come after it on the same socket); a stage taken up afresh, at its previous commitment.
    const [anchor] = await c.db.query<{ at: string | null; ended: Date | null }>(`SELECT merged_at ->> $4 AS at, ended_at AS ended FROM epochs WHERE run_id = $1 AND stage = $2 AND epoch = $3`, [c.runId, stage, record.anchorRound, minerId]);
    const [previous] = await c.db.query<{ at: Date | null }>('SELECT max(ready_at) AS at FROM round_commitments WHERE run_id = $1 AND stage = $2 AND round < $3 AND miner_id = $4', [c.runId, stage, round, minerId]);
    // A round begun by taking the stage up: from when it was given the stage, after a grace for its previous
    // stage's sends still arriving (a miner moved mid-round sent them as another stage).
    const [given] = await c.db.query<{ at: Date }>(`SELECT stage_since + make_interval(secs => $3) AS at FROM miners WHERE id = $1 AND run_id = $2`, [minerId, c.runId, STAGE_TAKEN_GRACE_MS / 1000]);
    // The first round its process committed after a restart (none committed since): begun then, from a fresh optimizer state.
    const [restart] = await c.db.query<{ at: Date | null }>('SELECT max(at) AS at FROM miner_restarts WHERE run_id = $1 AND miner_id = $2 AND at <= $3', [c.runId, minerId, end?.ready_at ?? new Date()]);
    const restarted = restart?.at && (!previous?.at || new Date(previous.at) < new Date(restart.at)) ? restart.at : null;
    const window = {
      anchorRound: record.anchorRound,
      ...roundWindow({ anchorRound: record.anchorRound, anchorMerged: anchor?.at, anchorEnded: anchor?.ended, previousReady: previous?.at, given: given?.at, restarted }),
      to: end?.ready_at ? new Date(end.ready_at).toISOString() : null,
    };
    const from = window.from;
    let startWeights: Uint8Array | undefined;
    // The record is the one committed: it starts where the miner said, with merge-ready, its round began.
    if (end?.start_hash != null && (record.anchorRound !== end.start_round || record.anchorHash !== end.start_hash)) {
      const detail = { anchorRound: record.anchorRound, anchorHash: record.anchorHash, committed: { round: end.start_round, hash: end.start_hash } };
      return this.startMismatch(auditId, minerId, stage, round, 'its record starts elsewhere than the start it committed with merge-ready', detail);
    }
    if (record.anchorRound > 0) {
      // The weights a round starts from are the anchor merge's agreed ones, or the ones this miner reported
      // for it (its merge ended elsewhere), or, when it reported no merged weights for that round (its merge failed
      // or never came: a failed merge changes nothing), its own end state committed with merge-ready for it, or, when
      // its report of that merge never arrived (lost, refused or timed out), the start it committed with this round's merge-ready
      // (the record then carries those weights; the round whose report is missing went unpaid as 'missed'): all known
      // before the audit was drawn. Anything else is a lie.
      const [anchored] = await c.db.query<{ agreed: string | null; reported: string | null; own: string | null }>(
        `SELECT e.merged_hash AS agreed, e.merged_hashes ->> $4 AS reported,
                (SELECT weights_hash FROM round_commitments WHERE run_id = $1 AND stage = $2 AND round = $3 AND miner_id = $4) AS own
         FROM epochs e WHERE e.run_id = $1 AND e.stage = $2 AND e.epoch = $3`,
        [c.runId, stage, record.anchorRound, minerId],
      );
      if (record.anchorHash !== anchored?.agreed && record.anchorHash !== anchored?.reported && !(!anchored?.reported && record.anchorWeights && (record.anchorHash === anchored?.own || record.anchorHash === end?.start_hash))) {
        const detail = { anchorRound: record.anchorRound, anchorHash: record.anchorHash, agreed: anchored?.agreed ?? null, reported: anchored?.reported ?? null };
        if (!anchored?.reported) {
          // Its report of that merge never arrived: its weights then are unknown, and an honest miner's report can be lost.
          await this.finish(auditId, 'skipped', 'START_UNCOMMITTED', detail, 0);
          this.stats.skipped++;
          return;
        }
        return this.startMismatch(auditId, minerId, stage, round, `it starts from weights that are neither round ${record.anchorRound}'s nor the ones it reported`, detail);
      }
      // The record carries them (checked against anchorHash in the replay); else the stage's checkpoint of that round.
      if (!record.anchorWeights) {
        const [checkpoint] = await c.db.query<{ data: Uint8Array }>('SELECT data FROM checkpoints WHERE run_id = $1 AND stage = $2 AND epoch = $3 AND hash = $4 AND data IS NOT NULL', [c.runId, stage, record.anchorRound, record.anchorHash]);
        if (!checkpoint) {
          // Only the round's merged weights are kept as checkpoints, a few rounds deep: without them there is nothing to replay from.
          await this.finish(auditId, 'skipped', 'NO_CHECKPOINT', { anchorRound: record.anchorRound, anchorHash: record.anchorHash }, 0);
          this.stats.skipped++;
          return;
        }
        startWeights = new Uint8Array(checkpoint.data);
      }
    }
    // Receipts of the microbatches the miner handled in the round (its own receipt in the round) and of those its
    // record names (a gradient of a forward from before the round), from both ends: its record must match them
    // byte for byte (its own receipt first), and hold every send it confirmed in the round (`inRound`). Whether
    // both ends agree decides what is paid, not what the miner computed.
    const transfers = await c.db.query<{ direction: 'activation' | 'gradient'; activation_id: string; from_miner: string; to_miner: string; payload_hash: string; reporter: string; in_round: boolean }>(
      `WITH mine AS (
         SELECT DISTINCT activation_id FROM receipts
         WHERE run_id = $1 AND reporter = $2 AND created_at > $3::timestamptz AND created_at <= $4::timestamptz
         UNION SELECT unnest($5::text[]))
       SELECT r.direction, r.activation_id, r.from_miner, r.to_miner, r.payload_hash, r.reporter,
              (r.reporter = $2 AND r.created_at > $3::timestamptz AND r.created_at <= $4::timestamptz) AS in_round
       FROM receipts r JOIN mine USING (activation_id)
       WHERE r.run_id = $1 AND (r.from_miner = $2 OR r.to_miner = $2)`,
      [c.runId, minerId, from, end?.ready_at ?? new Date(), [...new Set(record.ops.map((o) => o.activationId))]],
    );
    const ids = [...new Set(record.ops.map((o) => o.activationId))];
    const losses = ids.length
      ? await c.db.query<{ activation_id: string; value: number }>(`SELECT activation_id, value FROM metrics WHERE run_id = $1 AND name = 'train_loss' AND activation_id = ANY($2::text[])`, [c.runId, ids])
      : [];
    // The merge the round ended in, and what the owners of the miner's partitions received from it.
    const [merge] = await c.db.query<{ mode: 'outer' | 'average' | null; participants: string[] | string | null; seed: number | null }>(
      'SELECT mode, participants, seed FROM epochs WHERE run_id = $1 AND stage = $2 AND epoch = $3',
      [c.runId, stage, round],
    );
    const participants = merge?.participants ? ((typeof merge.participants === 'string' ? JSON.parse(merge.participants) : merge.participants) as string[]) : [];
    const received = await c.db.query<{ partition: number; owner: string; hash: string }>(
      'SELECT partition, owner, hash FROM contribution_receipts WHERE run_id = $1 AND stage = $2 AND round = $3 AND sender = $4',
      [c.runId, stage, round, minerId],
    );
    const committed = merge?.mode === 'outer' ? end?.outer_root : merge?.mode === 'average' ? end?.average_root : null;
    const job: AuditJob = {
      ...(merge?.mode && merge.seed !== null && participants.length >= 2
        ? { merge: { mode: merge.mode, seed: merge.seed, participants, precision: roundPrecision(c.run.merge.precision, merge.mode), received, ...(committed ? { committed } : {}) } }
        : {}),
      record: bytes,
      ...(startWeights ? { startWeights } : {}),
      // The optimizer state it committed with the merge-ready of the round it started from; without one (a merge-ready
      // the coordinator never took, its round kept closed by the miner), the one it committed it started from, with
      // this round's merge-ready (before the draw); neither (a stage taken up afresh), or a restart since that merge
      // (its previous process's state went with it; no other start is let in, or it could be one chosen to steer the
      // round): a fresh one.
      startStateHash: restarted ? null : (start?.optimizer_hash ?? end?.start_optimizer ?? null),
      endWeightsHash: end?.weights_hash ?? '',
      endStateHash: end?.optimizer_hash ?? '',
      transfers: transfers.map((t) => ({ direction: t.direction, activationId: t.activation_id, from: t.from_miner, to: t.to_miner, payloadHash: t.payload_hash, reporter: t.reporter, inRound: t.in_round })),
      reportedLosses: losses.map((l) => [l.activation_id, l.value]),
      ...(tolerance ? { tolerance } : {}),
      passed: (await passedAudits(c, [minerId])).get(minerId) ?? 0,
    };
    let verdict: AuditVerdict;
    try {
      verdict = await this.validator.request<AuditVerdict>({ kind: 'audit', audit: job });
    } catch (e) {
      // The validator's own failure (died, timed out) is not the miner's: the audit is skipped, saying why.
      await this.finish(auditId, 'skipped', 'VALIDATOR', { error: (e as Error).message }, 0);
      this.stats.skipped++;
      return;
    }
    this.stats.validatorMs += verdict.ms;
    this.stats.replayedOps += verdict.ops;
    if (verdict.passed) {
      await this.finish(auditId, 'passed', null, { ops: verdict.ops, steps: verdict.steps }, verdict.ms);
      this.stats.passed++;
      return;
    }
    await this.finish(auditId, 'failed', verdict.reason ?? 'AUDIT_FAILED', { ...verdict, window }, verdict.ms);
    this.stats.failed++;
    await c.flags.raise(minerId, 'AUDIT_FAILED', `its round ${round} on stage ${stage + 1} did not replay: ${verdict.reason}: ${verdict.detail ?? ''}`.trim(), { auditId, stage, round, ...verdict, window });
  }

  /** The record does not start from weights it may start from: failed, and the miner flagged, before any replay. */
  private async startMismatch(auditId: string, minerId: string, stage: number, round: number, why: string, detail: object): Promise<void> {
    await this.finish(auditId, 'failed', 'AUDIT_START_MISMATCH', detail, 0);
    this.stats.failed++;
    await this.c.flags.raise(minerId, 'AUDIT_FAILED', `its round ${round} on stage ${stage + 1} did not replay: AUDIT_START_MISMATCH: ${why}`, { auditId, stage, round, ...detail });
  }

  private async finish(auditId: string, status: string, reason: string | null, detail: object, ms: number): Promise<void> {
    // The verdict's detail beside what the audit already kept (its deadline, the upload's lateness and time).
    await this.c.db.query(`UPDATE audits SET status = $2, reason = $3, detail = coalesce(detail, '{}'::jsonb) || $4::jsonb, validator_ms = $5, finished_at = now() WHERE id = $1`, [
      auditId,
      status,
      reason,
      JSON.stringify(detail),
      Math.round(ms),
    ]);
  }

  /** Audits past their hard bound (deadline + grace): unanswered by a miner still here flags it; one that left is not blamed. */
  async tick(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      // Asked again every RESEND_MS while open: a request can be lost with a socket that was reconnecting.
      const open = await this.c.db.query<{ id: string; miner_id: string; stage: number; round: number; left_ms: number }>(
        `SELECT id, miner_id, stage, round, (extract(epoch FROM deadline - now()) * 1000)::int AS left_ms FROM audits WHERE run_id = $1 AND status = 'open'`,
        [this.c.runId],
      );
      for (const a of open) {
        if (Date.now() - (this.sentAt.get(a.id) ?? 0) < AUDIT_RESEND_MS || a.left_ms + this.graceMs <= 0) continue;
        this.c.sendToMiner(a.miner_id, 'audit', { v: PROTOCOL_VERSION, auditId: a.id, stage: a.stage, round: a.round, deadlineMs: a.left_ms, finalMs: a.left_ms + this.graceMs });
        this.sentAt.set(a.id, Date.now());
      }
      for (const id of [...this.sentAt.keys()]) if (!open.some((a) => a.id === id)) this.sentAt.delete(id);
      // This process's replays are still running; one no process marked for REPLAY_LOST_MS went with its process: asked again.
      if (this.replaying.size) await this.c.db.query(`UPDATE audits SET replay_seen = now() WHERE id = ANY($1::text[]) AND status = 'replaying'`, [[...this.replaying]]);
      const lost = await this.c.db.query<{ id: string }>(
        `UPDATE audits SET status = 'open', deadline = now() + make_interval(secs => coalesce((detail ->> 'deadlineMs')::float8 / 1000, $2)),
           detail = coalesce(detail, '{}'::jsonb) || '{"reopened":"its replay was lost with the process that ran it"}'::jsonb
         WHERE run_id = $1 AND status = 'replaying' AND coalesce(replay_seen, deadline) < now() - make_interval(secs => $3) AND NOT (id = ANY($4::text[])) RETURNING id`,
        [this.c.runId, this.timeoutMs / 1000, REPLAY_LOST_MS / 1000, [...this.replaying]],
      );
      this.stats.reopened += lost.length;
      // A replay that never came back (this process lost track of it) would hold settlement forever: skipped, saying so.
      const stuck = await this.c.db.query<{ id: string }>(
        `UPDATE audits SET status = 'skipped', reason = 'VALIDATOR', detail = '{"error":"the replay never finished"}', finished_at = now()
         WHERE run_id = $1 AND status = 'replaying' AND coalesce((detail ->> 'takenAt')::timestamptz, deadline) < now() - make_interval(secs => $2) RETURNING id`,
        [this.c.runId, AUDIT_REPLAY_LIMIT_MS / 1000],
      );
      this.stats.skipped += stuck.length;
      // Past its deadline, an audit of a miner that left is closed at once (nobody is blamed, and its epochs need not
      // wait out the grace for an answer that cannot come), as is one asked again because this side lost its replay (the
      // validator's fault: skipped below); one of a miner still here waits for the hard bound.
      const gone: string[] = [];
      for (const a of open) {
        if (a.left_ms >= 0 || a.left_ms + this.graceMs <= 0) continue;
        const [row] = await this.c.db.query<{ status: string }>('SELECT status FROM miners WHERE id = $1 AND run_id = $2', [a.miner_id, this.c.runId]);
        if (row?.status !== 'active' || !(await this.c.canReach(a.miner_id))) gone.push(a.id);
      }
      const due = await this.c.db.query<{ id: string; miner_id: string; stage: number; round: number; reopened: boolean }>(
        `UPDATE audits SET status = 'expired' WHERE run_id = $1 AND status = 'open' AND (deadline + make_interval(secs => $2) < now() OR ((id = ANY($3::text[]) OR detail ? 'reopened') AND deadline < now()))
         RETURNING id, miner_id, stage, round, (detail ? 'reopened') AS reopened`,
        [this.c.runId, this.graceMs / 1000, gone],
      );
      for (const a of due) {
        const [row] = await this.c.db.query<{ status: string }>('SELECT status FROM miners WHERE id = $1 AND run_id = $2', [a.miner_id, this.c.runId]);
        if (a.reopened) {
          // Asked again because this side lost its replay: the miner may no longer keep that round's record.
          await this.finish(a.id, 'skipped', 'VALIDATOR', { error: 'its replay was lost with the process that ran it, and the record was not sent again' }, 0);
          this.stats.skipped++;
          continue;
        }
        if (row?.status !== 'active' || !(await this.c.canReach(a.miner_id))) {
          await this.finish(a.id, 'abandoned', 'MINER_LEFT', {}, 0);
          continue;
        }
        // Drawn as its miner restarted (the draw read the commitments before the restart was stored): forfeited, as
        // one open at the restart is (recordRestart), not flagged: the new process never had the record.
        if (await this.c.db.transaction((tx) => forfeitForRestart(tx, this.c.runId, a))) continue;
        await this.finish(a.id, 'unanswered', 'AUDIT_UNANSWERED', {}, 0);
        this.stats.unanswered++;
        await this.c.flags.raise(a.miner_id, 'AUDIT_UNANSWERED', `did not upload the record of its round ${a.round} on stage ${a.stage + 1} by the audit's hard bound (${Math.round(this.graceMs / 1000)} s past its deadline)`, { auditId: a.id, stage: a.stage, round: a.round });
      }
    } finally {
      this.busy = false;
    }
  }
}

/**
 * How many audits of rounds with work (PROVEN_STEPS) each of these miners has passed in the run (PROVEN_AUDITS);
 * with inFlight, those whose replay is under way count too (the draw's). A miner with none is absent.
 */
async function passedAudits(c: Coordinator, minerIds: string[], { inFlight = false } = {}): Promise<Map<string, number>> {
  if (minerIds.length === 0) return new Map();
  const rows = await c.db.query<{ miner_id: string; n: number }>(
    `SELECT miner_id, count(*)::int AS n FROM audits WHERE run_id = $1 AND miner_id = ANY($2::text[])
       AND (status = 'passed' OR ($4 AND status = 'replaying')) AND coalesce((detail ->> 'steps')::int, 0) >= $3
     GROUP BY miner_id`,
    [c.runId, minerIds, PROVEN_STEPS, inFlight],
  );
  return new Map(rows.map((r) => [r.miner_id, r.n]));
}

/** An audit its miner's restart left unanswerable: forfeited, saying why. */
const FORFEIT = `UPDATE audits SET status = 'forfeited', reason = 'RESTARTED', finished_at = now(),
  detail = coalesce(detail, '{}'::jsonb) || '{"why":"its miner restarted before answering: the new process has no record of the round"}'::jsonb`;

/**
 * A miner registered from another process than before under the same key (register's `instance`: a reloaded tab, a
 * lost GPU device's fallback, a restarted Node miner): its optimizer state and round records went with the old one.
 * Recorded (miner_restarts), inside the registration's transaction, with what follows from it:
 *   - its audits open now cannot be answered: forfeited (status 'forfeited', RESTARTED), not flagged, and with them
 *     every unsettled epoch's work of it before now (accounting.ts): what a failed audit costs, less the flag, so a
 *     cheat cannot restart its way out of a drawn audit for less than a failure costs;
 *   - rounds it committed before now and closed after are not drawn (Auditor.roundClosed) and not paid;
 *   - the round in progress now is not paid for its previous process's work in it (accounting.ts), and the first
 *     round the new process commits is audited from now, from the agreed weights and a fresh optimizer state.
 */
export async function recordRestart(tx: Queryable, runId: number, minerId: string, stage: number): Promise<{ forfeited: number }> {
  const forfeited = await tx.query<{ id: string }>(`${FORFEIT} WHERE run_id = $1 AND miner_id = $2 AND status = 'open' RETURNING id`, [runId, minerId]);
  await tx.query('INSERT INTO miner_restarts (run_id, miner_id, stage, forfeited) VALUES ($1, $2, $3, $4)', [runId, minerId, stage, forfeited.length]);
  return { forfeited: forfeited.length };
}

/** An expired audit of a round its miner committed before a restart: forfeited, its window's work with it (recordRestart). */
async function forfeitForRestart(tx: Queryable, runId: number, a: { id: string; miner_id: string; stage: number; round: number }): Promise<boolean> {
  // The first restart after the round's commitment (compared in SQL: a timestamp read into JS loses its microseconds).
  const restart = await tx.query(
    `UPDATE miner_restarts SET forfeited = forfeited + 1
     WHERE run_id = $1 AND miner_id = $2 AND at = (
       SELECT min(x.at) FROM miner_restarts x JOIN round_commitments c ON c.run_id = x.run_id AND c.miner_id = x.miner_id
       WHERE x.run_id = $1 AND x.miner_id = $2 AND c.stage = $3 AND c.round = $4 AND x.at > c.ready_at)
     RETURNING at`,
    [runId, a.miner_id, a.stage, a.round],
  );
  if (restart.length === 0) return false;
  await tx.query(`${FORFEIT} WHERE id = $1`, [a.id]);
  return true;
}
