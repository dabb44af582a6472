import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../../src/db/database';
import { maintain } from '../../src/db/maintenance';

// The embedded database's own maintenance (a PostgreSQL server runs autovacuum instead): PGlite here in every pass.
let db: Database;
let runId: number;
beforeAll(async () => {
  db = await openDatabase({});
  [{ id: runId }] = (await db.query<{ id: number }>(`INSERT INTO runs (name, config) VALUES ('maintenance', '{}') RETURNING id`)) as [{ id: number }];
});
afterAll(() => db?.close());

/** The lookup of a transfer's other end (socket/handlers.ts, receipt): the plan's first node and its index. */
async function otherEndPlan(): Promise<string> {
  const [row] = await db.query<{ 'QUERY PLAN': Array<{ Plan: { 'Node Type': string; 'Index Name'?: string } }> }>(
    `EXPLAIN (FORMAT JSON) SELECT bytes, payload_hash, created_at FROM receipts
     WHERE run_id = $1 AND activation_id = $2 AND direction = 'activation' AND from_miner = $3 AND to_miner = $4 AND reporter = $5`,
    [runId, 'a', 'm1', 'm2', 'm1'],
  );
  const plan = row!['QUERY PLAN'][0]!.Plan;
  return `${plan['Node Type']} ${plan['Index Name'] ?? ''}`.trim();
}

const stats = async (table: string): Promise<{ dead: number; modified: number; analysed: boolean }> => {
  await db.query('SELECT pg_stat_force_next_flush()');
  const [row] = await db.query<{ dead: number; modified: number; analysed: boolean }>(
    `SELECT n_dead_tup::int AS dead, n_mod_since_analyze::int AS modified, last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL AS analysed FROM pg_stat_user_tables WHERE relname = $1`,
    [table],
  );
  return row!;
};

describe("the embedded database's maintenance", () => {
  it("analyses a table once enough of it changed, so a run's growing receipts are looked up by their unique key, not by every receipt of the reporter", async () => {
    // A long run's receipts: few reporters, each with many.
    await db.query(
      `INSERT INTO receipts (run_id, epoch, activation_id, direction, from_miner, to_miner, reporter, bytes, payload_hash)
       SELECT $1, 0, md5(i::text), CASE WHEN i % 2 = 0 THEN 'activation' ELSE 'gradient' END, 'm' || (i % 30), 'n' || (i % 29), 'm' || (i % 30), 40000, md5('p' || i)
       FROM generate_series(1, 60000) i`,
      [runId],
    );
    expect(await stats('receipts')).toMatchObject({ analysed: false, modified: 60_000 });
    const { analyzed } = await maintain(db);
    expect(analyzed).toContain('receipts');
    expect(analyzed).not.toContain('runs'); // one row changed: under autovacuum's threshold of 50
    expect(await stats('receipts')).toMatchObject({ analysed: true, modified: 0 });
    expect(await otherEndPlan()).toBe('Index Scan receipts_run_id_activation_id_direction_from_miner_to_miner_key');
    // Nothing more to do until a tenth of the table changes again.
    expect((await maintain(db)).analyzed).not.toContain('receipts');
  });

  it('vacuums a table whose updates left dead rows (every heartbeat batch rewrites miners)', async () => {
    await db.query(
      `INSERT INTO miners (id, run_id, public_key, address, backend, tokens_per_sec, stage, status)
       SELECT 'm' || i, $1, '0x' || md5(i::text), 'a' || i, 'wasm', 100, i % 3, 'active' FROM generate_series(1, 1000) i`,
      [runId],
    );
    await maintain(db);
    for (let k = 0; k < 3; k++) await db.query(`UPDATE miners SET last_seen_at = now() WHERE run_id = $1`, [runId]);
    // Past autovacuum's threshold, 50 + 20% of the 1,000 live rows (page pruning already reclaimed some of the 3,000).
    expect((await stats('miners')).dead).toBeGreaterThan(250);
    const { vacuumed } = await maintain(db);
    expect(vacuumed).toContain('miners');
    expect((await stats('miners')).dead).toBe(0);
  });
});
