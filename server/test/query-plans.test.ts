import { PROTOCOL_VERSION } from '@train-at-home/protocol';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import type { Queryable } from '../src/db/database';
import { maintain } from '../src/db/maintenance';
import { simHarness } from '@train-at-home/testkit/sim-harness';
import { simMiners, type SimMiner } from '@train-at-home/testkit/sim-miners';

const h = simHarness();
afterEach(() => h.close());

/** Rows a run has after hours of a few hundred miners: what the hot queries must not read one by one. */
const PAST_MINERS = 10_000;
const PAST_RECEIPTS = 200_000;
const PAST_LOSSES = 50_000;
/** Tables this large are read through an index by every query the coordinator makes while miners work. */
const LARGE = ['miners', 'receipts', 'metrics'];

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  Alias?: string;
  'Index Name'?: string;
  Plans?: PlanNode[];
}
/** A plan in one line: each node, with its table and index. */
const shape = (node: PlanNode): string =>
  `${node['Node Type']}${node['Relation Name'] ? ` on ${node['Relation Name']} ${node.Alias ?? ''}`.trimEnd() : ''}${node['Index Name'] ? ` using ${node['Index Name']}` : ''}` +
  (node.Plans?.length ? ` (${node.Plans.map(shape).join('; ')})` : '');
const seqScans = (node: PlanNode): string[] => [
  ...(node['Node Type'] === 'Seq Scan' && node['Relation Name'] ? [node['Relation Name']] : []),
  ...(node.Plans ?? []).flatMap(seqScans),
];

/** Records every statement run through a query function (the coordinator's, and its transactions'), with its parameters. */
function record(seen: Map<string, unknown[] | undefined>, q: Queryable): Queryable['query'] {
  const query = q.query.bind(q);
  return ((sql: string, params?: unknown[]) => {
    const key = sql.replace(/\s+/g, ' ').trim();
    if (!seen.has(key)) seen.set(key, params);
    return query(sql, params);
  }) as Queryable['query'];
}

