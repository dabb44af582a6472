import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { MinerProcesses, lossReports, mean } from '@train-at-home/testkit/miner-processes';
import { NO_CHECKS } from '@train-at-home/testkit/coordinator';

let app: App;
let port = 0;
const miners = new MinerProcesses(() => app);

beforeAll(async () => {
  app = await buildApp({
    database: await testDatabase(),
    silentMs: 5000,
    run: { name: 'churn', preset: 'tiny', stages: 3, bottleneck: 32, training: { batchSize: 16, peakLr: 0.006, warmupSteps: 10, totalSteps: 300 }, merge: { every: 5 }, incentives: NO_CHECKS },
  });
  await app.fastify.listen({ port: 0, host: '127.0.0.1' });
  port = (app.fastify.server.address() as { port: number }).port;
});
afterAll(async () => {
  miners.killAll();
  await app.close();
});

describe('churn', () => {
  it('survives a miner killed mid-run: a newcomer takes its stage from the latest checkpoint, no microbatch counts twice, loss keeps falling', async () => {
    const timeout = ['--microbatch-timeout', '10000'];
    const started = await miners.startMany(port, 3, timeout);
    // One on each stage (logs number stages from 1 for people); the middle one will go.
    const stageOf = (m: { output: string }): string | undefined => /stage (\d) of 3/.exec(m.output)?.[1];
    await expect.poll(() => started.map(stageOf).sort().join(' '), { timeout: 30_000 }).toBe('1 2 3');
    const middle = started.find((m) => stageOf(m) === '2')!;
    await expect.poll(async () => (await lossReports(app)).reports, { timeout: 120_000, interval: 500 }).toBeGreaterThanOrEqual(20);

    middle.child.kill('SIGKILL'); // no goodbye: the process is gone
    await expect.poll(() => miners.activeMiners(), { timeout: 20_000, interval: 200 }).toBe(2);
    const atChurn = (await lossReports(app)).reports;
    const newcomer = await miners.start(port, timeout);
    await expect.poll(() => newcomer.output, { timeout: 30_000 }).toMatch(/stage 2 of 3/);
    await expect.poll(() => newcomer.output, { timeout: 30_000 }).toMatch(/loaded stage 2's latest checkpoint/);
    // Enough steps after the churn that "still falling" is not a comparison of noise (10-sample means of single microbatches).
    await expect.poll(async () => (await lossReports(app)).reports, { timeout: 180_000, interval: 500 }).toBeGreaterThanOrEqual(atChurn + 40);

    const { values, reports, microbatches } = await lossReports(app);
    expect(reports).toBe(microbatches);
    console.log(`churn: ${reports} losses; before the kill ${mean(values.slice(atChurn - 10, atChurn)).toFixed(3)}, last 10 ${mean(values.slice(-10)).toFixed(3)}`);
    expect(mean(values.slice(-10))).toBeLessThan(mean(values.slice(0, 10)) - 0.5);
    expect(mean(values.slice(-10))).toBeLessThan(mean(values.slice(atChurn - 10, atChurn)));
    expect(app.coordinator.relayed.frameBytes).toBe(0);
  });
});
