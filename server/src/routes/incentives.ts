import { PAYOUT_LEAF_ENCODING } from '@train-at-home/incentives';
import type { FastifyPluginAsync } from 'fastify';
import type { Coordinator } from '../coordinator';
import { epochAt, epochWindow, MAX_EPOCH } from '../ledger/epochs';
import { baseUnits, iso, runStartMs } from '../ledger/queries';
import { ACCOUNT, MINER_ID } from '../ledger/settle';
import { answerBadRequests, integer, limit, matching, optionalMatching, page, type Query } from './query';

export const DEFAULT_PAGE = 50;
export const MAX_PAGE = 500;

/** A page of the incentive lists, unless `limit` says otherwise. */
const pageSize = (q: Query): number => limit(q, DEFAULT_PAGE, MAX_PAGE);

function epochParam(raw: unknown): number {
  return integer({ epoch: raw }, 'epoch', MAX_EPOCH)!;
}

/**
 * Read-only REST over the ledger: settled emission epochs, their payouts with
 * Merkle proofs (anyone can check a payout against the epoch's root), each
 * miner's scores, flags and earnings, and the latest leaderboard. Amounts are
 * decimal strings of base units; every list is paged (`?limit=`, 1…500,
 * default 50) with a cursor the response names (`nextBefore`, …).
 */
