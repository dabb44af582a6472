import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from './app';
import { testDatabase } from './db/test-database';

const MINER_CLI = fileURLToPath(new URL('../../apps/miner/src/main.ts', import.meta.url));

let app: App;
let miners: ChildProcess | undefined;

beforeAll(async () => {
  app = await buildApp({
    database: await testDatabase(),
    run: { name: 'swarm', preset: 'tiny', stages: 3, bottleneck: 32, training: { batchSize: 16, peakLr: 0.006, warmupSteps: 10, totalSteps: 200 } },
  });
  await app.fastify.listen({ port: 0, host: '127.0.0.1' });
});
afterAll(async () => {
  miners?.kill('SIGTERM');
  await new Promise((r) => (miners && miners.exitCode === null ? miners.once('exit', r) : r(null)));
  await app.close();
});

describe('swarm of Node miner processes', () => {
  it('trains the tiny model over 3 stages in separate processes; the loss falls and no frame passes through the coordinator', async () => {
    const port = (app.fastify.server.address() as { port: number }).port;
    const losses: number[] = [];
    const enough = new Promise<void>((resolve) =>
      app.coordinator.onLoss((loss) => {
        losses.push(loss);
        if (losses.length === 40) resolve();
      }),
    );
    miners = spawn(process.execPath, ['--import', 'tsx', MINER_CLI, '--coordinator', `http://127.0.0.1:${port}`, '--count', '3'], {
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    await enough;
    const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
    const first = mean(losses.slice(0, 10));
    const last = mean(losses.slice(30, 40));
    expect(last).toBeLessThan(first - 0.5);
    const stages = (await app.fastify.inject({ method: 'GET', url: '/api/stages' })).json().stages;
    expect(stages.map((s: { miners: unknown[] }) => s.miners.length)).toEqual([1, 1, 1]);
    const recorded = (await app.fastify.inject({ method: 'GET', url: '/api/metrics' })).json().trainLoss;
    expect(recorded.length).toBeGreaterThanOrEqual(40);
    expect(app.coordinator.relayed.frameBytes).toBe(0);
    // Both ends confirmed each transfer: 40 losses mean at least 40 microbatches × 2 boundaries × 2 directions.
    await expect.poll(async () => (await app.coordinator.receiptSummary()).confirmed, { timeout: 30_000 }).toBeGreaterThanOrEqual(160);
    expect((await app.coordinator.receiptSummary()).disputed).toBe(0);
  });
});
