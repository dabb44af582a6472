// One file over 400 lines, not yet split by role: the phase machine (trigger, ready window, go, reports, close) is one
// state per stage that every step reads and writes; issue 40 splits it along with the run state it queries.
import { PROTOCOL_VERSION, ProtocolError, type ClientMessage, type MergeGo } from '@train-at-home/protocol';
import { roundPrecision } from '@train-at-home/swarm/codec';
import { partitionMap } from '@train-at-home/swarm/partition';
import { randomInt } from 'node:crypto';
import type { MinerChannel, RunContext } from './run-state';
import type { Flags } from './state/flags';

/** What the phase machine uses of the run: its state, its miners, and the flags a refused slice raises. */
export interface PhaseHost extends RunContext, MinerChannel {
  readonly flags: Pick<Flags, 'raise'>;
}

interface StageState {
  round: number;
  phase: 'training' | 'merging';
  /** Work since this moment counts toward the next merge. */
  since: Date;
  triggeredAt?: Date;
  members: string[];
  ready: Map<string, { stateId: string; microbatches: number; roots: { outer: string; average: string } }>;
  readyDeadline: number;
  go?: MergeGo;
  merged: Map<string, { ok: boolean; hash: string; error?: string; clipped: number }>;
  roundDeadline: number;
  busy: boolean;
}

/**
 * The per-stage phase machine: training → merging → training.
 *
 * A stage trains until each of its replicas has `merge.every` verified
 * microbatches (both ends confirmed the transfer) since its last merge, or
 * until `merge.maxTrainingMs` has passed with some work done. Then:
 *   1. `merge` {stage, round}: replicas pause their pipeline worker and answer
 *      `merge-ready` with the id of their (anchor, outer momentum) state;
 *   2. after all answered (or `readyMs`), `merge-go` names the participants,
 *      the seed of the partition map, the work weights and the mode;
 *      replicas that answered late sit this round out and keep training;
 *   3. replicas run the butterfly all-reduce peer to peer and report `merged`
 *      with the hash of their new weights and any evidence of lying owners;
 *   4. when all reported (or the round's deadline passed) the stage trains
 *      again; replicas whose hash differs from the majority, or that never
 *      reported, are recorded as events for the validator.
 * A miner is never punished for the coordinator's own races: a late answer is
 * ignored, and its work simply counts toward the next round.
 */
/** How long a closed round's checkpoint may take to come in before another replica with the same weights is asked for it. */
export const CHECKPOINT_WAIT_MS = 5_000;
/** A phase's deadline ends it this long after it passed even while the process distrusts its own timers (app.ts, STALL_MS). */
export const UNTRUSTED_GRACE_MS = 30_000;

export class PhaseMachine {
  private readonly stages: StageState[];
  /** Per stage: a closed round whose agreed weights are not stored yet, and the replicas that hold them, to ask in turn. */
  private readonly awaited: Array<{ round: number; hash: string; holders: string[]; askAt: number } | undefined>;
  /**
   * A stage's merge round is over (its replicas train again): the validator's
   * audits reveal their draw for it and commit to the next (jobs/audits.ts).
   * `merged`: the replicas whose merge went through with the majority's weights.
   */
  onRoundClosed?: (stage: number, round: number, merged: string[]) => Promise<void>;
  /**
   * Activation transfers both ends confirmed alike (same bytes and hash), with the arrival times (ms) of their
   * two receipts: told by the receipt handler when the second one comes in (noteVerified), kept while a stage's
   * window may still count them. Verified work is counted from these, never recomputed from every receipt.
   */
  private readonly verified = new Map<string, { from: string; to: string; first: number; last: number }>();
  /**
   * Whether this process runs the phases (always with one process). In scale-out mode only the singleton
   * jobs' holder does (scale-out.ts): the others pass their miners' merge answers and verified transfers
   * to it (`remote`), and show the stages as it last published them (`mirror`).
   */
  leading = true;
  remote?: {
    call(kind: 'ready' | 'merged', minerId: string, msg: ClientMessage<'merge-ready'> | ClientMessage<'merged'>, arrived: string): Promise<void>;
    verified(activationId: string, from: string, to: string, a: string, b: string): void;
  };
  private mirrored?: Array<{ stage: number; round: number; phase: string }>;

