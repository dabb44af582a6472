import type { Queryable } from '../db/database';

/** One microbatch that counts: every transfer of its pathway confirmed by both ends. */
export interface VerifiedMicrobatch {
  activationId: string;
  pathway: string[];
  loss: number;
  round: number;
  at: Date;
}

/**
 * Work accounting for [from, to): a microbatch counts for the miners on its
 * pathway only when
 *   - every transfer of it (each activation forward, each gradient back) was
 *     confirmed by both ends with the same bytes and hash,
 *   - none of its payloads had been seen before under another microbatch
 *     (a replay of an older activation), and
 *   - the miner's merge round was not disputed or divergent: a replica named
 *     as a liar, or whose merged weights differed, failed or never came, gets
 *     no work for the training phase before that round, and
 *   - the miner could have been audited for it: where the stage's round had an
 *     audit draw (audit_rounds, rate > 0), only the replicas that committed
 *     their round with merge-ready and ended it with the agreed weights are
 *     drawn (Auditor.roundClosed), so only their work in it counts. Work in a
 *     round the miner never committed (it stayed out of the merge, or was
 *     not ready in time) or that has not closed yet is work nobody could
 *     check: unpaid, as a cheat that never commits would otherwise be paid
 *     without ever being audited, unless the record of a later round it
 *     committed carries it (starts before it), whose replay checks it; and
 *   - no restart of the miner left it unauditable (restartWindows).
 * Returns the microbatches and each miner's count.
 */
export async function verifiedWork(db: Queryable, runId: number, from: Date, to: Date): Promise<{ microbatches: VerifiedMicrobatch[]; work: Map<string, number> }> {
  const rows = await db.query<{ activation_id: string; pathway: string[] | string; value: number; round: number | null; created_at: Date; confirmed: number; replayed: boolean }>(
    `WITH mb AS (
       SELECT activation_id, pathway, value, round, created_at FROM metrics
       WHERE run_id = $1 AND name = 'train_loss' AND pathway IS NOT NULL AND created_at >= $2 AND created_at < $3),
     transfers AS (
       SELECT r.activation_id, r.direction, r.from_miner, r.to_miner,
              bool_or(EXISTS (SELECT 1 FROM receipts o WHERE o.run_id = $1 AND o.payload_hash = r.payload_hash
                                AND o.activation_id <> r.activation_id AND o.created_at <= r.created_at)) AS replayed
       FROM receipts r JOIN mb ON mb.activation_id = r.activation_id
       WHERE r.run_id = $1
       GROUP BY r.activation_id, r.direction, r.from_miner, r.to_miner
       HAVING count(*) = 2 AND count(DISTINCT (r.bytes, r.payload_hash)) = 1)
     SELECT mb.activation_id, mb.pathway, mb.value, mb.round, mb.created_at,
            count(t.activation_id)::int AS confirmed, coalesce(bool_or(t.replayed), false) AS replayed
     FROM mb LEFT JOIN transfers t ON t.activation_id = mb.activation_id
     GROUP BY mb.activation_id, mb.pathway, mb.value, mb.round, mb.created_at`,
    [runId, from, to],
  );
  const excluded = await disputedWindows(db, runId);
  for (const [key, windows] of await restartWindows(db, runId)) excluded.set(key, [...(excluded.get(key) ?? []), ...windows]);
  const drawable = await drawableRounds(db, runId);
  const microbatches: VerifiedMicrobatch[] = [];
  const work = new Map<string, number>();
  for (const r of rows) {
    const pathway = (typeof r.pathway === 'string' ? JSON.parse(r.pathway) : r.pathway) as string[];
    // Each boundary is crossed twice: the activation forward, its gradient back.
    if (r.replayed || r.confirmed !== 2 * (pathway.length - 1)) continue;
    const at = new Date(r.created_at);
    microbatches.push({ activationId: r.activation_id, pathway, loss: r.value, round: r.round ?? 0, at });
    for (const [stage, miner] of pathway.entries()) {
      // Its windows on this stage, and those on every stage (`*`).
      const windows = [...(excluded.get(`${stage}:${miner}`) ?? []), ...(excluded.get(`*:${miner}`) ?? [])];
      if (windows.some(([a, b]) => at >= a && at <= b)) continue;
      if (!drawable.mayPay(stage, miner, at)) continue;
      work.set(miner, (work.get(miner) ?? 0) + 1);
    }
  }
  return { microbatches, work };
}