describe('query plans', () => {
  it('every query the coordinator runs while miners register, heartbeat, report and are watched reads the large tables through an index (plans checked against a run with hours of rows)', async () => {
    // Every microbatch spot-checked: the validator's reads are among the planned ones on every run.
    const url = await h.start('query-plans', 3, { run: { merge: { every: 4, maxTrainingMs: 3_600_000 }, incentives: { spotCheckRate: 1 } } });
    const app = h.app!;
    const runId = app.coordinator.runId;

    // Hours of history: miners that came and went, their receipts and losses, as the statistics see them.
    await app.db.query(
      `INSERT INTO miners (id, run_id, public_key, address, backend, tokens_per_sec, stage, status, registered_at, last_seen_at)
       SELECT md5('m' || i) || md5('n' || i), $1, '0x' || md5('m' || i) || md5('n' || i), 'past' || i, 'wasm', 100, i % 3, CASE WHEN i % 50 = 0 THEN 'dropped' ELSE 'left' END,
              now() - interval '3 hours', now() - interval '2 hours'
       FROM generate_series(1, $2::int) i`,
      [runId, PAST_MINERS],
    );
    await app.db.query(
      `INSERT INTO receipts (run_id, epoch, activation_id, direction, from_miner, to_miner, reporter, bytes, payload_hash, created_at)
       SELECT $1, (i / 20000)::int, md5('a' || (i / 2)), CASE WHEN i % 4 < 2 THEN 'activation' ELSE 'gradient' END,
              md5('m' || (i % 997)) || md5('n' || (i % 997)), md5('m' || (i % 991)) || md5('n' || (i % 991)),
              CASE WHEN i % 2 = 0 THEN md5('m' || (i % 997)) || md5('n' || (i % 997)) ELSE md5('m' || (i % 991)) || md5('n' || (i % 991)) END,
              40000, md5('p' || (i / 2)), now() - interval '3 hours' + (i || ' milliseconds')::interval * 50
       FROM generate_series(1, $2::int) i`,
      [runId, PAST_RECEIPTS],
    );
    await app.db.query(
      `INSERT INTO metrics (run_id, epoch, name, value, activation_id, created_at)
       SELECT $1, (i / 5000)::int, 'train_loss', 4.0, md5('a' || i), now() - interval '3 hours' + (i || ' milliseconds')::interval * 200
       FROM generate_series(1, $2::int) i`,
      [runId, PAST_LOSSES],
    );
    if (app.db.kind === 'pglite') {
      // The embedded database has no autovacuum: the statistics are what the coordinator's own maintenance gathers.
      const { analyzed } = await maintain(app.db);
      expect(analyzed).toEqual(expect.arrayContaining(LARGE));
    } else {
      await app.db.query('ANALYZE'); // a server's autovacuum would, in its own time
    }

    // From here on, every statement the coordinator runs is recorded.
    const seen = new Map<string, unknown[] | undefined>();
    const db = app.db;
    const own = db.query.bind(db); // the test's own reads, not recorded
    db.query = record(seen, db);
    const transaction = db.transaction.bind(db);
    db.transaction = ((fn: (tx: Queryable) => Promise<unknown>) => transaction((tx) => fn({ query: record(seen, tx) }))) as typeof db.transaction;

    // Miners at work: they register, heartbeat, send both ends' receipts of pipelines' microbatches and the losses, leave.
    h.miners.push(...(await simMiners(url, 9, 3)));
    const at = (s: number): SimMiner[] => h.miners.filter((m) => m.stage === s);
    const emit = (by: SimMiner, event: string, msg: object): Promise<{ ok: boolean; error?: { code: string } }> =>
      new Promise((resolve) => by.socket.emit(event, { v: PROTOCOL_VERSION, ...msg }, resolve));
    for (let i = 0; i < 12; i++) {
      const lane = [0, 1, 2].map((s) => at(s)[i % at(s).length]!);
      const activationId = randomBytes(16).toString('hex');
      for (const [direction, from, to] of [['activation', lane[0], lane[1]], ['activation', lane[1], lane[2]], ['gradient', lane[2], lane[1]], ['gradient', lane[1], lane[0]]] as const) {
        const payloadHash = randomBytes(32).toString('hex');
        for (const by of [from!, to!]) expect((await emit(by, 'receipt', { epoch: 0, activationId, direction, from: from!.minerId, to: to!.minerId, bytes: 40_000, payloadHash })).ok).toBe(true);
      }
      expect((await emit(lane[2]!, 'loss', { epoch: 0, activationId, pathway: lane.map((m) => m.minerId), loss: 4 })).ok).toBe(true);
    }
    await Promise.all(h.miners.map((m) => m.heartbeat()));
    await app.coordinator.liveness.flush();
    // What operators, dashboards and miners' pages read.
    for (const path of ['/api/status', '/api/stage-map?stages=0,1,2', '/api/epochs', '/api/dashboard', `/api/miners/${h.miners[0]!.minerId}/score`]) {
      expect((await app.fastify.inject({ method: 'GET', url: path })).statusCode, path).toBeLessThan(500);
    }
    // The phase machine's and the sweep's ticks (every second), and the validator's spot checks of the losses (they
    // are sampled SAMPLE_DELAY_MS after they arrive); then two miners leave.
    const spot = app.validator.spotChecks.stats;
    await expect.poll(() => spot.sampled + spot.skipped, { timeout: 30_000 }).toBeGreaterThan(0);
    h.miners.splice(0, 2).forEach((m) => m.close());
    await expect.poll(async () => (await own<{ n: number }>(`SELECT count(*)::int AS n FROM miners WHERE run_id = $1 AND status = 'left' AND registered_at > now() - interval '1 hour'`, [runId]))[0]!.n).toBe(2);
    await new Promise((r) => setTimeout(r, 1000));

    // Every statement that reads rows, planned with the parameters it ran with.
    const planned = [...seen].filter(([sql]) => /^(SELECT|WITH|UPDATE|DELETE)\b/i.test(sql) && !/pg_advisory/i.test(sql));
    expect(planned.length).toBeGreaterThan(15);
    const scans: string[] = [];
    for (const [sql, params] of planned) {
      const [row] = await transaction((tx) => tx.query<{ 'QUERY PLAN': unknown }>(`EXPLAIN (FORMAT JSON) ${sql}`, params));
      const plan = (typeof row!['QUERY PLAN'] === 'string' ? JSON.parse(row!['QUERY PLAN']) : row!['QUERY PLAN']) as Array<{ Plan: PlanNode }>;
      const large = seqScans(plan[0]!.Plan).filter((t) => LARGE.includes(t));
      if (large.length > 0) scans.push(`${large.join(', ')}: ${sql.slice(0, 200)}\n  plan: ${shape(plan[0]!.Plan)}`);
    }
    console.log(`query-plans: ${planned.length} statements planned on ${app.db.kind}:\n${planned.map(([sql]) => sql.slice(0, 140)).join('\n')}`);
    expect(scans, `statements that read a large table row by row:\n${scans.join('\n')}`).toEqual([]);
  }, 300_000);
});