  constructor(private readonly c: PhaseHost) {
    this.stages = Array.from({ length: c.run.stages }, () => this.fresh(0));
    this.awaited = Array.from({ length: c.run.stages }, () => undefined);
  }

  private fresh(round: number): StageState {
    return { round, phase: 'training', since: new Date(), triggeredAt: undefined, members: [], ready: new Map(), readyDeadline: 0, go: undefined, merged: new Map(), roundDeadline: 0, busy: false };
  }

  /**
   * Resumes round numbers after a restart; a merge cut short by the restart counts as over. `takeOver` false:
   * only the numbers (a process of several that does not run the phases: the one that does may be merging).
   */
  async load(takeOver = true): Promise<void> {
    const rows = await this.c.db.query<{ stage: number; round: number }>(`SELECT stage, max(epoch)::int AS round FROM epochs WHERE run_id = $1 GROUP BY stage`, [this.c.runId]);
    for (const r of rows) if (this.stages[r.stage]) this.stages[r.stage] = this.fresh(r.round);
    if (!takeOver) return;
    await this.c.db.query(`UPDATE epochs SET phase = 'training', ended_at = coalesce(ended_at, now()) WHERE run_id = $1 AND phase = 'merging'`, [this.c.runId]);
  }

  status(): Array<{ stage: number; round: number; phase: string }> {
    if (!this.leading && this.mirrored) return this.mirrored.map((s) => ({ ...s }));
    return this.stages.map((s, stage) => ({ stage, round: s.round, phase: s.phase }));
  }

  /** The leading process's stages, as it published them (scale-out.ts); anything malformed is ignored. */
  mirror(status: unknown): void {
    if (!Array.isArray(status) || status.length !== this.stages.length) return;
    const ok = status.every((s: { stage?: unknown; round?: unknown; phase?: unknown }, i) => s?.stage === i && Number.isSafeInteger(s.round) && (s.phase === 'training' || s.phase === 'merging'));
    if (ok) this.mirrored = status.map((s: { stage: number; round: number; phase: string }) => ({ stage: s.stage, round: s.round, phase: s.phase }));
  }

  /** This process starts running the phases (it took the singleton jobs): rounds resume from the database, as after a restart. */
  async lead(): Promise<void> {
    for (let stage = 0; stage < this.stages.length; stage++) this.stages[stage] = this.fresh(0);
    this.awaited.fill(undefined);
    this.verified.clear();
    await this.load();
    this.leading = true;
  }

  /**
   * Called every second by the app: starts merges that are due and ends phases whose deadline passed.
   * `deadlinesTrusted` false: this process has just stalled (a 127 MB checkpoint stored, a GC pause),
   * and answers that came in time may still be queued behind the stall (timers run before sockets
   * are read); a phase then ends only when everyone has answered.
   */
  async tick(deadlinesTrusted = true): Promise<void> {
    if (!this.leading) return;
    await Promise.all(this.stages.map((s, stage) => this.tickStage(stage, s, deadlinesTrusted)));
  }

  private async tickStage(stage: number, s: StageState, deadlinesTrusted: boolean): Promise<void> {
    if (s.busy) return;
    s.busy = true;
    try {
      const now = Date.now();
      // A deadline counts once this process trusts its timers again, or UNTRUSTED_GRACE_MS after it in any case: under
      // a process that keeps stalling, a replica that left would otherwise hold its stage's phase open for ever.
      const passed = (deadline: number): boolean => (deadlinesTrusted && now > deadline) || now > deadline + UNTRUSTED_GRACE_MS;
      await this.awaitCheckpoint(stage, now);
      if (s.phase === 'training') {
        const work = await this.verifiedWork(stage, s.since, new Date());
        const ids = Object.keys(work);
        if (ids.length === 0) return;
        const m = this.c.run.merge;
        const due = ids.every((id) => work[id]! >= m.every) || (now - s.since.getTime() > m.maxTrainingMs && ids.some((id) => work[id]! > 0));
        if (due) await this.startMerge(stage, s, ids);
      } else if (!s.go && (passed(s.readyDeadline) || s.ready.size === s.members.length)) {
        await this.go(stage, s);
      } else if (s.go && (passed(s.roundDeadline) || s.merged.size === s.go.participants.length)) {
        await this.finish(stage, s);
      }
    } finally {
      s.busy = false;
    }
  }

