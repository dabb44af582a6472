import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from './app';
import { testDatabase } from './db/test-database';
import { MinerProcesses, lossReports, mean } from './test-miners';

let app: App;
const miners = new MinerProcesses(() => app);
const dataDir = mkdtempSync(join(tmpdir(), 'tah-restart-'));

afterAll(async () => {
  miners.killAll();
  await app?.close();
  rmSync(dataDir, { recursive: true, force: true });
});

describe('coordinator restart', () => {
  it('miners reconnect to the restarted coordinator, keep their stages, and the run resumes from what was committed', async () => {
    const database = await testDatabase(`restart_swarm_${Date.now()}`, dataDir);
    const options = {
      database,
      run: { name: 'restart', preset: 'tiny' as const, stages: 3, bottleneck: 32, training: { batchSize: 16 }, merge: { every: 5 } },
    };
    app = await buildApp(options);
    await app.fastify.listen({ port: 0, host: '127.0.0.1' });
    const port = (app.fastify.server.address() as { port: number }).port;
    const runId = app.coordinator.runId;
    const started = [await miners.start(port), await miners.start(port), await miners.start(port)];
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

    const { values, reports, microbatches } = await lossReports(app);
    expect(reports).toBe(microbatches);
    console.log(`restart: ${reports} losses, first 10 mean ${mean(values.slice(0, 10)).toFixed(3)}, last 10 mean ${mean(values.slice(-10)).toFixed(3)}`);
    expect(mean(values.slice(-10))).toBeLessThan(mean(values.slice(0, 10)) - 0.5);
  });
});
