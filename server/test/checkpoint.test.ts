import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { unzipSync } from 'fflate';
import { InferenceSession, Tensor as OrtTensor } from 'onnxruntime-node';
import { PRESETS, Stage, contentHash, exportStageWeightsSync, importStageWeights, stageSpecs } from '@train-at-home/model';
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
    // The model out: GET /api/model (the Dashboard's Download, `npm run export`) assembles every stage's agreed
    // weights of one round; the folder runs in onnxruntime and gives the logits of the stage chain from the same
    // checkpoints (fp32 between stages: the graph leaves the wire codec out, and says so).
    expect((await app.fastify.inject({ method: 'GET', url: '/api/model?round=x' })).json().error).toBe('BAD_REQUEST');
    expect((await app.fastify.inject({ method: 'GET', url: '/api/model?stage=1' })).json().error).toBe('BAD_REQUEST');
    const missing = await app.fastify.inject({ method: 'GET', url: '/api/model?round=99999' });
    expect([missing.statusCode, missing.json().error]).toEqual([404, 'NO_SUCH_ROUND']);
    const res = await app.fastify.inject({ method: 'GET', url: '/api/model' });
    expect(res.statusCode).toBe(200);
    const round = Number(res.headers['x-round']);
    expect(String(res.headers['content-disposition'])).toContain(`ckpt-round-${round}.zip`);
    const files = unzipSync(new Uint8Array(res.rawPayload));
    const folder = mkdtempSync(join(tmpdir(), 'tah-model-'));
    try {
      for (const [path, data] of Object.entries(files)) {
        mkdirSync(dirname(join(folder, path)), { recursive: true });
        writeFileSync(join(folder, path), data);
      }
      const root = join(folder, `ckpt-round-${round}`);
      const config = JSON.parse(readFileSync(join(root, 'config.json'), 'utf8'));
      expect(config).toMatchObject({ model_type: 'gpt2', n_layer: PRESETS.tiny.nLayer, vocab_size: PRESETS.tiny.vocabSize, train_at_home: { run: 'ckpt', round } });
      const card = readFileSync(join(root, 'README.md'), 'utf8');
      expect(card).toContain(`merge round ${round}`);
      expect(card).toMatch(/tokens trained \| [1-9][0-9,]* \|/);
      // Each stage's weights are its round's agreed ones.
      const agreed = await app.db.query<{ stage: number; merged_hash: string; data: Uint8Array }>(
        'SELECT e.stage, e.merged_hash, c.data FROM epochs e JOIN checkpoints c ON c.run_id = e.run_id AND c.stage = e.stage AND c.epoch = e.epoch WHERE e.run_id = $1 AND e.epoch = $2 ORDER BY e.stage',
        [app.coordinator.runId, round],
      );
      expect(config.train_at_home.stages.map((s: { hash: string }) => s.hash)).toEqual(agreed.map((a) => a.merged_hash));
      const specs = stageSpecs(PRESETS.tiny, layout);
      const stages = specs.map((spec) => new Stage(spec, 1));
      stages.forEach((stage, i) => importStageWeights(stage, new Uint8Array(agreed[i]!.data)));
      const ids = [5, 77, 120, 31, 9, 250, 64, 3];
      const ours = tf.tidy(() => {
        let x: tf.Tensor = tf.tensor2d(ids, [1, ids.length], 'int32');
        for (const stage of stages.slice(0, -1)) x = stage.forward({ batch: 1, time: ids.length, x });
        return stages.at(-1)!.logits({ batch: 1, time: ids.length, x }).dataSync() as Float32Array;
      });
      stages.forEach((s) => s.dispose());
      const session = await InferenceSession.create(join(root, 'onnx', 'model.onnx'));
      const hd = PRESETS.tiny.dModel / PRESETS.tiny.nHead;
      const feeds: Record<string, OrtTensor> = {
        input_ids: new OrtTensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]),
        attention_mask: new OrtTensor('int64', new BigInt64Array(ids.length).fill(1n), [1, ids.length]),
        position_ids: new OrtTensor('int64', BigInt64Array.from(ids.map((_, i) => BigInt(i))), [1, ids.length]),
      };
      for (let l = 0; l < PRESETS.tiny.nLayer; l++) for (const kind of ['key', 'value']) feeds[`past_key_values.${l}.${kind}`] = new OrtTensor('float32', new Float32Array(0), [1, PRESETS.tiny.nHead, 0, hd]);
      const theirs = (await session.run(feeds)).logits!.data as Float32Array;
      await session.release();
      let diff = 0;
      let scale = 0;
      for (let i = 0; i < ours.length; i++) (diff = Math.max(diff, Math.abs(theirs[i]! - ours[i]!))), (scale = Math.max(scale, Math.abs(ours[i]!)));
      console.log(`checkpoint: round ${round} exported (${(res.rawPayload.length / 1e6).toFixed(1)} MB zip); onnxruntime against the stage chain: relative error ${(diff / scale).toExponential(2)}`);
      expect(diff / scale).toBeLessThan(1e-4);
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }

    // Merges go on meanwhile: the joiner takes the latest checkpoint as of its joining.
    const before = await latest();
    const late = newMiner(generateIdentity());
    await late.start();
    expect(late.registration!.stage).toBe(0);
    expect([before, await latest()]).toContain(late.resumedFrom);
  });
});