  /**
   * A round's checkpoint is the weights its majority ended with. The replica named in `merge-go` sends it;
   * if none with that hash is stored CHECKPOINT_WAIT_MS later (it left, failed, or sent other weights, which
   * were dropped), the next replica that holds them is asked (`checkpoint`), until one sends them.
   */
  private async awaitCheckpoint(stage: number, now: number): Promise<void> {
    const a = this.awaited[stage];
    if (!a || now < a.askAt) return;
    const [stored] = await this.c.db.query('SELECT 1 FROM checkpoints WHERE run_id = $1 AND stage = $2 AND epoch = $3 AND hash = $4 AND data IS NOT NULL', [this.c.runId, stage, a.round, a.hash]);
    let next: string | undefined;
    for (const id of stored ? [] : a.holders) if (!next && (await this.c.canReach(id))) next = id;
    if (!next) {
      if (!stored) this.c.log.warn({ stage, round: a.round }, 'no replica sent the round\'s checkpoint');
      this.awaited[stage] = undefined;
      return;
    }
    a.holders = a.holders.filter((id) => id !== next);
    a.askAt = now + CHECKPOINT_WAIT_MS;
    this.c.toMiner({ id: next, kind: 'emit', event: 'checkpoint', payload: { v: PROTOCOL_VERSION, stage, round: a.round, hash: a.hash } });
  }

  /**
   * A transfer's second receipt came in and both ends agree (socket/registration.ts): it counts as verified
   * work of its receiver (and, from stage 0, of its sender) in any window that holds both receipts' arrivals.
   */
  noteVerified(activationId: string, from: string, to: string, a: Date | string, b: Date | string): void {
    if (!this.leading && this.remote) return this.remote.verified(activationId, from, to, new Date(a).toISOString(), new Date(b).toISOString());
    const key = `${activationId}:${from}:${to}`;
    if (this.verified.has(key)) return; // both receipts' handlers may see the pair
    const [t1, t2] = [new Date(a).getTime(), new Date(b).getTime()];
    this.verified.set(key, { from, to, first: Math.min(t1, t2), last: Math.max(t1, t2) });
  }

  /** Verified microbatches per active miner of a stage in [from, to): activations both ends confirmed, both receipts in the window. */
  private async verifiedWork(stage: number, from: Date, to: Date): Promise<Record<string, number>> {
    const members = await this.c.db.query<{ id: string }>(`SELECT id FROM miners WHERE run_id = $1 AND status = 'active' AND stage = $2`, [this.c.runId, stage]);
    const work: Record<string, number> = Object.fromEntries(members.map((m) => [m.id, 0]));
    const [start, end] = [from.getTime(), to.getTime()];
    for (const v of this.verified.values()) {
      if (v.first < start || v.last >= end) continue;
      const credited = stage === 0 ? v.from : v.to;
      if (work[credited] !== undefined) work[credited]++;
    }
    return work;
  }

  /** Verified microbatches per active miner of a stage since its last merge (what its next merge waits for and weighs by). */
  workSinceMerge(stage: number): Promise<Record<string, number>> {
    return this.verifiedWork(stage, this.stages[stage]!.since, new Date(Date.now() + 1));
  }

  /** Forgets verified transfers that no stage's window can count any more (they began before every stage's `since`). */
  private pruneVerified(): void {
    const oldest = Math.min(...this.stages.map((s) => s.since.getTime()));
    for (const [key, v] of this.verified) if (v.first < oldest) this.verified.delete(key);
  }

  private async startMerge(stage: number, s: StageState, members: string[]): Promise<void> {
    const round = s.round + 1;
    await this.c.db.query(
      `INSERT INTO epochs (run_id, stage, epoch, phase) VALUES ($1, $2, $3, 'merging') ON CONFLICT (run_id, stage, epoch) DO UPDATE SET phase = 'merging', started_at = now()`,
      [this.c.runId, stage, round],
    );
    Object.assign(s, { ...this.fresh(round), since: s.since, busy: true });
    s.phase = 'merging';
    s.triggeredAt = new Date();
    s.members = members.sort();
    s.readyDeadline = Date.now() + this.c.run.merge.readyMs;
    for (const id of s.members) this.c.toMiner({ id, kind: 'emit', event: 'merge', payload: { v: PROTOCOL_VERSION, stage, round } });
  }

