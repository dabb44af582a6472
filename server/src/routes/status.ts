import { DASHBOARD_BOUNDS, PROTOCOL_VERSION, sane } from '@train-at-home/protocol';
import type { FastifyPluginAsync } from 'fastify';
import type { Coordinator } from '../coordinator';
import type { LocalMiners } from '../local-miners';
import { bigramLoss } from '../dashboard/snapshot';
import { activeCounts } from '../state/stage-loads';
import { BadRequest, answerBadRequests, integer, limit, matching, optionalMatching, page, type Query } from './query';

/** Metric series the API serves, by the name they are stored under. */
export const SERIES = { train_loss: 'trainLoss', heldout_loss: 'heldOutLoss' } as const;
export type SeriesName = keyof typeof SERIES;
/** Points per page of a series: a chart backfills thousands at a time. */
export const DEFAULT_POINTS = 1000;
export const MAX_POINTS = 5000;
/** Rows per page of the other lists (merge rounds, merge events, checkpoints). */
export const DEFAULT_ROWS = 500;
export const MAX_ROWS = 500;

export interface MetricPoint {
  /** The point's place in its series: the cursor to page after. */
  id: number;
  value: number;
  /** When it was stored (ISO). */
  at: string;
  /** The last stage's merge round (train losses), else null. */
  round: number | null;
}

const BIGINT_MAX = Number.MAX_SAFE_INTEGER;
const INT4_MAX = 2 ** 31 - 1;
/** A keyset cursor over (round, stage): "12:0". */
const ROUND_STAGE = /^(?:0|[1-9][0-9]{0,9}):(?:0|[1-9][0-9]{0,3})$/;
const roundStage = (raw: string | null): [number, number] | [null, null] => {
  if (raw === null) return [null, null];
  const [r, s] = raw.split(':').map(Number) as [number, number];
  return r > INT4_MAX ? [INT4_MAX, s] : [r, s];
};

/**
 * Read-only REST: the run, its stage map, its metrics, merges and
 * checkpoints. Every list is paged: `limit` and a cursor the response names
 * (`nextAfter`, `nextBefore`…); a malformed parameter is a 400 BAD_REQUEST.
 */
