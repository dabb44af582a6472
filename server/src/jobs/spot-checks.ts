// Only a stage's first microbatch after each merge can be replayed exactly, and a miner can tell which one that is:
// spot checks are the quick first line, and the whole-round audits (audits.ts) are what see every other microbatch.
import { PROTOCOL_VERSION } from '@train-at-home/protocol';
import { createHash, randomBytes, randomInt } from 'node:crypto';
import type { Coordinator } from '../coordinator';
import type { ReplayJob, ReplayReference, SpotCheckResult } from '../validator/compute';
import { droppedOnClose } from '../validator/compute';
import { ValidatorError } from '../validator/compute';
import type { ValidatorProcess } from '../validator/client';
import { ProbeError } from './probe-error';
import { flagKind, gross } from '../validator/thresholds';

export { ProbeError };

/** Failed checks of one kind that flag a miner; a gross failure (thresholds.ts: GROSS) flags it at once. */
export const FLAG_AFTER_FAILURES = 2;
/** Missed probes that flag a miner, when it also answered fewer than it missed. */
export const FLAG_AFTER_MISSED_PROBES = 3;
/** A loss report is sampled this long after it arrived, once the gradients' receipts are in. */
export const SAMPLE_DELAY_MS = 3_000;
/** Samples waiting for payloads or replays at once; more are skipped (the rate is a ceiling). */
export const MAX_SAMPLES_IN_FLIGHT = 6;
/** The largest payload a probe accepts (a boundary tensor of the largest microbatch, with its header). */
export const MAX_PROBE_BYTES = 16 * 1024 * 1024;

interface Sample {
  activationId: string;
  pathway: string[];
  loss: number;
  /** Payloads at each boundary k: activations[k] from stage k to k+1, gradients[k] back. */
  activations: Array<Uint8Array | undefined>;
  gradients: Array<Uint8Array | undefined>;
  first: Date;
  last: Date;
  deadline: number;
  references: Array<(ReplayReference & { blob?: Uint8Array }) | null>;
}

interface Probe {
  sample: Sample;
  boundary: number;
  direction: 'activation' | 'gradient';
  /** The miner asked (the receiving end of the transfer). */
  minerId: string;
  hash: string;
  bytes: number;
}

/**
 * Spot checks: nobody is believed on their own word. A share of completed
 * microbatches is sampled after the fact (so no miner knows which of its
 * microbatches will be checked); the receiving end of each transfer on the
 * pathway is asked for the payload it got, which must hash to what both ends
 * confirmed; the validator then replays every stage from those bytes with
 * the stage's hash-agreed weights of that merge round (an honest miner has
 * moved only a few inner steps from them) and compares each miner's output,
 * the gradient it sent back, and the loss the last stage reported. Failures
 * are stored with their metrics and, repeated, flag the miner.
 */
export class SpotChecker {
  private readonly probes = new Map<string, Probe>();
  private readonly samples = new Set<Sample>();
  private cursor = new Date(Date.now() - SAMPLE_DELAY_MS);
  private readonly missed = new Map<string, number>();
  private readonly answered = new Map<string, number>();
  readonly stats = { sampled: 0, replayed: 0, checks: 0, failed: 0, skipped: 0, replayMs: 0, skippedForCapacity: 0, rate: 0 };
  /**
   * The share actually sampled: the run's spotCheckRate, halved each time a sample had to be
   * skipped because MAX_SAMPLES_IN_FLIGHT were waiting, and raised back by a tenth after each
   * sample taken, so the validator samples what it can replay instead of dropping most of it.
   */
  private effectiveRate?: number;

  constructor(
    private readonly c: Coordinator,
    private readonly validator: ValidatorProcess,
  ) {}

