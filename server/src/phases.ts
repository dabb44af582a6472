import { PROTOCOL_VERSION, ProtocolError, type ClientMessage, type MergeGo } from '@train-at-home/protocol';
import { partitionMap } from '@train-at-home/swarm/partition';
import { randomInt } from 'node:crypto';
import type { Coordinator } from './coordinator';

interface StageState {
  round: number;
  phase: 'training' | 'merging';
  /** Work since this moment counts toward the next merge. */
  since: Date;
  triggeredAt?: Date;
  members: string[];
  ready: Map<string, { stateId: string; microbatches: number }>;
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
export class PhaseMachine {
  private readonly stages: StageState[];

  constructor(private readonly c: Coordinator) {
    this.stages = Array.from({ length: c.run.stages }, () => this.fresh(0));
  }

  private fresh(round: number): StageState {
    return { round, phase: 'training', since: new Date(), triggeredAt: undefined, members: [], ready: new Map(), readyDeadline: 0, go: undefined, merged: new Map(), roundDeadline: 0, busy: false };
  }

  /** Resumes round numbers after a restart; a merge cut short by the restart counts as over. */
  async load(): Promise<void> {
    const rows = await this.c.db.query<{ stage: number; round: number }>(`SELECT stage, max(epoch)::int AS round FROM epochs WHERE run_id = $1 GROUP BY stage`, [this.c.runId]);
    for (const r of rows) if (this.stages[r.stage]) this.stages[r.stage] = this.fresh(r.round);
    await this.c.db.query(`UPDATE epochs SET phase = 'training', ended_at = coalesce(ended_at, now()) WHERE run_id = $1 AND phase = 'merging'`, [this.c.runId]);
  }

  status(): Array<{ stage: number; round: number; phase: string }> {
    return this.stages.map((s, stage) => ({ stage, round: s.round, phase: s.phase }));
  }

  /**
   * Called every second by the app: starts merges that are due and ends phases whose deadline passed.
   * `deadlinesTrusted` false: this process has just stalled (a 127 MB checkpoint stored, a GC pause),
   * and answers that came in time may still be queued behind the stall (timers run before sockets
   * are read); a phase then ends only when everyone has answered.
   */
  async tick(deadlinesTrusted = true): Promise<void> {
    await Promise.all(this.stages.map((s, stage) => this.tickStage(stage, s, deadlinesTrusted)));
  }

  private async tickStage(stage: number, s: StageState, deadlinesTrusted: boolean): Promise<void> {
    if (s.busy) return;
    s.busy = true;
    try {
      const now = Date.now();
      if (s.phase === 'training') {
        const work = await this.verifiedWork(stage, s.since, new Date());
        const ids = Object.keys(work);
        if (ids.length === 0) return;
        const m = this.c.run.merge;
        const due = ids.every((id) => work[id]! >= m.every) || (now - s.since.getTime() > m.maxTrainingMs && ids.some((id) => work[id]! > 0));
        if (due) await this.startMerge(stage, s, ids);
      } else if (!s.go && ((deadlinesTrusted && now > s.readyDeadline) || s.ready.size === s.members.length)) {
        await this.go(stage, s);
      } else if (s.go && ((deadlinesTrusted && now > s.roundDeadline) || s.merged.size === s.go.participants.length)) {
        await this.finish(stage, s);
      }
    } finally {
      s.busy = false;
    }
  }

  /** Verified microbatches per active miner of a stage in [from, to): activations both ends confirmed. */
  private async verifiedWork(stage: number, from: Date, to: Date): Promise<Record<string, number>> {
    const rows = await this.c.db.query<{ id: string; n: number }>(
      `WITH verified AS (
         SELECT activation_id, from_miner, to_miner FROM receipts
         WHERE run_id = $1 AND direction = 'activation' AND created_at >= $2 AND created_at < $3
         GROUP BY activation_id, from_miner, to_miner
         HAVING count(*) = 2 AND count(DISTINCT (bytes, payload_hash)) = 1)
       SELECT m.id, count(v.activation_id)::int AS n FROM miners m
       LEFT JOIN verified v ON (m.stage > 0 AND v.to_miner = m.id) OR (m.stage = 0 AND v.from_miner = m.id)
       WHERE m.run_id = $1 AND m.status = 'active' AND m.stage = $4
       GROUP BY m.id`,
      [this.c.runId, from, to, stage],
    );
    return Object.fromEntries(rows.map((r) => [r.id, r.n]));
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
    for (const id of s.members) this.c.sockets.get(id)?.emit('merge', { v: PROTOCOL_VERSION, stage, round });
  }

