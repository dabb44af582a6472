import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DASHBOARD_NAMESPACE, DashboardFollower, type DashboardUpdate } from '@train-at-home/protocol';
import { io as connect } from 'socket.io-client';
import { afterAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { MinerProcesses, lossReports, mean } from '@train-at-home/testkit/miner-processes';
import { NO_CHECKS } from '@train-at-home/testkit/coordinator';

let app: App;
const miners = new MinerProcesses(() => app);
const dataDir = mkdtempSync(join(tmpdir(), 'tah-restart-'));

afterAll(async () => {
  miners.killAll();
  await app?.close();
  rmSync(dataDir, { recursive: true, force: true });
});

/** A dashboard viewer in Node: the feed over socket.io-client, REST over fetch, and the page's follower. */
function follow(url: string) {
  const follower = new DashboardFollower(async (path) => (await fetch(`${url}${path}`)).json());
  const socket = connect(`${url}${DASHBOARD_NAMESPACE}`, { transports: ['websocket'], forceNew: true, reconnectionDelay: 200, reconnectionDelayMax: 1000 });
  const viewer = { updates: 0, disconnects: 0, ids: () => follower.series.train_loss.points.map((p) => p.id), gaps: () => follower.gaps, close: () => socket.close() };
  socket.on('update', (u: DashboardUpdate) => {
    viewer.updates++;
    follower.push(u);
  });
  socket.on('disconnect', () => viewer.disconnects++);
  void follower.start();
  return viewer;
}

describe('coordinator restart', () => {
  it('miners reconnect to the restarted coordinator, keep their stages, and the run resumes from what was committed; a dashboard viewer backfills, with no hole', async () => {
    const database = await testDatabase(`restart_swarm_${Date.now()}`, dataDir);
    const options = {
      database,
      run: { name: 'restart', preset: 'tiny' as const, stages: 3, bottleneck: 32, training: { batchSize: 16 }, merge: { every: 5 }, incentives: NO_CHECKS },
    };
    app = await buildApp(options);
    await app.fastify.listen({ port: 0, host: '127.0.0.1' });
    const port = (app.fastify.server.address() as { port: number }).port;
    const runId = app.coordinator.runId;
    const started = await miners.startMany(port, 3);
    // A dashboard viewer follows the run throughout, with the page's own code (DashboardFollower): it
    // reconnects by itself after the restart, and must hold every loss, with no hole.
    const viewer = follow(`http://127.0.0.1:${port}`);
    await expect.poll(() => viewer.updates, { timeout: 30_000 }).toBeGreaterThan(0);
    await expect.poll(async () => (await lossReports(app)).reports, { timeout: 120_000, interval: 500 }).toBeGreaterThanOrEqual(20);
    const stagesBefore = started.map((m) => /stage (\d) of 3/.exec(m.output)![1]);

    await app.close();
    const committed = (await (async () => {
      app = await buildApp(options); // same database, same port
      await app.fastify.listen({ port, host: '127.0.0.1' });
      return lossReports(app);
    })()).reports;
    expect(committed).toBeGreaterThanOrEqual(20); // nothing committed was lost
    expect(app.coordinator.runId).toBe(runId);

    await expect.poll(() => miners.activeMiners(), { timeout: 30_000, interval: 200 }).toBe(3).catch((e: unknown) => {
      started.forEach((m) => console.log(m.output));
      throw e;
    });
    // The coordinator counts a miner before the miner has read its answer and said so: poll.
    for (const [i, m] of started.entries()) {
      await expect.poll(() => m.output, { timeout: 10_000 }).toMatch(new RegExp(`re-registered with the coordinator, stage ${stagesBefore[i]}`));
    }
    // Enough steps after the restart (past the 20-step warm-up) for learning to show.
    await expect.poll(async () => (await lossReports(app)).reports, { timeout: 180_000, interval: 500 }).toBeGreaterThanOrEqual(committed + 30);

    // The viewer saw the feed drop and come back, and its series is the stored one, whole.
    await expect.poll(() => viewer.disconnects, { timeout: 10_000 }).toBeGreaterThan(0);
    const stored = async (): Promise<number[]> => (await app.db.query<{ id: string }>(`SELECT id FROM metrics WHERE name = 'train_loss' ORDER BY id`)).map((r) => Number(r.id));
    await expect.poll(async () => viewer.ids().length >= (await stored()).length, { timeout: 15_000 }).toBe(true);
    const ids = await stored();
    expect(viewer.ids().slice(0, ids.length)).toEqual(ids);
    console.log(`restart: the viewer holds ${viewer.ids().length} losses after ${viewer.updates} updates, ${viewer.disconnects} disconnect(s), ${viewer.gaps()} gap(s) backfilled`);
    viewer.close();

    const { values, reports, microbatches } = await lossReports(app);
    expect(reports).toBe(microbatches);
    console.log(`restart: ${reports} losses, first 10 mean ${mean(values.slice(0, 10)).toFixed(3)}, last 10 mean ${mean(values.slice(-10)).toFixed(3)}`);
    expect(mean(values.slice(-10))).toBeLessThan(mean(values.slice(0, 10)) - 0.5);
  });
});