  /** Samples new loss reports and ends samples whose probes timed out. */
  async tick(): Promise<void> {
    const now = Date.now();
    for (const s of [...this.samples]) if (now > s.deadline) await this.expire(s);
    const until = new Date(now - SAMPLE_DELAY_MS);
    const rows = await this.c.db.query<{ activation_id: string; pathway: string[] | string; value: number }>(
      `SELECT activation_id, pathway, value FROM metrics WHERE run_id = $1 AND name = 'train_loss' AND pathway IS NOT NULL AND created_at > $2 AND created_at <= $3`,
      [this.c.runId, this.cursor, until],
    );
    this.cursor = until;
    const configured = this.c.run.incentives.spotCheckRate;
    for (const r of rows) {
      const rate = (this.effectiveRate ??= configured);
      this.stats.rate = rate;
      if (randomInt(0, 1_000_000) >= rate * 1_000_000) continue;
      if (this.samples.size >= MAX_SAMPLES_IN_FLIGHT) {
        // Recorded, and the rate follows what the validator keeps up with.
        this.stats.skipped++;
        this.stats.skippedForCapacity++;
        this.effectiveRate = Math.max(configured / 64, rate / 2);
        continue;
      }
      this.effectiveRate = Math.min(configured, rate * 1.1);
      const pathway = (typeof r.pathway === 'string' ? JSON.parse(r.pathway) : r.pathway) as string[];
      await this.begin(r.activation_id, pathway, r.value);
    }
  }

  /** Asks the receiving end of every transfer on the pathway for its payload. */
  private async begin(activationId: string, pathway: string[], loss: number): Promise<void> {
    const receipts = await this.c.db.query<{ direction: 'activation' | 'gradient'; from_miner: string; to_miner: string; bytes: number; payload_hash: string; n: number; variants: number; first: Date; last: Date }>(
      `SELECT direction, from_miner, to_miner, min(bytes) AS bytes, min(payload_hash) AS payload_hash, count(*)::int AS n,
              count(DISTINCT (bytes, payload_hash))::int AS variants, min(created_at) AS first, max(created_at) AS last
       FROM receipts WHERE run_id = $1 AND activation_id = $2 GROUP BY direction, from_miner, to_miner`,
      [this.c.runId, activationId],
    );
    const S = pathway.length;
    const transfer = (direction: 'activation' | 'gradient', from: string, to: string) =>
      receipts.find((r) => r.direction === direction && r.from_miner === from && r.to_miner === to && r.n === 2 && r.variants === 1);
    const wanted: Array<{ boundary: number; direction: 'activation' | 'gradient'; from: string; to: string }> = [];
    for (let k = 0; k < S - 1; k++) {
      wanted.push({ boundary: k, direction: 'activation', from: pathway[k]!, to: pathway[k + 1]! });
      wanted.push({ boundary: k, direction: 'gradient', from: pathway[k + 1]!, to: pathway[k]! });
    }
    const found = wanted.map((w) => ({ ...w, receipt: transfer(w.direction, w.from, w.to) }));
    // Only microbatches every transfer of which both ends confirmed (the rest earn nothing anyway).
    if (found.some((f) => !f.receipt)) return;
    const times = receipts.flatMap((r) => [new Date(r.first).getTime(), new Date(r.last).getTime()]);
    const span = { first: new Date(Math.min(...times)), last: new Date(Math.max(...times)) };
    const references = await this.references(activationId, pathway, span);
    // Only microbatches some miner processed right after a merge can be replayed exactly.
    if (references.every((r) => r === null)) {
      this.stats.skipped++;
      return;
    }
    const sample: Sample = {
      activationId,
      pathway,
      loss,
      activations: Array(S - 1).fill(undefined),
      gradients: Array(S - 1).fill(undefined),
      ...span,
      deadline: Date.now() + this.c.run.incentives.probeTimeoutMs,
      references,
    };
    this.samples.add(sample);
    this.stats.sampled++;
    for (const f of found) {
      const probeId = randomBytes(16).toString('hex');
      this.probes.set(probeId, { sample, boundary: f.boundary, direction: f.direction, minerId: f.to, hash: f.receipt!.payload_hash, bytes: f.receipt!.bytes });
      this.c.sendToMiner(f.to, 'probe', { v: PROTOCOL_VERSION, probeId, activationId, direction: f.direction });
    }
  }

