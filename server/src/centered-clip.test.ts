import type { Miner } from '@train-at-home/swarm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { App } from './app';
import { listeningCoordinator, localMiner } from './test-miners';

let app: App;
let url: string;
const miners: Miner[] = [];

beforeAll(async () => {
  // An absolute radius (clipScale 0) far below any real pseudo-gradient’s spread: every contribution gets clipped.
  ({ app, url } = await listeningCoordinator({
    name: 'centered-clip',
    preset: 'tiny',
    stages: 2,
    bottleneck: 32,
    training: { batchSize: 4 },
    merge: { every: 3, precision: 'fp16', reduction: 'centered-clip', clipScale: 0, clipRadius: 1e-6, readyMs: 20_000, senderMs: 8_000, reducerMs: 4_000, roundMs: 30_000 },
  }));
});
afterAll(async () => {
  miners.forEach((m) => m.stop());
  await app.close();
});

describe('CenteredClip as the run’s reduction', () => {
  it('replicas agree on the clipped merge, and the coordinator stores how many contributions each reducer clipped', async () => {
    miners.push(...Array.from({ length: 4 }, () => localMiner(url)));
    for (const m of miners) await m.start();
    expect(miners.map((m) => m.registration!.stage)).toEqual([0, 1, 0, 1]);
    const replicas = [miners[0]!, miners[2]!];
    const both = (): number | undefined => replicas[0]!.merges.find((r) => r.participants === 2 && replicas[1]!.merges.some((o) => o.round === r.round && o.participants === 2))?.round;
    await expect.poll(both, { timeout: 240_000, interval: 500 }).toBeDefined();
    const round = both()!;
    const records = replicas.map((m) => m.merges.find((r) => r.round === round)!);
    expect(records.every((r) => r.ok)).toBe(true);
    expect(new Set(records.map((r) => r.hash)).size).toBe(1);
    // Two contributions per partition, both farther than τ from their centre.
    for (const r of records) expect(r.clipped).toBeGreaterThan(0);

    const expected = Object.fromEntries(replicas.map((m, i) => [m.registration!.minerId, records[i]!.clipped]));
    type Round = { stage: number; round: number; mergedHash: string | null; clipped: Record<string, number> | null };
    const stored = async (): Promise<Round | undefined> =>
      ((await app.fastify.inject({ method: 'GET', url: '/api/merges' })).json().rounds as Round[]).find((r) => r.stage === 0 && r.round === round && r.clipped !== null);
    await expect.poll(stored, { timeout: 30_000, interval: 250 }).toBeDefined();
    const row = (await stored())!;
    expect(row.clipped).toEqual(expected);
    expect(row.mergedHash).toBe(records[0]!.hash);
  });
});