  async onReady(minerId: string, msg: ClientMessage<'merge-ready'>, arrived = new Date().toISOString()): Promise<void> {
    if (!this.leading && this.remote) return this.remote.call('ready', minerId, msg, arrived);
    const s = this.stages[msg.stage];
    if (!s || s.phase !== 'merging' || s.go || msg.round !== s.round) {
      const now = !s ? 'no such stage in this run' : s.phase === 'merging' && s.go && s.round === msg.round ? 'its merge went on without this replica' : s.phase === 'merging' ? `it is merging round ${s.round}` : `it is training towards round ${s.round + 1}`;
      throw new ProtocolError('OUT_OF_PHASE', `stage ${msg.stage + 1} is not waiting for replicas of round ${msg.round}: ${now}`);
    }
    if (!s.members.includes(minerId)) throw new ProtocolError('OUT_OF_PHASE', 'this miner is not a replica of that stage in this round');
    if (s.ready.has(minerId)) throw new ProtocolError('REPLAYED', 'already ready');
    s.ready.set(minerId, { stateId: msg.stateId, microbatches: msg.microbatches, roots: msg.contributionRoots });
    // The round's end and its contribution, committed: an audit of it replays to these (jobs/audits.ts).
    await this.c.db.query(
      `INSERT INTO round_commitments (run_id, stage, round, miner_id, weights_hash, optimizer_hash, ready_at, outer_root, average_root, start_round, start_hash, start_optimizer)
       VALUES ($1, $2, $3, $4, $5, $6, $7::timestamptz, $8, $9, $10, $11, $12)
       ON CONFLICT (run_id, stage, round, miner_id) DO NOTHING`,
      [
        this.c.runId,
        msg.stage,
        msg.round,
        minerId,
        msg.weightsHash,
        msg.optimizerHash,
        arrived,
        msg.contributionRoots.outer,
        msg.contributionRoots.average,
        msg.start?.round ?? null,
        msg.start?.hash ?? null,
        msg.start?.optimizerHash ?? null,
      ],
    );
    if (s.ready.size === s.members.length && !s.busy) {
      s.busy = true;
      try {
        await this.go(msg.stage, s);
      } finally {
        s.busy = false;
      }
    }
  }

  private async go(stage: number, s: StageState): Promise<void> {
    if (s.go) return;
    const participants = [...s.ready.keys()].sort();
    const m = this.c.run.merge;
    const work = await this.verifiedWork(stage, s.since, s.triggeredAt ?? new Date());
    const weights = Object.fromEntries(participants.map((id) => [id, work[id] ?? 0]));
    // Nobody's work verified (e.g. right after a coordinator restart): equal weights.
    if (participants.every((id) => weights[id] === 0)) participants.forEach((id) => (weights[id] = 1));
    const states = new Set(participants.map((id) => s.ready.get(id)!.stateId));
    const mode = participants.length >= 2 && states.size === 1 ? 'outer' : 'average';
    s.go = {
      v: PROTOCOL_VERSION,
      stage,
      round: s.round,
      seed: randomInt(0, 2 ** 31),
      mode,
      participants,
      weights,
      precision: roundPrecision(m.precision, mode),
      reduction: m.reduction === 'centered-clip' ? { kind: 'centered-clip', radius: m.clipScale > 0 ? m.clipScale : m.clipRadius, relative: m.clipScale > 0 } : { kind: 'mean' },
      timeouts: { senderMs: m.senderMs, reducerMs: m.reducerMs, roundMs: m.roundMs },
      outer: { lr: m.outerLr, momentum: m.outerMomentum },
      uploader: participants[0] ?? '',
      commitments: Object.fromEntries(participants.map((id) => [id, s.ready.get(id)!.roots[mode]])),
    };
    s.roundDeadline = Date.now() + m.roundMs + m.readyMs;
    await this.c.db.query(`UPDATE epochs SET mode = $4, participants = $5, seed = $6 WHERE run_id = $1 AND stage = $2 AND epoch = $3`, [
      this.c.runId,
      stage,
      s.round,
      s.go.mode,
      JSON.stringify(participants),
      s.go.seed,
    ]);
    // Everyone who was asked hears the outcome; one not named resumes training at once.
    for (const id of s.members) this.c.toMiner({ id, kind: 'emit', event: 'merge-go', payload: s.go });
    if (participants.length === 0) await this.finish(stage, s);
  }