  /**
   * A miner's answer to a probe: the payload, checked against the hash both
   * ends confirmed. Throws a ProbeError (a named 4xx) for a probe never sent,
   * one asked of another miner, or bytes that are not the confirmed ones.
   */
  async answer(probeId: string, minerId: string, bytes: Uint8Array): Promise<void> {
    // Scale-out: the probes are the lease holder's; an upload that reached another process is passed on.
    const shared = this.c.scaleOut;
    if (shared && !shared.lease.held) return shared.passProbe(probeId, minerId, bytes);
    const probe = this.probes.get(probeId);
    if (!probe) throw new ProbeError('NO_SUCH_PROBE', 'no probe with that id is open (never sent, answered already, or expired)');
    if (probe.minerId !== minerId) throw new ProbeError('NOT_YOUR_PROBE', 'this probe was sent to another miner');
    if (bytes.length !== probe.bytes || createHash('sha256').update(bytes).digest('hex') !== probe.hash) {
      throw new ProbeError('HASH_MISMATCH', 'these bytes are not the payload both ends of the transfer confirmed');
    }
    this.probes.delete(probeId);
    this.answered.set(minerId, (this.answered.get(minerId) ?? 0) + 1);
    const s = probe.sample;
    (probe.direction === 'activation' ? s.activations : s.gradients)[probe.boundary] = bytes;
    if (this.samples.has(s) && [...s.activations, ...s.gradients].every(Boolean)) {
      this.samples.delete(s);
      void this.replay(s).catch((e: unknown) => droppedOnClose(e) || this.c.log.error({ err: e }, 'spot check failed to run'));
    }
  }

  /** The probes of a sample went unanswered: each miner that was asked and is still here missed one. */
  private async expire(s: Sample): Promise<void> {
    this.samples.delete(s);
    for (const [id, p] of [...this.probes]) {
      if (p.sample !== s) continue;
      this.probes.delete(id);
      const [row] = await this.c.db.query<{ status: string }>('SELECT status FROM miners WHERE id = $1 AND run_id = $2', [p.minerId, this.c.runId]);
      if (row?.status !== 'active' || !(await this.c.canReach(p.minerId))) continue; // it left: no blame
      const missed = (this.missed.get(p.minerId) ?? 0) + 1;
      this.missed.set(p.minerId, missed);
      if (missed >= FLAG_AFTER_MISSED_PROBES && (this.answered.get(p.minerId) ?? 0) < missed) {
        await this.c.flags.raise(p.minerId, 'PROBE_UNANSWERED', `did not upload ${missed} payloads the validator asked for (answered ${this.answered.get(p.minerId) ?? 0})`, {
          missed,
          answered: this.answered.get(p.minerId) ?? 0,
          lastActivationId: s.activationId,
        });
      }
    }
  }