/** For each (stage, miner) whose merge round went wrong, the training phase before that round. */
async function disputedWindows(db: Queryable, runId: number): Promise<Map<string, Array<[Date, Date]>>> {
  const events = await db.query<{ stage: number; round: number; miner_id: string }>(
    `SELECT stage, round, miner_id FROM merge_events WHERE run_id = $1 AND miner_id IS NOT NULL AND kind IN ('dispute', 'hash-mismatch', 'missed', 'failed')`,
    [runId],
  );
  if (events.length === 0) return new Map();
  const rounds = await db.query<{ stage: number; epoch: number; started_at: Date; ended_at: Date | null }>(
    'SELECT stage, epoch, started_at, ended_at FROM epochs WHERE run_id = $1',
    [runId],
  );
  const at = new Map(rounds.map((r) => [`${r.stage}:${r.epoch}`, r]));
  const out = new Map<string, Array<[Date, Date]>>();
  for (const e of events) {
    const round = at.get(`${e.stage}:${e.round}`);
    if (!round) continue;
    const before = at.get(`${e.stage}:${e.round - 1}`);
    const window: [Date, Date] = [new Date(before?.ended_at ?? 0), new Date(round.ended_at ?? round.started_at)];
    const key = `${e.stage}:${e.miner_id}`;
    out.set(key, [...(out.get(key) ?? []), window]);
  }
  return out;
}

/**
 * Work a miner's restart leaves unpaid (jobs/audits.ts, recordRestart), as windows keyed like disputedWindows':
 * on the stage it held, its previous process's work in the round in progress then (no record of it is left to audit;
 * the new process's first round is audited from the restart on); and, when it had audits open then (forfeited), all
 * its work before the restart that is not settled yet, on every stage (`*`): a drawn audit dodged by a restart costs
 * the window, as a failed one does. Nothing when the run draws no audits.
 */
async function restartWindows(db: Queryable, runId: number): Promise<Map<string, Array<[Date, Date]>>> {
  const rows = await db.query<{ miner_id: string; stage: number; at: Date; forfeited: number; round_began: Date | null }>(
    `SELECT x.miner_id, x.stage, x.at, x.forfeited,
            (SELECT max(e.ended_at) FROM epochs e WHERE e.run_id = x.run_id AND e.stage = x.stage AND e.ended_at <= x.at) AS round_began
     FROM miner_restarts x WHERE x.run_id = $1 AND EXISTS (SELECT 1 FROM audit_rounds a WHERE a.run_id = x.run_id AND a.rate > 0)`,
    [runId],
  );
  const out = new Map<string, Array<[Date, Date]>>();
  for (const r of rows) {
    const key = r.forfeited > 0 ? `*:${r.miner_id}` : `${r.stage}:${r.miner_id}`;
    const window: [Date, Date] = [new Date(r.forfeited > 0 ? 0 : (r.round_began ?? 0)), new Date(r.at)];
    out.set(key, [...(out.get(key) ?? []), window]);
  }
  return out;
}

/**
 * Who could be drawn for an audit in each stage's rounds. The training of a
 * stage's round r ends with its merge (the `epochs` row of r, closed at
 * `ended_at`); the round of time t is the first whose merge had not ended by
 * t (the round in progress when every merge has). A round without an audit
 * draw (no audits that round, or it began before the coordinator did) pays as
 * before; one drawn at rate > 0 pays only the replicas that could be drawn in
 * it: committed with merge-ready, and merged to the round's agreed weights. A
 * replica whose merge-ready for a round was refused (OUT_OF_PHASE: the round went
 * on without it) is paid for that round's work when its next committed round,
 * whose record starts where the refused one began, is drawable for it.
 */