  private async recordLateReport(minerId: string, msg: ClientMessage<'merged'>, arrived: string): Promise<boolean> {
    const rows = await this.c.db.query(
      `UPDATE epochs SET merged_at = merged_at || jsonb_build_object($4::text, $5::text), merged_hashes = merged_hashes || jsonb_build_object($4::text, $6::text)
       WHERE run_id = $1 AND stage = $2 AND epoch = $3 AND participants @> jsonb_build_array($4::text) AND merged_hashes -> $4::text IS NULL
       RETURNING 1`,
      [this.c.runId, msg.stage, msg.round, minerId, arrived, msg.hash],
    );
    return rows.length > 0;
  }

  /** A replica's merge report; `arrived` (clock.ts) is when its training with the merged weights began, as the coordinator saw it. */
  async onMerged(minerId: string, msg: ClientMessage<'merged'>, arrived: string): Promise<void> {
    if (!this.leading && this.remote) return this.remote.call('merged', minerId, msg, arrived);
    const s = this.stages[msg.stage];
    if (!s || s.phase !== 'merging' || !s.go || msg.round !== s.round) {
      // A participant's report that arrived after its round closed: the round's outcome stands, but the hash of the
      // weights it holds is what an audit of its next round starts from (without it, that audit was skipped).
      if (s && msg.ok && msg.round <= s.round && (await this.recordLateReport(minerId, msg, arrived))) return;
      throw new ProtocolError('OUT_OF_PHASE', `stage ${msg.stage + 1} is not merging round ${msg.round}`);
    }
    if (!s.go.participants.includes(minerId)) throw new ProtocolError('OUT_OF_PHASE', 'this miner is not a participant of the round');
    if (s.merged.has(minerId)) throw new ProtocolError('REPLAYED', 'already reported');
    checkMergeReport(s.go, msg, minerId);
    s.merged.set(minerId, { ok: msg.ok, hash: msg.hash, error: msg.error, clipped: msg.clipped });
    const { go, round } = s;
    if (msg.ok) {
      await this.c.db.query(
        `UPDATE epochs SET merged_at = merged_at || jsonb_build_object($4::text, $5::text), merged_hashes = merged_hashes || jsonb_build_object($4::text, $6::text)
         WHERE run_id = $1 AND stage = $2 AND epoch = $3`,
        [this.c.runId, msg.stage, round, minerId, arrived, msg.hash],
      );
    }
    const received = msg.received ?? [];
    if (received.length > 0) {
      const values = received.map((_, i) => `($1, $2, $3, $4, $${5 + 3 * i}, $${6 + 3 * i}, $${7 + 3 * i})`).join(', ');
      await this.c.db.query(
        `INSERT INTO contribution_receipts (run_id, stage, round, owner, sender, partition, hash) VALUES ${values} ON CONFLICT DO NOTHING`,
        [this.c.runId, msg.stage, round, minerId, ...received.flatMap((r) => [r.from, r.partition, r.hash])],
      );
    }
    const events = msg.evidence.map((e) => ({ kind: 'dispute', miner: e.liar ?? null, detail: { partition: e.partition, owners: e.owners, hashes: e.hashes } }));
    if (!msg.ok) events.push({ kind: 'failed', miner: minerId, detail: { error: msg.error } as never });
    const refused = msg.refused ?? [];
    const sentHash = (r: { partition: number; from: string }): string | null => received.find((x) => x.partition === r.partition && x.from === r.from)?.hash ?? null;
    for (const r of refused) events.push({ kind: 'commitment-mismatch', miner: r.from, detail: { partition: r.partition, hash: sentHash(r) } as never });
    // Whose contribution its CenteredClip clipped: both owners of a partition naming one draws its round for an audit (jobs/audits.ts).
    for (const r of msg.clippedFrom ?? []) events.push({ kind: 'clipped', miner: r.from, detail: { partition: r.partition } as never });
    await this.record(msg.stage, round, minerId, events);
    if (refused.length > 0) await this.commitmentMismatches(msg.stage, round, go, minerId, refused);
    // Meanwhile another report (or the tick's deadline) may have finished this round.
    if (s.go === go && s.merged.size === go.participants.length && !s.busy) {
      s.busy = true;
      try {
        await this.finish(msg.stage, s);
      } finally {
        s.busy = false;
      }
    }
  }

