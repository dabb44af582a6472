import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as tf from '@tensorflow/tfjs';
import { AutoModelForCausalLM, AutoTokenizer, env } from '@huggingface/transformers';
import { InferenceSession, Tensor as OrtTensor } from 'onnxruntime-node';
import { PRESETS, Stage, contentHash, datasetName, exportStageWeightsSync, importStageWeights, stageSpecs } from '@train-at-home/model';
import { DATA_DIR, loadDataset } from '@train-at-home/model/node';
import { generateIdentity, type Identity } from '@train-at-home/protocol';
import type { Miner } from '@train-at-home/swarm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../src/app';
import { listeningCoordinator, localMiner } from '@train-at-home/testkit/miner-processes';
import { NO_CHECKS } from '@train-at-home/testkit/coordinator';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const layout = { stages: 3, bottleneck: 32, int8: true };
let app: App;
let url: string;
const miners: Miner[] = [];

beforeAll(async () => {
  ({ app, url } = await listeningCoordinator({ name: 'ckpt', preset: 'tiny', ...layout, training: { batchSize: 8, warmupSteps: 5 }, merge: { every: 5 }, incentives: NO_CHECKS }));
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

    // Fifteen or more small steps (merged every 5) from random weights: well below the uniform guess ln V, and recorded.
    // The latest agreed checkpoint of each stage, as stored when the validator reads them: the swarm trains on
    // meanwhile, and a stage whose newest round is still being stored is read at its round before (on PostgreSQL
    // once: 5.60 nats, a stage a round behind the others), so the evaluation is taken again until it is (steps, not a bar moved).
    let result: Awaited<ReturnType<typeof app.validator.evaluate>>;
    await expect
      .poll(
        async () => {
          result = await app.validator.evaluate();
          console.log(`checkpoint: held-out ${result?.heldOutLoss.toFixed(3)} at rounds ${JSON.stringify(result?.rounds)}`);
          return result?.heldOutLoss ?? Number.POSITIVE_INFINITY;
        },
        { timeout: 120_000, interval: 2000 },
      )
      .toBeLessThan(Math.log(PRESETS.tiny.vocabSize) - 0.3);
    expect(result).toBeDefined();
    const metrics = (await app.fastify.inject({ method: 'GET', url: '/api/metrics' })).json();
    expect(metrics.latest.heldOutLoss.value).toBeCloseTo(result!.heldOutLoss, 5);
    // …and what every Train page reads of it, from the run's status.
    expect((await app.fastify.inject({ method: 'GET', url: '/api/status' })).json().heldOutLoss).toBe(metrics.latest.heldOutLoss.value);

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

    // Then the swarm stops, so the round exported below is not pruned (KEEP_CHECKPOINTS) while it is read: on
    // PostgreSQL once, three rounds went by between choosing the round and reading its stored weights.
    for (const m of miners) m.stop();
    await expect.poll(async () => (await app.fastify.inject({ method: 'GET', url: '/api/status' })).json().activeMiners).toBe(0);

    // The model out: GET /api/model (the Dashboard's Download; `npm run export` writes it to a folder) assembles
    // every stage's agreed weights of one round. The folder runs in onnxruntime and in transformers.js (remote
    // models off) and gives the logits and greedy continuation of the stage chain from the same checkpoints (fp32
    // between stages: the graph leaves the wire codec out, and says so); its tokenizer.json reads the held-out
    // text to the held-out shard's ids.
    expect((await app.fastify.inject({ method: 'GET', url: '/api/model?round=x' })).json().error).toBe('BAD_REQUEST');
    expect((await app.fastify.inject({ method: 'GET', url: '/api/model?stage=1' })).json().error).toBe('BAD_REQUEST');
    const missing = await app.fastify.inject({ method: 'GET', url: '/api/model?round=99999' });
    expect([missing.statusCode, missing.json().error]).toEqual([404, 'NO_SUCH_ROUND']);
    const [{ round }] = await app.db.query<{ round: number }>(
      `SELECT max(e.epoch)::int AS round FROM (SELECT c.epoch FROM checkpoints c JOIN epochs e ON e.run_id = c.run_id AND e.stage = c.stage AND e.epoch = c.epoch AND e.merged_hash = c.hash
       WHERE c.run_id = $1 GROUP BY c.epoch HAVING count(DISTINCT c.stage) = 3) e`,
      [app.coordinator.runId],
    ) as [{ round: number }];
    expect(round).toBeGreaterThan(0);
    const folder = mkdtempSync(join(tmpdir(), 'tah-model-'));
    // The command runs beside this process, which serves the coordinator it asks.
    const exportTo = (out: string): Promise<{ status: number | null; output: string }> =>
      new Promise((resolve) => {
        const child = spawn('npx', ['tsx', 'scripts/export.ts', '--coordinator', url, '--round', String(round), '--out', out], { cwd: ROOT });
        let output = '';
        child.stdout.on('data', (c) => (output += c));
        child.stderr.on('data', (c) => (output += c));
        child.on('close', (status) => resolve({ status, output }));
      });
    try {
      // A stage's stored weights that do not hash to the round's agreed ones are refused by name, and nothing is written.
      const [kept] = await app.db.query<{ data: Uint8Array }>('SELECT data FROM checkpoints WHERE run_id = $1 AND stage = 1 AND epoch = $2', [app.coordinator.runId, round]);
      await app.db.query('UPDATE checkpoints SET data = $3 WHERE run_id = $1 AND stage = 1 AND epoch = $2', [app.coordinator.runId, round, exportStageWeightsSync(new Stage(stageSpecs(PRESETS.tiny, layout)[1]!, 9))]);
      const refused = await exportTo(join(folder, 'refused'));
      expect(refused.status, refused.output).toBe(1);
      expect(refused.output).toContain('BAD_CHECKPOINT');
      expect(existsSync(join(folder, 'refused'))).toBe(false);
      await app.db.query('UPDATE checkpoints SET data = $3 WHERE run_id = $1 AND stage = 1 AND epoch = $2', [app.coordinator.runId, round, kept!.data]);

      const written = await exportTo(join(folder, 'model'));
      expect(written.status, written.output).toBe(0);
      const root = join(folder, 'model');
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
      const stages = stageSpecs(PRESETS.tiny, layout).map((spec) => new Stage(spec, 1));
      stages.forEach((stage, i) => importStageWeights(stage, new Uint8Array(agreed[i]!.data)));
      const chain = (ids: number[]): Float32Array =>
        tf.tidy(() => {
          let x: tf.Tensor = tf.tensor2d(ids, [1, ids.length], 'int32');
          for (const stage of stages.slice(0, -1)) x = stage.forward({ batch: 1, time: ids.length, x });
          return stages.at(-1)!.logits({ batch: 1, time: ids.length, x }).dataSync() as Float32Array;
        });
      const relative = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
        let diff = 0;
        let scale = 0;
        for (let i = 0; i < b.length; i++) (diff = Math.max(diff, Math.abs(a[i]! - b[i]!))), (scale = Math.max(scale, Math.abs(b[i]!)));
        return diff / scale;
      };
      const V = PRESETS.tiny.vocabSize;
      const dataset = loadDataset(join(DATA_DIR, datasetName(V)));
      const prompt = 'The Congress of the United States';
      const ids = dataset.tokenizer.encode(prompt);

      const session = await InferenceSession.create(join(root, 'onnx', 'model.onnx'));
      const hd = PRESETS.tiny.dModel / PRESETS.tiny.nHead;
      const feeds: Record<string, OrtTensor> = {
        input_ids: new OrtTensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]),
        attention_mask: new OrtTensor('int64', new BigInt64Array(ids.length).fill(1n), [1, ids.length]),
        position_ids: new OrtTensor('int64', BigInt64Array.from(ids.map((_, i) => BigInt(i))), [1, ids.length]),
      };
      for (let l = 0; l < PRESETS.tiny.nLayer; l++) for (const kind of ['key', 'value']) feeds[`past_key_values.${l}.${kind}`] = new OrtTensor('float32', new Float32Array(0), [1, PRESETS.tiny.nHead, 0, hd]);
      const ort = relative((await session.run(feeds)).logits!.data as Float32Array, chain(ids));
      await session.release();
      expect(ort).toBeLessThan(1e-4);

      env.allowRemoteModels = false;
      env.localModelPath = folder;
      const tokenizer = await AutoTokenizer.from_pretrained('model');
      // The held-out split, document by document, read to exactly the shard's ids.
      const held = [...dataset.heldOut];
      for (let at = 0; at < held.length; ) {
        const end = held.indexOf(dataset.tokenizer.eotId, at);
        expect(tokenizer.encode(dataset.tokenizer.decode(held.slice(at, end)), { add_special_tokens: false })).toEqual(held.slice(at, end));
        at = end + 1;
      }
      const model = await AutoModelForCausalLM.from_pretrained('model', { dtype: 'fp32', local_files_only: true });
      const theirs = (await model(tokenizer(prompt))) as { logits: { data: Float32Array } };
      const tjs = relative(theirs.logits.data, chain(ids));
      expect(tjs).toBeLessThan(1e-4);
      const greedy = [...ids];
      for (let n = 0; n < 16; n++) {
        const logits = chain(greedy);
        let best = 0;
        for (let v = 1; v < V; v++) if (logits[(greedy.length - 1) * V + v]! > logits[(greedy.length - 1) * V + best]!) best = v;
        greedy.push(best);
      }
      const generated = (await model.generate({ ...tokenizer(prompt), max_new_tokens: 16, do_sample: false, eos_token_id: -1 })) as unknown as { tolist(): bigint[][] };
      expect(generated.tolist()[0]!.map(Number)).toEqual(greedy);
      await model.dispose();
      stages.forEach((s) => s.dispose());
      console.log(`checkpoint: round ${round} exported; against the stage chain, relative error onnxruntime ${ort.toExponential(2)}, transformers.js ${tjs.toExponential(2)}; greedy: ${JSON.stringify(dataset.tokenizer.decode(greedy.slice(ids.length)))}`);
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }
  });
});