  /** Replays a sample in the validator process and records each check. */
  private async replay(s: Sample): Promise<void> {
    const references = s.references;
    const job = (withBlobs: boolean): ReplayJob => ({
      activationId: s.activationId,
      pathway: s.pathway,
      loss: s.loss,
      activations: s.activations as Uint8Array[],
      gradients: s.gradients as Uint8Array[],
      references: references.map((r, k) =>
        r === null ? null : { round: r.round, forwardSteps: r.forwardSteps, backwardSteps: r.backwardSteps, ...(r.hash ? { hash: r.hash } : {}), ...(r.blob && (withBlobs || !this.validator.known.has(`${k}:${r.hash}`)) ? { blob: r.blob } : {}) },
      ),
    });
    let results: SpotCheckResult[];
    const started = performance.now();
    try {
      results = await this.validator.request<SpotCheckResult[]>({ kind: 'replay', replay: job(false) });
    } catch (e) {
      if (!(e instanceof ValidatorError) || e.code !== 'NO_CHECKPOINT') throw e;
      results = await this.validator.request<SpotCheckResult[]>({ kind: 'replay', replay: job(true) });
    }
    references.forEach((r, k) => r?.hash && this.validator.known.add(`${k}:${r.hash}`));
    this.stats.replayed++;
    this.stats.replayMs += performance.now() - started;
    for (const r of results) {
      this.stats.checks++;
      if (!r.passed) this.stats.failed++;
      await this.c.db.query(
        `INSERT INTO spot_checks (run_id, activation_id, miner_id, stage, kind, reference_round, passed, metrics) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
        [
          this.c.runId,
          s.activationId,
          r.minerId,
          r.stage,
          r.kind,
          r.referenceRound,
          r.passed,
          // With the inner steps the miner was counted to have taken since the reference weights (0 for the kind replayed).
          JSON.stringify({ ...r.metrics, ...(r.reason ? { reason: r.reason } : {}), steps: { forward: references[r.stage]?.forwardSteps ?? null, backward: references[r.stage]?.backwardSteps ?? null } }),
        ],
      );
      if (r.passed) continue;
      const failures = await this.c.db.query<{ activation_id: string; metrics: unknown }>(
        `SELECT activation_id, metrics FROM spot_checks WHERE run_id = $1 AND miner_id = $2 AND kind = $3 AND NOT passed ORDER BY id DESC LIMIT 5`,
        [this.c.runId, r.minerId, r.kind],
      );
      if (failures.length >= FLAG_AFTER_FAILURES || gross(r.kind, r.metrics)) {
        await this.c.flags.raise(r.minerId, flagKind(r.kind), `${failures.length} spot check(s) failed; latest: ${r.reason ?? r.kind}`, {
          stage: r.stage,
          failures: failures.map((f) => ({ activationId: f.activation_id, metrics: typeof f.metrics === 'string' ? JSON.parse(f.metrics) : f.metrics })),
        });
      }
    }
  }

  /**
   * For each stage of the pathway, the weights its miner held when it
   * processed the microbatch, if the validator holds them too: that is only
   * right after a merge (or at the run's start), before the miner's first
   * inner step, when every replica holds the round's hash-agreed weights.
   * Then the replay is exact (bench/spot-spread.ts: cosine 1.0000 at 0 steps,
   * where a few steps of early training already move outputs as far as
   * noise does). Inner steps are counted from the miner's own receipts, in
   * the order it sent them, separately before its forward and before its
   * backward. null: that stage is not checked (it had stepped, the
   * microbatch straddles a merge, the miner was not a replica of that round
   * with the majority's weights, or the checkpoint is gone).
   */
  private async references(activationId: string, pathway: string[], _span: { first: Date; last: Date }): Promise<Array<(ReplayReference & { blob?: Uint8Array }) | null>> {
    const out: Array<(ReplayReference & { blob?: Uint8Array }) | null> = [];
    const S = pathway.length;
    for (const [stage, minerId] of pathway.entries()) {
      // When this miner sent its output forward and its gradient back (its own receipts).
      // Timestamps stay text: microseconds matter here, and JavaScript Dates drop them.
      const [sent] = await this.c.db.query<{ fwd: string | null; bwd: string | null }>(
        `SELECT (max(created_at) FILTER (WHERE direction = 'activation'))::text AS fwd, (max(created_at) FILTER (WHERE direction = 'gradient'))::text AS bwd
         FROM receipts WHERE run_id = $1 AND activation_id = $2 AND reporter = $3 AND from_miner = $3`,
        [this.c.runId, activationId, minerId],
      );
      // Its forward happens when it sends the activation; the last stage's, inside its backward.
      const fwd = stage < S - 1 && sent?.fwd ? sent.fwd : undefined;
      const bwd = stage > 0 && sent?.bwd ? sent.bwd : undefined;
      const at = fwd ?? bwd;
      if (!at) {
        out.push(null);
        continue;
      }
      // The weights it held then: those of the last round it merged before (by its own report), else the initial ones.
      const [round] = await this.c.db.query<{ epoch: number; merged_hash: string | null; participants: string[] | string | null; at: string }>(
        `SELECT epoch, merged_hash, participants, merged_at->>$3 AS at FROM epochs
         WHERE run_id = $1 AND stage = $2 AND merged_at ? $3 AND (merged_at->>$3)::timestamptz < $4::timestamptz ORDER BY epoch DESC LIMIT 1`,
        [this.c.runId, stage, minerId, at],
      );
      // …and not a later merge between its forward and its backward.
      if (fwd && bwd) {
        const [between] = await this.c.db.query(
          `SELECT 1 FROM epochs WHERE run_id = $1 AND stage = $2 AND merged_at ? $3 AND (merged_at->>$3)::timestamptz BETWEEN $4::timestamptz AND $5::timestamptz`,
          [this.c.runId, stage, minerId, fwd, bwd],
        );
        if (between) {
          out.push(null);
          continue;
        }
      }
      const since = round ? round.at : '-infinity';
      // A later round it took part in without a merge report we hold (refused, or lost): its weights are not known.
      const [unreported] = await this.c.db.query(
        `SELECT 1 FROM epochs WHERE run_id = $1 AND stage = $2 AND participants ? $3 AND NOT merged_at ? $3 AND epoch > $4 AND started_at < $5::timestamptz LIMIT 1`,
        [this.c.runId, stage, minerId, round?.epoch ?? 0, at],
      );
      // A receipt of its own refused meanwhile, or still waiting for its microbatch's announcement (which
      // came late or never): a step it may have taken that its accepted receipts do not show.
      const [refused] = await this.c.db.query(
        `SELECT 1 FROM refused_receipts WHERE run_id = $1 AND miner_id = $2 AND created_at > $3::timestamptz AND created_at < $4::timestamptz LIMIT 1`,
        [this.c.runId, minerId, since, bwd ?? at],
      );
      if (unreported || refused || this.c.activations.waiting(minerId)) {
        out.push(null);
        continue;
      }
      const forwardSteps = fwd ? await this.stepsSince(minerId, stage, since, fwd, activationId) : Infinity;
      const backwardSteps = bwd ? await this.stepsSince(minerId, stage, since, bwd, activationId) : Infinity;
      if (forwardSteps > 0 && backwardSteps > 0) {
        out.push(null);
        continue;
      }
      if (!round) {
        // Never merged: the run's initial weights, if the stage had no checkpoint it could have loaded instead.
        const [checkpoint] = await this.c.db.query('SELECT 1 FROM checkpoints WHERE run_id = $1 AND stage = $2 AND created_at < $3::timestamptz LIMIT 1', [this.c.runId, stage, at]);
        out.push(checkpoint ? null : { round: 0, forwardSteps, backwardSteps });
        continue;
      }
      const participants = (typeof round.participants === 'string' ? JSON.parse(round.participants) : round.participants) ?? [];
      const events = await this.c.db.query('SELECT 1 FROM merge_events WHERE run_id = $1 AND stage = $2 AND round = $3 AND miner_id = $4', [this.c.runId, stage, round.epoch, minerId]);
      // The round must be over with a majority hash the miner shared (no event against it).
      if (!round.merged_hash || !participants.includes(minerId) || events.length > 0) {
        out.push(null);
        continue;
      }
      const [checkpoint] = await this.c.db.query<{ data: Uint8Array }>(
        'SELECT data FROM checkpoints WHERE run_id = $1 AND stage = $2 AND epoch = $3 AND hash = $4 AND data IS NOT NULL',
        [this.c.runId, stage, round.epoch, round.merged_hash],
      );
      out.push(checkpoint ? { round: round.epoch, forwardSteps, backwardSteps, hash: round.merged_hash, blob: new Uint8Array(checkpoint.data) } : null);
    }
    return out;
  }

  /**
   * Inner steps a miner took in (from, to), on other microbatches than this
   * one: each is a gradient it sent back (stage > 0) or received (stage 0)
   * for a microbatch whose forward it ran after `from` (the gradient of one
   * forwarded before its merge takes no step: PipelineWorker.merged).
   */
  private async stepsSince(minerId: string, stage: number, from: string, to: string, activationId: string): Promise<number> {
    const [row] = await this.c.db.query<{ n: number }>(
      `SELECT count(DISTINCT g.activation_id)::int AS n FROM receipts g
       WHERE g.run_id = $1 AND g.reporter = $2 AND g.direction = 'gradient' AND g.${stage === 0 ? 'to_miner' : 'from_miner'} = $2
         AND g.created_at > $3::timestamptz AND g.created_at < $4::timestamptz AND g.activation_id <> $5
         AND NOT EXISTS (SELECT 1 FROM receipts f WHERE f.run_id = $1 AND f.activation_id = g.activation_id AND f.reporter = $2
                           AND f.from_miner = $2 AND f.direction = 'activation' AND f.created_at < $3::timestamptz)`,
      [this.c.runId, minerId, from, to, activationId],
    );
    return row?.n ?? 0;
  }
}