export const statusRoutes: FastifyPluginAsync<{ coordinator: Coordinator; localMiners?: LocalMiners }> = async (app, { coordinator, localMiners }) => {
  const { db, runId } = coordinator;
  answerBadRequests(app);

  app.get('/api/status', async () => {
    const { miners: count } = await activeCounts(db, runId); // kept per stage as miners change (state/stage-loads.ts)
    // Whether this coordinator starts miners of its own for stages nobody holds (a tab that waits says so).
    // Stages nobody holds (a waiting tab says how many more participants the run needs), as miners were last told.
    const emptyStages = coordinator.stageFeed.view([...Array(coordinator.run.stages).keys()]).filter((v) => v.miners.length === 0).map((v) => v.stage);
    // The merged model's latest held-out loss, what every Train page shows: one row by index, where the page's poll of
    // /api/metrics counted every point of both series (a scan that grows with the run's age, from every tab every 5 s).
    const [held] = await db.query<{ value: number }>(`SELECT value FROM metrics WHERE run_id = $1 AND name = 'heldout_loss' ORDER BY id DESC LIMIT 1`, [runId]);
    return {
      run: coordinator.run,
      activeMiners: count,
      emptyStages,
      heldOutLoss: held?.value ?? null,
      database: db.kind,
      localMiners: { max: localMiners?.options.max ?? 0, running: localMiners?.running ?? 0 },
      // Scale-out mode: whether this process runs the run's singleton jobs (one process does); null with one process.
      // Several processes: whether this one runs the singleton jobs, and how many miners are connected to it.
      scaleOut: coordinator.scaleOut ? { singletonJobs: coordinator.scaleOut.lease.held, connectedMiners: coordinator.sockets.size } : null,
    };
  });
  app.get('/api/stages', async () => ({ stages: await coordinator.stageMap() }));
  /**
   * Stages as miners were told them (ids and each stage's sequence number): what a miner
   * that missed a delta fetches for the stages it talks to. `stages`: a comma-separated list.
   */
  app.get<{ Querystring: Query }>('/api/stage-map', async (req) => {
    const raw = matching(req.query.stages ?? '', /^(?:0|[1-9][0-9]{0,3})(?:,(?:0|[1-9][0-9]{0,3})){0,15}$/, 'stages');
    const stages = [...new Set(raw.split(',').map(Number))];
    const beyond = stages.find((s) => s >= coordinator.run.stages);
    if (beyond !== undefined) throw new BadRequest(`stages must be in 0…${coordinator.run.stages - 1}; this run has no stage ${beyond}`);
    return { v: PROTOCOL_VERSION, stages: coordinator.stageFeed.view(stages) };
  });

  const point = (r: { id: string | number; value: number; at: Date | string; round: number | null }): MetricPoint => ({
    id: Number(r.id),
    value: r.value,
    at: new Date(r.at).toISOString(),
    round: r.round,
  });
  const POINT_COLUMNS = `id, value, created_at AS at, round`;

  /** How many points each series holds and its latest: what a page that shows the run's progress needs. */
  app.get('/api/metrics', async () => {
    const counts: Record<string, number> = {};
    const latest: Record<string, MetricPoint | null> = {};
    for (const [name, key] of Object.entries(SERIES)) {
      const [c] = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE run_id = $1 AND name = $2`, [runId, name]);
      const [last] = await db.query<{ id: string; value: number; at: Date; round: number | null }>(
        `SELECT ${POINT_COLUMNS} FROM metrics WHERE run_id = $1 AND name = $2 ORDER BY id DESC LIMIT 1`,
        [runId, name],
      );
      counts[key] = c?.n ?? 0;
      latest[key] = last ? point(last) : null;
    }
    return { counts, latest, bigramLoss: (await bigramLoss(coordinator)) ?? null };
  });

  /** One series, oldest first, after a point (`after`, an id): a chart backfills from where it stopped. */
  app.get<{ Params: { series: string }; Querystring: Query }>('/api/metrics/:series', async (req, reply) => {
    const name = req.params.series;
    if (!Object.hasOwn(SERIES, name)) return reply.code(404).send({ error: 'NO_SUCH_SERIES', message: `series are ${Object.keys(SERIES).join(', ')}` });
    const n = limit(req.query, DEFAULT_POINTS, MAX_POINTS);
    const after = integer(req.query, 'after', BIGINT_MAX);
    const rows = await db.query<{ id: string; value: number; at: Date; round: number | null }>(
      `SELECT ${POINT_COLUMNS} FROM metrics WHERE run_id = $1 AND name = $2 AND ($3::bigint IS NULL OR id > $3) ORDER BY id LIMIT $4`,
      [runId, name, after, n + 1],
    );
    const { rows: points, more } = page(rows.map(point), n);
    // A value out of bounds is never shown (the cursor still moves past it).
    return { series: name, points: points.filter((p) => sane(p.value, DASHBOARD_BOUNDS.loss) !== undefined), nextAfter: more ? points[points.length - 1]!.id : null };
  });

  /** Merge rounds, oldest first (`after` a "round:stage" cursor), and merge events (`eventsAfter` an id). */
  app.get<{ Querystring: Query }>('/api/merges', async (req) => {
    const n = limit(req.query, DEFAULT_ROWS, MAX_ROWS);
    const [afterRound, afterStage] = roundStage(optionalMatching(req.query, 'after', ROUND_STAGE));
    const eventsAfter = integer(req.query, 'eventsAfter', INT4_MAX);
    const rounds = page(
      await db.query<{ stage: number; round: number }>(
        `SELECT stage, epoch AS round, phase, mode, participants, merged_hash AS "mergedHash", clipped, started_at AS "startedAt", ended_at AS "endedAt"
         FROM epochs WHERE run_id = $1 AND ($2::int IS NULL OR (epoch, stage) > ($2, $3)) ORDER BY epoch, stage LIMIT $4`,
        [runId, afterRound, afterStage, n + 1],
      ),
      n,
    );
    const events = page(
      await db.query<{ id: number }>(
        `SELECT id, stage, round, kind, miner_id AS "minerId", reporter, detail, created_at AS "createdAt"
         FROM merge_events WHERE run_id = $1 AND ($2::int IS NULL OR id > $2) ORDER BY id LIMIT $3`,
        [runId, eventsAfter, n + 1],
      ),
      n,
    );
    const lastRound = rounds.rows[rounds.rows.length - 1];
    return {
      stages: coordinator.phases.status(),
      rounds: rounds.rows,
      nextAfter: rounds.more && lastRound ? `${lastRound.round}:${lastRound.stage}` : null,
      events: events.rows,
      nextEventsAfter: events.more ? events.rows[events.rows.length - 1]!.id : null,
    };
  });

  app.get('/api/receipts', async () => coordinator.receiptSummary());

  /** Stored checkpoints (a few per stage are kept), newest round first (`before` a "round:stage" cursor). */
  app.get<{ Querystring: Query }>('/api/checkpoints', async (req) => {
    const n = limit(req.query, DEFAULT_ROWS, MAX_ROWS);
    const [beforeRound, beforeStage] = roundStage(optionalMatching(req.query, 'before', ROUND_STAGE));
    const rows = page(
      await db.query<{ stage: number; epoch: number }>(
        `SELECT stage, epoch, hash, bytes, created_at AS "createdAt" FROM checkpoints
         WHERE run_id = $1 AND ($2::int IS NULL OR epoch < $2 OR (epoch = $2 AND stage > $3)) ORDER BY epoch DESC, stage LIMIT $4`,
        [runId, beforeRound, beforeStage, n + 1],
      ),
      n,
    );
    const last = rows.rows[rows.rows.length - 1];
    return { checkpoints: rows.rows, nextBefore: rows.more && last ? `${last.epoch}:${last.stage}` : null };
  });
};
