import { PRESETS, Stage, contentHash, exportStageWeightsSync, stageSpecs } from '@train-at-home/model';
import { generateIdentity, type Identity } from '@train-at-home/protocol';
import type { Miner } from '@train-at-home/swarm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../src/app';
import { listeningCoordinator, localMiner } from '@train-at-home/testkit/miner-processes';

const layout = { stages: 3, bottleneck: 32, int8: true };
let app: App;
let url: string;
const miners: Miner[] = [];

beforeAll(async () => {
  ({ app, url } = await listeningCoordinator({ name: 'ckpt', preset: 'tiny', ...layout, training: { batchSize: 8, warmupSteps: 5 }, merge: { every: 5 } }));
});
afterAll(async () => {
  miners.forEach((m) => m.stop());
  await app.close();
});

function newMiner(identity: Identity, maxMicrobatches?: number): Miner {
  const miner = localMiner(url, { identity, maxMicrobatches, dataSeed: 3 });
  miners.push(miner);
  return miner;
}

async function put(stage: number, body: Uint8Array, headers: Record<string, string>): Promise<{ status: number; error?: string }> {
  const res = await app.fastify.inject({ method: 'PUT', url: `/api/checkpoints/${stage}`, headers: { 'content-type': 'application/octet-stream', ...headers }, payload: Buffer.from(body) });
  return { status: res.statusCode, error: res.json().error };
}

describe('checkpoints, late joiners and the held-out validator', () => {
  it('refuses uploads that are unsigned, for another stage, or not this stage\'s weights, and stores nothing', async () => {
    const identity = generateIdentity();
    const miner = newMiner(identity);
    await miner.start();
    const { minerId, stage, runId } = miner.registration!;
    expect(stage).toBe(0);
    const mine = exportStageWeightsSync(new Stage(stageSpecs(PRESETS.tiny, layout)[0]!, 1));
    const theirs = exportStageWeightsSync(new Stage(stageSpecs(PRESETS.tiny, layout)[1]!, 1));
    const sign = (s: number, bytes: Uint8Array, step = 1) => ({
      'x-miner-id': minerId,
      'x-step': String(step),
      'x-signature': identity.sign('checkpoint', { runId, stage: s, step, hash: contentHash(bytes) }),
    });
    expect(await put(0, mine, { ...sign(0, mine), 'x-signature': generateIdentity().sign('checkpoint', {}) })).toEqual({ status: 401, error: 'BAD_SIGNATURE' });
    expect(await put(0, mine, { ...sign(0, theirs) })).toEqual({ status: 401, error: 'BAD_SIGNATURE' }); // signed other bytes
    expect(await put(1, theirs, sign(1, theirs))).toEqual({ status: 403, error: 'NOT_YOUR_STAGE' });
    expect(await put(0, theirs, sign(0, theirs))).toEqual({ status: 400, error: 'BAD_WEIGHTS' });
    const garbage = new Uint8Array(1000).fill(7);
    expect(await put(0, garbage, sign(0, garbage))).toEqual({ status: 400, error: 'BAD_WEIGHTS' });
    expect(await put(9, mine, sign(9, mine))).toEqual({ status: 404, error: 'NO_SUCH_STAGE' });
    expect(await put(0, mine, { 'x-step': '1' })).toEqual({ status: 400, error: 'SCHEMA' });
    expect((await app.fastify.inject({ method: 'GET', url: '/api/checkpoints/0/latest' })).statusCode).toBe(404);
    expect(await app.db.query('SELECT * FROM checkpoints')).toEqual([]);
    expect(await app.validator.evaluate()).toBeUndefined();
    miner.stop();
    await expect.poll(async () => (await app.fastify.inject({ method: 'GET', url: '/api/status' })).json().activeMiners).toBe(0);
  });

  it('stores the swarm\'s checkpoints; the validator evaluates them; a late joiner starts from them', async () => {
    const first = generateIdentity();
    const swarm = [newMiner(first, 60), newMiner(generateIdentity()), newMiner(generateIdentity())];
    for (const m of swarm) await m.start();
    expect(swarm.map((m) => m.registration!.stage)).toEqual([0, 1, 2]);
    await expect.poll(() => swarm.every((m) => m.checkpointsUploaded >= 3), { timeout: 180_000, interval: 500 }).toBe(true);

    // A round's checkpoint is the weights its replicas agreed on: other weights for a round that ended are refused, and change nothing.
    const [ended] = await app.db.query<{ epoch: number; merged_hash: string }>(
      `SELECT epoch, merged_hash FROM epochs WHERE run_id = $1 AND stage = 0 AND phase = 'training' AND merged_hash IS NOT NULL ORDER BY epoch DESC LIMIT 1`,
      [app.coordinator.runId],
    );
    const other = exportStageWeightsSync(new Stage(stageSpecs(PRESETS.tiny, layout)[0]!, 2));
    const { minerId, runId } = swarm[0]!.registration!;
    const signed = { 'x-miner-id': minerId, 'x-step': String(ended!.epoch), 'x-signature': first.sign('checkpoint', { runId, stage: 0, step: ended!.epoch, hash: contentHash(other) }) };
    expect(await put(0, other, signed)).toEqual({ status: 409, error: 'CHECKPOINT_MISMATCH' });
    const [kept] = await app.db.query<{ hash: string }>('SELECT hash FROM checkpoints WHERE run_id = $1 AND stage = 0 AND epoch = $2', [app.coordinator.runId, ended!.epoch]);
    expect(kept?.hash ?? ended!.merged_hash).toBe(ended!.merged_hash);

    const result = await app.validator.evaluate();
    expect(result).toBeDefined();
    // Fifteen or more small steps (merged every 5) from random weights: well below the uniform guess ln V, and recorded.
    expect(result!.heldOutLoss).toBeLessThan(Math.log(PRESETS.tiny.vocabSize) - 0.3);
    const metrics = (await app.fastify.inject({ method: 'GET', url: '/api/metrics' })).json();
    expect(metrics.latest.heldOutLoss.value).toBeCloseTo(result!.heldOutLoss, 5);

    const latest = async (): Promise<string> => {
      const res = await app.fastify.inject({ method: 'GET', url: '/api/checkpoints/0/latest' });
      expect(res.statusCode).toBe(200);
      return String(res.headers['x-content-hash']);
    };
    // Merges go on meanwhile: the joiner takes the latest checkpoint as of its joining.
    const before = await latest();
    const late = newMiner(generateIdentity());
    await late.start();
    expect(late.registration!.stage).toBe(0);
    expect([before, await latest()]).toContain(late.resumedFrom);
  });
});
