import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { simMiner, type SimMiner } from '@train-at-home/testkit/sim-miners';

const STAGES = 3;
const dataDir = mkdtempSync(join(tmpdir(), 'tah-stage-loads-'));
let app: App | undefined;
let url = '';
const miners: SimMiner[] = [];
afterAll(async () => {
  miners.forEach((m) => m.close());
  await app?.close();
  rmSync(dataDir, { recursive: true, force: true });
});

async function start(database: Awaited<ReturnType<typeof testDatabase>>): Promise<void> {
  app = await buildApp({ silentMs: 600_000, run: { name: 'stage-loads', preset: 'tiny', stages: STAGES, bottleneck: 32 }, database });
  url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
}

/** The kept loads and a fresh count from `miners`, read in one statement (one snapshot). */
async function loads(): Promise<{ kept: string; fresh: string }> {
  const [row] = await app!.db.query<{ kept: string | null; fresh: string | null }>(
    `SELECT (SELECT string_agg(stage || ':' || miners || ':' || round(tokens_per_sec::numeric, 6), ' ' ORDER BY stage) FROM stage_loads WHERE run_id = $1 AND miners > 0) AS kept,
            (SELECT string_agg(stage || ':' || n || ':' || round(t::numeric, 6), ' ' ORDER BY stage)
             FROM (SELECT stage, count(*) AS n, sum(tokens_per_sec::float8) AS t FROM miners WHERE run_id = $1 AND status = 'active' GROUP BY stage) f) AS fresh`,
    [app!.coordinator.runId],
  );
  return { kept: row?.kept ?? '', fresh: row?.fresh ?? '' };
}

/** Who holds each stage: as the stage map last told the miners, and fresh from `miners`. */
async function stageMaps(): Promise<{ published: string[][]; fresh: string[][] }> {
  await app!.coordinator.publishStageMap();
  const published = app!.coordinator.stageFeed.view([...Array(STAGES).keys()]).map((v) => [...v.miners]);
  const fresh = (await app!.coordinator.stageMap()).map((s) => s.miners.map((m) => m.id).sort());
  return { published, fresh };
}

/** A fixed sequence of draws (mulberry32): the same joins, leaves and moves on every run. */
function draws(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe('stage loads kept as miners change', () => {
  it('equal a fresh count of the miners table, and the stage map equals a fresh read, after random joins, leaves, drops, moves and a coordinator restart', async () => {
    const database = await testDatabase(`stageloads${Date.now()}`, dataDir);
    await start(database);
    const runId = app!.coordinator.runId;
    const random = draws(41);
    const pick = (): SimMiner | undefined => miners[Math.floor(random() * miners.length)];
    const done: Record<string, number> = {};
    for (let step = 0; step < 60; step++) {
      const r = random();
      let action: string;
      if (step === 35) {
        // The coordinator restarts: its miners' connections close, and it marks every miner it had as gone.
        action = 'restart';
        miners.splice(0).forEach((m) => m.close());
        await app!.close();
        await start(database);
      } else if (r < 0.45 || miners.length < 2) {
        action = 'join';
        miners.push(await simMiner(url));
      } else if (r < 0.7) {
        // A departure: the coordinator marks it gone and refills a stage that emptied (a rebalance's move).
        action = 'leave';
        const m = pick()!;
        miners.splice(miners.indexOf(m), 1);
        const before = (await loads()).fresh;
        m.close();
        await expect.poll(async () => (await loads()).fresh, { timeout: 10_000, interval: 20 }).not.toBe(before);
        await app!.coordinator.rebalanceStages();
      } else if (r < 0.8) {
        // Dropped by a statement of many rows (scale-out's sweep marks a stopped process's miners so).
        action = 'drop';
        const gone = [...new Set([pick()!, pick()!])];
        await app!.db.query(`UPDATE miners SET status = 'dropped' WHERE run_id = $1 AND id = ANY($2::text[]) AND status = 'active'`, [runId, gone.map((m) => m.minerId)]);
        for (const m of gone) {
          miners.splice(miners.indexOf(m), 1);
          m.close(); // its departure then changes nothing: it is no longer active
        }
      } else if (r < 0.9) {
        // Moved to another stage, with a new measured speed.
        action = 'move';
        const m = pick()!;
        await app!.db.query(`UPDATE miners SET stage = $2, tokens_per_sec = $3 WHERE id = $1`, [m.minerId, Math.floor(random() * STAGES), Math.round(random() * 1000) / 10]);
      } else {
        // Every active miner's heartbeat time, as liveness.ts stores them: no load changes.
        action = 'heartbeats';
        await app!.db.query(`UPDATE miners SET last_seen_at = now() WHERE run_id = $1 AND status = 'active'`, [runId]);
      }
      done[action] = (done[action] ?? 0) + 1;
      const { kept, fresh } = await loads();
      expect(kept, `after step ${step} (${action})`).toBe(fresh);
      const maps = await stageMaps();
      expect(maps.published, `stage map after step ${step} (${action})`).toEqual(maps.fresh);
      const status = (await app!.fastify.inject({ method: 'GET', url: '/api/status' })).json();
      expect(status.activeMiners).toBe(maps.fresh.flat().length);
    }
    // Every kind of change happened, more than once (the draws are fixed).
    for (const action of ['join', 'leave', 'drop', 'move', 'heartbeats']) expect(done[action], action).toBeGreaterThan(1);
    expect(done.restart).toBe(1);
    expect((await loads()).kept).not.toBe('');
  });
});
