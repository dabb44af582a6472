import type { Miner } from '@train-at-home/swarm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../src/app';
import { listeningCoordinator, localMiner } from '@train-at-home/testkit/miner-processes';
import { NO_CHECKS } from '@train-at-home/testkit/coordinator';

let app: App;
let url: string;
const miners: Miner[] = [];
const logs: string[][] = [];

beforeAll(async () => {
  ({ app, url } = await listeningCoordinator({ name: 'rebalance', preset: 'tiny', stages: 3, bottleneck: 32, training: { batchSize: 8 }, merge: { every: 5 }, incentives: NO_CHECKS }));
});
afterAll(async () => {
  miners.forEach((m) => m.stop());
  await app.close();
});

function newMiner(tokensPerSec: number): Miner {
  const log: string[] = [];
  logs.push(log);
  const miner = localMiner(url, { tokensPerSec, departureGraceMs: 500, log: (line) => log.push(line) });
  miners.push(miner);
  return miner;
}

describe('rebalancing', () => {
  it('moves a miner into a stage that emptied; it takes that stage from its latest checkpoint and the run goes on', async () => {
    const [first, second, last, spare] = [newMiner(100), newMiner(100), newMiner(100), newMiner(50)];
    for (const m of [first, second, last, spare]) await m.start();
    expect([first, second, last, spare].map((m) => m!.registration!.stage)).toEqual([0, 1, 2, 0]);
    const losses: number[] = [];
    app.coordinator.onLoss((l) => losses.push(l));
    await expect.poll(() => last!.checkpointsUploaded, { timeout: 120_000, interval: 200 }).toBeGreaterThanOrEqual(1);

    last!.stop(); // the only miner of the third stage (index 2; logs say 'stage 3') leaves
    await expect.poll(() => spare!.registration!.stage, { timeout: 20_000, interval: 100 }).toBe(2);
    await expect.poll(() => logs[3]!.join('\n'), { timeout: 20_000 }).toMatch(/loaded stage 3's latest checkpoint/);
    const atMove = losses.length;
    await expect.poll(() => losses.length, { timeout: 120_000, interval: 200 }).toBeGreaterThanOrEqual(atMove + 5);
    expect(spare!.stats!.microbatches).toBeGreaterThanOrEqual(5); // its new worker, on stage 2
    const stages = (await app.fastify.inject({ method: 'GET', url: '/api/stages' })).json().stages;
    expect(stages.map((s: { miners: unknown[] }) => s.miners.length)).toEqual([1, 1, 1]);
  });
});