  async onReady(minerId: string, msg: ClientMessage<'merge-ready'>): Promise<void> {
    const s = this.stages[msg.stage];
    if (!s || s.phase !== 'merging' || s.go || msg.round !== s.round) throw new ProtocolError('OUT_OF_PHASE', `stage ${msg.stage} is not waiting for replicas of round ${msg.round}`);
    if (!s.members.includes(minerId)) throw new ProtocolError('OUT_OF_PHASE', 'this miner is not a replica of that stage in this round');
    if (s.ready.has(minerId)) throw new ProtocolError('REPLAYED', 'already ready');
    s.ready.set(minerId, { stateId: msg.stateId, microbatches: msg.microbatches });
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
    s.go = {
      v: PROTOCOL_VERSION,
      stage,
      round: s.round,
      seed: randomInt(0, 2 ** 31),
      mode: participants.length >= 2 && states.size === 1 ? 'outer' : 'average',
      participants,
      weights,
      precision: m.precision,
      reduction: m.reduction === 'centered-clip' ? { kind: 'centered-clip', radius: m.clipRadius } : { kind: 'mean' },
      timeouts: { senderMs: m.senderMs, reducerMs: m.reducerMs, roundMs: m.roundMs },
      outer: { lr: m.outerLr, momentum: m.outerMomentum },
      uploader: participants[0] ?? '',
    };
    s.roundDeadline = Date.now() + m.roundMs + m.readyMs;
    await this.c.db.query(`UPDATE epochs SET mode = $4, participants = $5 WHERE run_id = $1 AND stage = $2 AND epoch = $3`, [
      this.c.runId,
      stage,
      s.round,
      s.go.mode,
      JSON.stringify(participants),
    ]);
    // Everyone who was asked hears the outcome; one not named resumes training at once.
    for (const id of s.members) this.c.sockets.get(id)?.emit('merge-go', s.go);
    if (participants.length === 0) await this.finish(stage, s);
  }

  /** A replica's merge report; `arrived` (clock.ts) is when its training with the merged weights began, as the coordinator saw it. */
  async onMerged(minerId: string, msg: ClientMessage<'merged'>, arrived: string): Promise<void> {
    const s = this.stages[msg.stage];
    if (!s || s.phase !== 'merging' || !s.go || msg.round !== s.round) throw new ProtocolError('OUT_OF_PHASE', `stage ${msg.stage} is not merging round ${msg.round}`);
    if (!s.go.participants.includes(minerId)) throw new ProtocolError('OUT_OF_PHASE', 'this miner is not a participant of the round');
    if (s.merged.has(minerId)) throw new ProtocolError('REPLAYED', 'already reported');
    checkMergeReport(s.go, msg);
    s.merged.set(minerId, { ok: msg.ok, hash: msg.hash, error: msg.error, clipped: msg.clipped });
    const { go, round } = s;
    if (msg.ok) {
      await this.c.db.query(`UPDATE epochs SET merged_at = merged_at || jsonb_build_object($4::text, $5::text) WHERE run_id = $1 AND stage = $2 AND epoch = $3`, [
        this.c.runId,
        msg.stage,
        round,
        minerId,
        arrived,
      ]);
    }
    const events = msg.evidence.map((e) => ({ kind: 'dispute', miner: e.liar ?? null, detail: { partition: e.partition, owners: e.owners, hashes: e.hashes } }));
    if (!msg.ok) events.push({ kind: 'failed', miner: minerId, detail: { error: msg.error } as never });
    await this.record(msg.stage, round, minerId, events);
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
    Object.assign(s, { ...this.fresh(s.round), since, busy: s.busy });
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
export function checkMergeReport(go: MergeGo, msg: ClientMessage<'merged'>): void {
  const n = go.participants.length;
  if (msg.clipped > 2 * n) throw new ProtocolError('OUT_OF_BOUNDS', `clipped ${msg.clipped}: a replica of a ${n}-replica round reduces at most ${2 * n} contributions`);
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