async function drawableRounds(db: Queryable, runId: number): Promise<{ mayPay: (stage: number, miner: string, at: Date) => boolean }> {
  const ends = await db.query<{ stage: number; round: number; ended_at: Date | null }>('SELECT stage, epoch AS round, ended_at FROM epochs WHERE run_id = $1 ORDER BY stage, epoch', [runId]);
  const draws = await db.query<{ stage: number; round: number; drawable: string[] | string }>(
    `SELECT a.stage, a.round,
            coalesce((SELECT jsonb_agg(c.miner_id) FROM round_commitments c
                      WHERE c.run_id = a.run_id AND c.stage = a.stage AND c.round = a.round
                        AND e.ended_at IS NOT NULL AND e.merged_hash IS NOT NULL AND e.merged_hashes ->> c.miner_id = e.merged_hash), '[]'::jsonb) AS drawable
     FROM audit_rounds a LEFT JOIN epochs e ON e.run_id = a.run_id AND e.stage = a.stage AND e.epoch = a.round
     WHERE a.run_id = $1 AND a.rate > 0`,
    [runId],
  );
  const rounds = new Map<number, Array<{ round: number; endedAt: number }>>();
  for (const r of ends) rounds.set(r.stage, [...(rounds.get(r.stage) ?? []), { round: r.round, endedAt: r.ended_at ? new Date(r.ended_at).getTime() : Infinity }]);
  // Only the latest merge can be under way; an earlier one left open (its coordinator stopped mid-merge) bounds nothing.
  for (const [stage, list] of rounds) rounds.set(stage, list.filter((r, i) => r.endedAt !== Infinity || i === list.length - 1));
  const drawn = new Map(draws.map((d) => [`${d.stage}:${d.round}`, new Set((typeof d.drawable === 'string' ? JSON.parse(d.drawable) : d.drawable) as string[])]));
  // Rounds a replica's later record carries: a merge-ready refused (it came after the round went on without the
  // replica) commits nothing, and the replica's record goes on, so its next commitment starts where the refused round
  // began (start_round below round - 1), and an audit of that later round replays the refused one's work too.
  const carried = await db.query<{ stage: number; round: number; miner_id: string; start_round: number }>(
    'SELECT stage, round, miner_id, start_round FROM round_commitments WHERE run_id = $1 AND start_round IS NOT NULL AND start_round < round - 1',
    [runId],
  );
  const carriedBy = new Map<string, Array<{ from: number; to: number; by: number }>>();
  for (const c of carried) {
    const key = `${c.stage}:${c.miner_id}`;
    carriedBy.set(key, [...(carriedBy.get(key) ?? []), { from: c.start_round + 1, to: c.round - 1, by: c.round }]);
  }
  const roundAt = (stage: number, t: number): number => {
    const list = rounds.get(stage) ?? [];
    // Rounds close in order: the first whose merge had not ended by t (a binary search over their ends).
    let lo = 0;
    let hi = list.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (list[mid]!.endedAt >= t) hi = mid;
      else lo = mid + 1;
    }
    return lo < list.length ? list[lo]!.round : (list.at(-1)?.round ?? 0) + 1;
  };
  return {
    mayPay: (stage, miner, at) => {
      if (drawn.size === 0) return true;
      const round = roundAt(stage, at.getTime());
      const payable = (r: number): boolean => {
        const who = drawn.get(`${stage}:${r}`);
        return !who || who.has(miner);
      };
      // Its own round's commitment, or a later one whose record carries this round (and could be drawn in its stead).
      return payable(round) || (carriedBy.get(`${stage}:${miner}`) ?? []).some((c) => c.from <= round && round <= c.to && payable(c.by));
    },
  };
}
