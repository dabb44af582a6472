import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from './app';
import { testDatabase } from './db/test-database';

const MINER_CLI = fileURLToPath(new URL('../../apps/miner/src/main.ts', import.meta.url));

let app: App;
let port = 0;
const processes: Array<{ child: ChildProcess; output: string }> = [];

async function activeMiners(): Promise<number> {
  return (await app.fastify.inject({ method: 'GET', url: '/api/status' })).json().activeMiners;
}

/** Starts one miner process and waits until the coordinator counts it. */
async function startMiner(): Promise<{ child: ChildProcess; output: string }> {
  const before = await activeMiners();
  const child = spawn(process.execPath, ['--import', 'tsx', MINER_CLI, '--coordinator', `http://127.0.0.1:${port}`, '--microbatch-timeout', '10000'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const proc = { child, output: '' };
  child.stdout!.on('data', (c: Buffer) => (proc.output += c.toString()));
  processes.push(proc);
  await expect.poll(activeMiners, { timeout: 60_000, interval: 200 }).toBe(before + 1);
  return proc;
}

beforeAll(async () => {
  app = await buildApp({
    database: await testDatabase(),
    silentMs: 5000,
    run: { name: 'churn', preset: 'tiny', stages: 3, bottleneck: 32, training: { batchSize: 16, peakLr: 0.006, warmupSteps: 10, totalSteps: 300, checkpointEvery: 5 } },
  });
  port = (app.fastify.server.address() as { port: number } | null)?.port ?? 0;
  await app.fastify.listen({ port: 0, host: '127.0.0.1' });
  port = (app.fastify.server.address() as { port: number }).port;
});
afterAll(async () => {
  for (const p of processes) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  await app.close();
});

describe('churn', () => {
  it('survives a miner killed mid-run: a newcomer takes its stage from the latest checkpoint, no microbatch counts twice, loss keeps falling', async () => {
    const losses: number[] = [];
    app.coordinator.onLoss((l) => losses.push(l));
    const miners = [await startMiner(), await startMiner(), await startMiner()];
    await expect.poll(() => miners[1]!.output).toMatch(/stage 1 of 3/);
    await expect.poll(() => losses.length, { timeout: 120_000, interval: 500 }).toBeGreaterThanOrEqual(20);

    miners[1]!.child.kill('SIGKILL'); // no goodbye: the process is gone
    await expect.poll(activeMiners, { timeout: 20_000, interval: 200 }).toBe(2);
    const atChurn = losses.length;
    const newcomer = await startMiner();
    await expect.poll(() => newcomer.output, { timeout: 30_000 }).toMatch(/stage 1 of 3/);
    await expect.poll(() => newcomer.output, { timeout: 30_000 }).toMatch(/loaded stage 1's latest checkpoint/);
    await expect.poll(() => losses.length, { timeout: 180_000, interval: 500 }).toBeGreaterThanOrEqual(atChurn + 20);

    const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
    expect(mean(losses.slice(-10))).toBeLessThan(mean(losses.slice(0, 10)) - 0.5);
    expect(mean(losses.slice(-10))).toBeLessThan(mean(losses.slice(atChurn - 10, atChurn)));
    const [counts] = await app.db.query<{ reports: number; microbatches: number }>(
      `SELECT count(*)::int AS reports, count(DISTINCT activation_id)::int AS microbatches FROM metrics WHERE run_id = $1 AND name = 'train_loss'`,
      [app.coordinator.runId],
    );
    expect(counts!.reports).toBe(counts!.microbatches);
    expect(counts!.reports).toBeGreaterThanOrEqual(atChurn + 20);
    expect(app.coordinator.relayed.frameBytes).toBe(0);
  });
});
