import type { Queryable } from './database';

/**
 * The embedded database's autovacuum. PGlite runs PostgreSQL as one backend with no autovacuum launcher, so
 * nothing ever analyses or vacuums its tables. Without statistics the planner judges a table by the shape of its
 * indexes: the lookup of a transfer's other end (socket/handlers.ts, `receipt`) went through receipts_by_reporter,
 * every receipt that reporter ever sent, instead of the unique key, so each receipt cost more the longer the run
 * had gone (bench:load: 2.4 ms each, most of the coordinator's time, after a few minutes of 30 pipelines).
 * Every MAINTAIN_EVERY_MS the coordinator does here what autovacuum does on a server, with its default thresholds.
 */
export const MAINTAIN_EVERY_MS = 30_000;
/** PostgreSQL's autovacuum_analyze_threshold and autovacuum_analyze_scale_factor: rows changed since the last ANALYZE. */
export const ANALYZE_THRESHOLD = 50;
export const ANALYZE_SCALE = 0.1;
/** …and autovacuum_vacuum_threshold and autovacuum_vacuum_scale_factor: dead rows. */
export const VACUUM_THRESHOLD = 50;
export const VACUUM_SCALE = 0.2;

/** Analyses and vacuums the tables that autovacuum would have, now; returns their names. */
export async function maintain(db: Queryable): Promise<{ analyzed: string[]; vacuumed: string[] }> {
  // The statistics of the statements before this one are reported when it ends, so the next read sees them.
  await db.query('SELECT pg_stat_force_next_flush()');
  const tables = await db.query<{ name: string; analyze: boolean; vacuum: boolean }>(
    `SELECT relname AS name,
            n_mod_since_analyze > $1::float8 + $2::float8 * n_live_tup AS analyze,
            n_dead_tup > $3::float8 + $4::float8 * n_live_tup AS vacuum
     FROM pg_stat_user_tables WHERE schemaname = 'public' ORDER BY relname`,
    [ANALYZE_THRESHOLD, ANALYZE_SCALE, VACUUM_THRESHOLD, VACUUM_SCALE],
  );
  const quoted = (name: string): string => `"${name.replaceAll('"', '""')}"`;
  const vacuumed = tables.filter((t) => t.vacuum).map((t) => t.name);
  // VACUUM ANALYZE does both at once where both are due.
  for (const name of vacuumed) await db.query(`VACUUM ${tables.find((t) => t.name === name)!.analyze ? 'ANALYZE ' : ''}${quoted(name)}`);
  const analyzed = tables.filter((t) => t.analyze).map((t) => t.name);
  for (const name of analyzed) if (!vacuumed.includes(name)) await db.query(`ANALYZE ${quoted(name)}`);
  return { analyzed, vacuumed };
}
