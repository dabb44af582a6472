import type { Miner } from '@train-at-home/swarm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../src/app';
import { listeningCoordinator, localMiner } from '@train-at-home/testkit/miner-processes';

let app: App;
let url: string;
const miners: Miner[] = [];

beforeAll(async () => {
  // An absolute radius (clipScale 0) far below any real pseudo-gradient’s spread: every contribution gets clipped.
  // Contributions as top-32 of each 256 values (codec.ts): owners reduce compressed slices, each checked against the
  // commitment sent with merge-ready, and the forced audits check the compressed slices the owners received. (The
  // default fp16 merge with CenteredClip runs in the adversarial, liar and replicas tests.)
  ({ app, url } = await listeningCoordinator({
    name: 'centered-clip',
    preset: 'tiny',
    stages: 2,
    bottleneck: 32,
    training: { batchSize: 4 },
    merge: { every: 3, precision: 'topk32', reduction: 'centered-clip', clipScale: 0, clipRadius: 1e-6, readyMs: 20_000, senderMs: 8_000, reducerMs: 4_000, roundMs: 30_000 },
  }));
});
afterAll(async () => {
  miners.forEach((m) => m.stop());
  await app.close();
});

describe('CenteredClip as the run’s reduction', () => {
  it('replicas agree on the clipped merge; the coordinator stores how many contributions each reducer clipped, and whose, and audits a replica both owners of every partition clipped', async () => {
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

    // Whose: with two replicas both own every partition, and each names both contributions it clipped.
    const ids = replicas.map((m) => m.registration!.minerId).sort();
    const events = await app.db.query<{ miner_id: string; reporter: string; partition: number }>(
      `SELECT miner_id, reporter, (detail ->> 'partition')::int AS partition FROM merge_events WHERE run_id = $1 AND stage = 0 AND round = $2 AND kind = 'clipped' ORDER BY partition, miner_id, reporter`,
      [app.coordinator.runId, round],
    );
    expect(events.length).toBe(records[0]!.clipped + records[1]!.clipped);
    for (const e of events) expect(ids).toContain(e.miner_id);
    const byPair = new Map<string, Set<string>>();
    for (const e of events) byPair.set(`${e.partition}:${e.miner_id}`, (byPair.get(`${e.partition}:${e.miner_id}`) ?? new Set()).add(e.reporter));
    expect([...byPair.values()].every((reporters) => [...reporters].sort().join() === ids.join())).toBe(true);
    // Clipped by both owners of every partition: each replica's round is audited whatever the draw (the run's rate is 0.2), and passes.
    type Audit = { miner_id: string; status: string; reason: string | null };
    const audits = async (): Promise<Audit[]> =>
      app.db.query<Audit>('SELECT miner_id, status, reason FROM audits WHERE run_id = $1 AND stage = 0 AND round = $2 ORDER BY miner_id', [app.coordinator.runId, round]);
    await expect.poll(async () => (await audits()).filter((a) => a.status !== 'open' && a.status !== 'replaying').length, { timeout: 120_000, interval: 500 }).toBe(2).catch(async (e: unknown) => {
      console.log(`centered-clip: round ${round}: audits ${JSON.stringify(await app.db.query('SELECT round, miner_id, status, reason FROM audits WHERE run_id = $1 ORDER BY round', [app.coordinator.runId]))}, draws ${JSON.stringify(await app.db.query('SELECT stage, round, rate, revealed_at FROM audit_rounds WHERE run_id = $1 ORDER BY stage, round', [app.coordinator.runId]))}`);
      throw e;
    });
    const done = await audits();
    expect(done.map((a) => a.miner_id)).toEqual(ids);
    expect(done.map((a) => [a.status, a.reason]), JSON.stringify(done)).toEqual([
      ['passed', null],
      ['passed', null],
    ]);
  });
});