export const incentiveRoutes: FastifyPluginAsync<{ coordinator: Coordinator }> = async (app, { coordinator }) => {
  const { db, runId } = coordinator;
  const { epochMs, emissionPerEpoch, windowEpochs, settleAfterMs } = coordinator.run.incentives;
  const holdEpochs = coordinator.run.incentives.holdEpochs ?? 0;
  const startMs = await runStartMs(db, runId);

  answerBadRequests(app);

  type SettlementRow = { epoch: number; starts_at: Date; ends_at: Date; emission: string; allocated: string; merkle_root: string | null; settled_at: Date };
  /** A settlement row as the API shows it. */
  const settlementJson = (row: SettlementRow) => ({
    epoch: Number(row.epoch),
    startsAt: iso(row.starts_at),
    endsAt: iso(row.ends_at),
    emission: baseUnits(row.emission).toString(),
    allocated: baseUnits(row.allocated).toString(),
    merkleRoot: row.merkle_root,
    settledAt: iso(row.settled_at),
  });
  const settlement = async (epoch: number) => {
    const [row] = await db.query<SettlementRow>(
      `SELECT epoch, starts_at, ends_at, emission::text, allocated::text, merkle_root, settled_at FROM settlements WHERE run_id = $1 AND epoch = $2`,
      [runId, epoch],
    );
    return row && settlementJson(row);
  };
  const noSuchEpoch = (epoch: number) => ({ error: 'NO_SUCH_EPOCH', message: `epoch ${epoch} is not settled` });

  app.get<{ Querystring: Query }>('/api/epochs', async (req) => {
    const n = pageSize(req.query);
    const before = integer(req.query, 'before', MAX_EPOCH);
    const rows = await db.query<SettlementRow & { payout_count: number }>(
      `SELECT s.epoch, s.starts_at, s.ends_at, s.emission::text, s.allocated::text, s.merkle_root, s.settled_at,
              (SELECT count(*)::int FROM payouts p WHERE p.run_id = s.run_id AND p.epoch = s.epoch) AS payout_count
       FROM settlements s WHERE s.run_id = $1 AND ($2::int IS NULL OR s.epoch < $2) ORDER BY s.epoch DESC LIMIT $3`,
      [runId, before, n + 1],
    );
    const { rows: epochs, more } = page(rows, n);
    const current = epochWindow(startMs, epochMs, epochAt(startMs, epochMs, Date.now()));
    // Epochs settle in order: the next is the one after the latest settled. It waits for its window (itself and the
    // holdEpochs after it) to end, settleAfterMs more, and the audits of the window's rounds (not before notBefore).
    const [latest] = await db.query<{ epoch: number | null }>('SELECT max(epoch) AS epoch FROM settlements WHERE run_id = $1', [runId]);
    const next = latest?.epoch === null || latest?.epoch === undefined ? 0 : Number(latest.epoch) + 1;
    const notBefore = new Date(epochWindow(startMs, epochMs, Math.min(MAX_EPOCH, next + holdEpochs)).endsAt.getTime() + settleAfterMs);
    return {
      current: { epoch: current.epoch, startsAt: current.startsAt.toISOString(), endsAt: current.endsAt.toISOString() },
      epochMs,
      holdEpochs,
      settleAfterMs,
      nextSettlement: { epoch: next, notBefore: notBefore.toISOString() },
      emissionPerEpoch,
      epochs: epochs.map((r) => ({ ...settlementJson(r), payoutCount: Number(r.payout_count) })),
      nextBefore: more ? Number(epochs[epochs.length - 1]!.epoch) : null,
    };
  });

  app.get<{ Params: { epoch: string }; Querystring: Query }>('/api/epochs/:epoch', async (req, reply) => {
    const epoch = epochParam(req.params.epoch);
    const n = pageSize(req.query);
    const payoutsAfter = optionalMatching(req.query, 'payoutsAfter', ACCOUNT);
    const scoresAfter = optionalMatching(req.query, 'scoresAfter', MINER_ID);
    const s = await settlement(epoch);
    if (!s) return reply.code(404).send(noSuchEpoch(epoch));
    const [counts] = await db.query<{ payouts: number; scores: number }>(
      `SELECT (SELECT count(*)::int FROM payouts WHERE run_id = $1 AND epoch = $2) AS payouts,
              (SELECT count(*)::int FROM scores WHERE run_id = $1 AND epoch = $2) AS scores`,
      [runId, epoch],
    );
    const payouts = page(
      await db.query<{ account: string; amount: string; miners: string[]; proof: string[] }>(
        `SELECT account, amount::text, miners, proof FROM payouts WHERE run_id = $1 AND epoch = $2 AND ($3::text IS NULL OR account > $3) ORDER BY account LIMIT $4`,
        [runId, epoch, payoutsAfter, n + 1],
      ),
      n,
    );
    const scores = page(
      await db.query<{ miner_id: string; stage: number | null; account: string; work: number; quality: number; score: number; flagged: boolean; breakdown: object }>(
        `SELECT miner_id, stage, account, work, quality, score, flagged, breakdown FROM scores
         WHERE run_id = $1 AND epoch = $2 AND ($3::text IS NULL OR miner_id > $3) ORDER BY miner_id LIMIT $4`,
        [runId, epoch, scoresAfter, n + 1],
      ),
      n,
    );
    return {
      ...s,
      leafEncoding: PAYOUT_LEAF_ENCODING,
      payoutCount: Number(counts!.payouts),
      scoreCount: Number(counts!.scores),
      payouts: payouts.rows.map((p) => ({ account: p.account, amount: baseUnits(p.amount).toString(), miners: p.miners, proof: p.proof })),
      nextPayoutsAfter: payouts.more ? payouts.rows[payouts.rows.length - 1]!.account : null,
      scores: scores.rows.map((r) => ({
        miner: r.miner_id,
        stage: r.stage,
        account: r.account,
        work: r.work,
        quality: r.quality,
        score: r.score,
        flagged: r.flagged,
        breakdown: r.breakdown,
      })),
      nextScoresAfter: scores.more ? scores.rows[scores.rows.length - 1]!.miner_id : null,
    };
  });

  app.get<{ Params: { epoch: string; account: string } }>('/api/epochs/:epoch/payouts/:account', async (req, reply) => {
    const epoch = epochParam(req.params.epoch);
    const account = matching(req.params.account, ACCOUNT, 'account');
    const s = await settlement(epoch);
    if (!s) return reply.code(404).send(noSuchEpoch(epoch));
    const [p] = await db.query<{ amount: string; miners: string[]; proof: string[] }>(
      `SELECT amount::text, miners, proof FROM payouts WHERE run_id = $1 AND epoch = $2 AND account = $3`,
      [runId, epoch, account],
    );
    if (!p) return reply.code(404).send({ error: 'NO_SUCH_PAYOUT', message: `no payout to ${account} in epoch ${epoch}` });
    return { epoch, account, amount: baseUnits(p.amount).toString(), miners: p.miners, proof: p.proof, merkleRoot: s.merkleRoot, leafEncoding: PAYOUT_LEAF_ENCODING };
  });

  app.get<{ Params: { id: string }; Querystring: Query }>('/api/miners/:id/score', async (req, reply) => {
    const miner = matching(req.params.id, MINER_ID, 'miner id');
    const n = pageSize(req.query);
    const before = integer(req.query, 'before', MAX_EPOCH);
    const flagsBefore = integer(req.query, 'flagsBefore', 2 ** 31 - 1);
    // What the miner's account was paid in an epoch in which the payout names this miner
    // (an account linked by several miners is paid once for all of them).
    const paidJoin = `LEFT JOIN payouts p ON p.run_id = sc.run_id AND p.epoch = sc.epoch AND p.account = sc.account AND p.miners @> jsonb_build_array(sc.miner_id)`;
    const [totals] = await db.query<{ epochs: number; earned: string; flags: number; known: boolean }>(
      `SELECT count(*)::int AS epochs, coalesce(sum(p.amount), 0)::text AS earned,
              (SELECT count(*)::int FROM flags WHERE run_id = $1 AND miner_id = $2) AS flags,
              EXISTS (SELECT 1 FROM miners WHERE run_id = $1 AND id = $2) AS known
       FROM scores sc ${paidJoin} WHERE sc.run_id = $1 AND sc.miner_id = $2`,
      [runId, miner],
    );
    if (!totals!.known && totals!.epochs === 0 && totals!.flags === 0) return reply.code(404).send({ error: 'NO_SUCH_MINER', message: `no miner ${miner} in this run` });
    const epochs = page(
      await db.query<{ epoch: number; stage: number | null; account: string; work: number; quality: number; score: number; flagged: boolean; breakdown: object; paid: string }>(
        `SELECT sc.epoch, sc.stage, sc.account, sc.work, sc.quality, sc.score, sc.flagged, sc.breakdown, coalesce(p.amount, 0)::text AS paid
         FROM scores sc ${paidJoin} WHERE sc.run_id = $1 AND sc.miner_id = $2 AND ($3::int IS NULL OR sc.epoch < $3) ORDER BY sc.epoch DESC LIMIT $4`,
        [runId, miner, before, n + 1],
      ),
      n,
    );
    const flags = page(
      await db.query<{ id: number; kind: string; reason: string; evidence: object; created_at: Date }>(
        `SELECT id, kind, reason, evidence, created_at FROM flags WHERE run_id = $1 AND miner_id = $2 AND ($3::int IS NULL OR id < $3) ORDER BY id DESC LIMIT $4`,
        [runId, miner, flagsBefore, n + 1],
      ),
      n,
    );
    return {
      miner,
      totals: { earned: baseUnits(totals!.earned).toString(), epochs: Number(totals!.epochs), flags: Number(totals!.flags) },
      epochs: epochs.rows.map((r) => ({
        epoch: Number(r.epoch),
        stage: r.stage,
        account: r.account,
        work: r.work,
        quality: r.quality,
        score: r.score,
        flagged: r.flagged,
        breakdown: r.breakdown,
        paid: baseUnits(r.paid).toString(),
      })),
      nextBefore: epochs.more ? Number(epochs.rows[epochs.rows.length - 1]!.epoch) : null,
      flags: flags.rows.map((f) => ({ id: Number(f.id), kind: f.kind, reason: f.reason, evidence: f.evidence, createdAt: iso(f.created_at) })),
      nextFlagsBefore: flags.more ? Number(flags.rows[flags.rows.length - 1]!.id) : null,
    };
  });

  app.get<{ Querystring: Query }>('/api/leaderboard', async (req, reply) => {
    const n = pageSize(req.query);
    const after = integer(req.query, 'after', 2 ** 31 - 1);
    let epoch = integer(req.query, 'epoch', MAX_EPOCH);
    if (epoch === null) {
      const [latest] = await db.query<{ epoch: number | null }>(`SELECT max(epoch) AS epoch FROM settlements WHERE run_id = $1`, [runId]);
      epoch = latest?.epoch ?? null;
    }
    if (epoch === null) return { epoch: null, emissionPerEpoch, minerCount: 0, rows: [], nextAfter: null };
    const s = await settlement(epoch);
    if (!s) return reply.code(404).send(noSuchEpoch(epoch));
    // Flag kinds of the evidence window behind this epoch's quality, as the validator saw it at settlement.
    const windowStartSecs = ((windowEpochs - 1) * epochMs) / 1000;
    const rows = await db.query<{ rank: number; miner_id: string; stage: number | null; work: number; quality: number; score: number; flagged: boolean; share: number; flag_kinds: string[]; total: number }>(
      `WITH ranked AS (
         SELECT sc.*, row_number() OVER (ORDER BY sc.score DESC, sc.miner_id)::int AS rank,
                count(*) OVER ()::int AS total, sum(sc.score) OVER () AS score_sum
         FROM scores sc WHERE sc.run_id = $1 AND sc.epoch = $2
       )
       SELECT r.rank, r.miner_id, r.stage, r.work, r.quality, r.score, r.flagged, r.total,
              coalesce(r.score / nullif(r.score_sum, 0), 0) AS share,
              array(SELECT DISTINCT f.kind FROM flags f, settlements st
                    WHERE st.run_id = r.run_id AND st.epoch = r.epoch AND f.run_id = r.run_id AND f.miner_id = r.miner_id
                      AND f.created_at >= st.starts_at - make_interval(secs => $5) AND f.created_at <= st.settled_at
                    ORDER BY f.kind) AS flag_kinds
       FROM ranked r WHERE ($3::int IS NULL OR r.rank > $3) ORDER BY r.rank LIMIT $4`,
      [runId, epoch, after, n + 1, windowStartSecs],
    );
    const board = page(rows, n);
    let minerCount = rows[0]?.total;
    if (minerCount === undefined) {
      const [c] = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM scores WHERE run_id = $1 AND epoch = $2`, [runId, epoch]);
      minerCount = c!.n;
    }
    return {
      ...s,
      emissionPerEpoch,
      minerCount: Number(minerCount),
      rows: board.rows.map((r) => ({
        rank: r.rank,
        miner: r.miner_id,
        stage: r.stage,
        work: r.work,
        quality: r.quality,
        score: r.score,
        flagged: r.flagged,
        flagKinds: r.flag_kinds,
        share: Number(r.share),
      })),
      nextAfter: board.more ? board.rows[board.rows.length - 1]!.rank : null,
    };
  });
};