  /**
   * An owner refused slices whose proof did not lead to their sender's committed root. One owner's word names
   * nobody (it could be lying); both owners of a partition refusing the same sender's slice is the sender's doing:
   * it sent bytes it had not committed to with merge-ready (the Merkle roots), so it is flagged COMMITMENT_MISMATCH.
   * Both owners colluding could frame an honest sender so: redundancy 2 trusts one owner of each partition.
   */
  private async commitmentMismatches(stage: number, round: number, go: MergeGo, reporter: string, refused: Array<{ partition: number; from: string }>): Promise<void> {
    const map = partitionMap({ peers: go.participants, length: go.participants.length, seed: go.seed });
    for (const r of refused) {
      const coOwner = map[r.partition]!.owners.find((o) => o !== reporter);
      if (!coOwner || coOwner === r.from) continue;
      const reports = await this.c.db.query<{ reporter: string; hash: string | null }>(
        `SELECT reporter, detail ->> 'hash' AS hash FROM merge_events
         WHERE run_id = $1 AND stage = $2 AND round = $3 AND kind = 'commitment-mismatch' AND miner_id = $4 AND (detail ->> 'partition')::int = $5 AND reporter = ANY($6::text[])`,
        [this.c.runId, stage, round, r.from, r.partition, [reporter, coOwner]],
      );
      if (new Set(reports.map((x) => x.reporter)).size < 2) continue;
      await this.c.flags.raise(r.from, 'COMMITMENT_MISMATCH', `both owners of partition ${r.partition} of stage ${stage + 1}'s merge round ${round} refused its slice: not the contribution it committed to with merge-ready`, {
        stage,
        round,
        partition: r.partition,
        owners: [reporter, coOwner],
        hashes: reports.map((x) => x.hash),
      });
    }
  }

  private async record(stage: number, round: number, reporter: string | null, events: Array<{ kind: string; miner: string | null; detail: object }>): Promise<void> {
    if (events.length === 0) return;
    const values = events.map((_, i) => `($1, $2, $3, $${4 + 3 * i}, $${5 + 3 * i}, $${6 + 3 * i}, $${4 + 3 * events.length})`).join(', ');
    await this.c.db.query(
      `INSERT INTO merge_events (run_id, stage, round, kind, miner_id, detail, reporter) VALUES ${values}`,
      [this.c.runId, stage, round, ...events.flatMap((e) => [e.kind, e.miner, JSON.stringify(e.detail)]), reporter],
    );
  }

  /** Ends the round: the majority hash is the stage's; replicas that differ or never reported are flagged. */
  private async finish(stage: number, s: StageState): Promise<void> {
    const participants = s.go?.participants ?? [];
    const counts = new Map<string, number>();
    for (const r of s.merged.values()) if (r.ok) counts.set(r.hash, (counts.get(r.hash) ?? 0) + 1);
    const majority = [...counts].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))[0]?.[0] ?? null;
    const events: Array<{ kind: string; miner: string | null; detail: object }> = [];
    for (const id of participants) {
      const r = s.merged.get(id);
      if (!r) events.push({ kind: 'missed', miner: id, detail: {} });
      else if (r.ok && r.hash !== majority) events.push({ kind: 'hash-mismatch', miner: id, detail: { hash: r.hash, majority } });
    }
    await this.record(stage, s.round, null, events);
    // What each replica's CenteredClip clipped over the partitions it reduced (0 under a plain mean).
    const clipped = Object.fromEntries([...s.merged].map(([id, r]) => [id, r.clipped]));
    await this.c.db.query(`UPDATE epochs SET phase = 'training', merged_hash = $4, clipped = $5, ended_at = now() WHERE run_id = $1 AND stage = $2 AND epoch = $3`, [
      this.c.runId,
      stage,
      s.round,
      majority,
      JSON.stringify(clipped),
    ]);
    const since = s.triggeredAt ?? new Date();
    const closed = s.round;
    // Only replicas whose merge went through with the majority's weights ended their round (the others train on in it).
    const merged = participants.filter((id) => s.merged.get(id)?.ok && s.merged.get(id)?.hash === majority);
    // The round's checkpoint is the majority's weights: another upload is dropped, and the replicas that hold them are asked in turn until one is stored.
    await this.c.db.query('DELETE FROM checkpoints WHERE run_id = $1 AND stage = $2 AND epoch = $3 AND hash IS DISTINCT FROM $4', [this.c.runId, stage, closed, majority]);
    if (majority) {
      const uploader = s.go?.uploader;
      const holders = merged.filter((id) => id !== uploader).sort(() => Math.random() - 0.5);
      this.awaited[stage] = { round: closed, hash: majority, holders, askAt: Date.now() + CHECKPOINT_WAIT_MS };
    }
    Object.assign(s, { ...this.fresh(s.round), since, busy: s.busy });
    this.pruneVerified();
    if (this.onRoundClosed) await this.onRoundClosed(stage, closed, merged).catch((e: unknown) => this.c.log.error({ err: e }, 'audits of a closed round failed to start'));
  }
}

/**
 * What a replica's merge report may claim, given its round: with n
 * participants there are n partitions and each replica reduces two, over at
 * most n contributions each, so it clips at most 2n; evidence names
 * partitions of the round, each once, with their true owners (the partition
 * map is the round's, from its seed), and a liar among them. Anything else is
 * refused by name (OUT_OF_BOUNDS) and nothing of the report is stored.
 */
export function checkMergeReport(go: MergeGo, msg: ClientMessage<'merged'>, reporter = ''): void {
  const n = go.participants.length;
  if (msg.clipped > 2 * n) throw new ProtocolError('OUT_OF_BOUNDS', `clipped ${msg.clipped}: a replica of a ${n}-replica round reduces at most ${2 * n} contributions`);
  // Slices received and contributions clipped (its own among them), and slices refused (another's), name partitions
  // the reporter owns, from participants, each once; no more clipped than it counted.
  if ((msg.clippedFrom?.length ?? 0) > msg.clipped) throw new ProtocolError('OUT_OF_BOUNDS', `${msg.clippedFrom!.length} clipped contributions named, ${msg.clipped} counted`);
  for (const [slices, own] of [[msg.received ?? [], true], [msg.clippedFrom ?? [], true], [msg.refused ?? [], false]] as const) {
    if (slices.length === 0) continue;
    if (n < 2) throw new ProtocolError('OUT_OF_BOUNDS', 'a round of one has no partitions');
    const owned = partitionMap({ peers: go.participants, length: n, seed: go.seed });
    const pairs = new Set<string>();
    for (const r of slices) {
      const p = owned[r.partition];
      if (!p || !p.owners.includes(reporter)) throw new ProtocolError('OUT_OF_BOUNDS', `partition ${r.partition} is not the reporter's to receive`);
      if (!go.participants.includes(r.from) || (!own && r.from === reporter)) throw new ProtocolError('OUT_OF_BOUNDS', `${r.from.slice(0, 8)}… is not ${own ? 'a' : 'another'} participant of the round`);
      const key = `${r.partition}:${r.from}`;
      if (pairs.has(key)) throw new ProtocolError('OUT_OF_BOUNDS', `partition ${r.partition} from ${r.from.slice(0, 8)}… named twice`);
      pairs.add(key);
    }
  }
  if (msg.evidence.length === 0) return;
  if (n < 2) throw new ProtocolError('OUT_OF_BOUNDS', 'a round of one has no partitions to dispute');
  const map = partitionMap({ peers: go.participants, length: n, seed: go.seed });
  const seen = new Set<number>();
  for (const e of msg.evidence) {
    const p = map[e.partition];
    if (!p) throw new ProtocolError('OUT_OF_BOUNDS', `partition ${e.partition}: the round has ${n}`);
    if (seen.has(e.partition)) throw new ProtocolError('OUT_OF_BOUNDS', `partition ${e.partition} disputed twice`);
    seen.add(e.partition);
    if ([...e.owners].sort().join() !== [...p.owners].sort().join()) throw new ProtocolError('OUT_OF_BOUNDS', `partition ${e.partition} is not owned by the miners named`);
    if (e.liar !== undefined && !e.owners.includes(e.liar)) throw new ProtocolError('OUT_OF_BOUNDS', 'the liar named is not an owner of the partition');
  }
}
