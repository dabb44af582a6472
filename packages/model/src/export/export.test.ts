import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { AutoModelForCausalLM, AutoTokenizer, env } from '@huggingface/transformers';
import { InferenceSession, Tensor } from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stageSpecs, type ModelConfig } from '../config';
import { paramSpecs } from '../params';
import { Stage } from '../stage';
import { importStageWeights } from '../stage-weights';
import { Tokenizer } from '../tokenizer/bpe';
import { trainBpe } from '../tokenizer/train';
import { serializeWeights, type NamedTensor } from '../weights';
import { readSotu } from '../node/corpus';
import { ONNX_PATH, modelFolder } from './model-folder';
import { readSafetensors } from './safetensors';

/**
 * The exported folder runs elsewhere: onnxruntime-node and transformers.js, from local files only, give the
 * next-token logits of this project's own stage chain (tfjs, stage by stage, fp32 between stages) and the same
 * greedy continuation; transformers.js's tokenizer reads tokenizer.json to the run's ids. Weights are drawn wide
 * (not the init's 0.02) so that logits spread and a greedy pick is never a near tie.
 */
const texts = readSotu().slice(0, 40).map((d) => d.text);
const json = trainBpe(texts, 300);
const tokenizer = new Tokenizer(json);
const config: ModelConfig = { vocabSize: json.vocabSize, contextLength: 32, nLayer: 3, nHead: 4, dModel: 64 };
const specs = stageSpecs(config, { stages: 3, bottleneck: 16, int8: true });
const dir = mkdtempSync(join(tmpdir(), 'tah-export-'));
const stages: Stage[] = [];
let tensors: NamedTensor[] = [];

function draw(seed: number, n: number, scale: number, offset = 0): Float32Array {
  let s = seed >>> 0 || 1;
  const next = (): number => ((s = (Math.imul(s ^ (s >>> 15), 1 | s) + 0x6d2b79f5) >>> 0) / 2 ** 32);
  return Float32Array.from({ length: n }, () => offset + scale * (next() * 2 - 1));
}

beforeAll(async () => {
  await tf.setBackend('cpu');
  let seed = 1;
  for (const spec of specs) {
    const stageTensors = paramSpecs(spec).map((p) => {
      const n = p.shape.reduce((a, b) => a * b, 1);
      const data = p.init === 'ones' ? draw(seed++, n, 0.2, 1) : p.init === 'zeros' ? draw(seed++, n, 0.1) : draw(seed++, n, p.name === 'head' || p.name === 'wte' ? 0.5 : 0.15);
      return { name: p.name, shape: p.shape, data };
    });
    const stage = new Stage(spec, 1);
    importStageWeights(stage, serializeWeights(stageTensors));
    stages.push(stage);
    tensors = tensors.concat(stageTensors);
  }
  const files = modelFolder(specs, tensors, json, {
    run: 'test',
    round: 7,
    stageHashes: specs.map(() => '0'.repeat(64)),
    data: { dataset: 'test', source: 'State of the Union addresses', licence: 'public domain' },
  });
  for (const f of files) {
    mkdirSync(dirname(join(dir, 'test', f.path)), { recursive: true });
    writeFileSync(join(dir, 'test', f.path), f.bytes);
  }
});
afterAll(() => {
  for (const s of stages) s.dispose();
  rmSync(dir, { recursive: true, force: true });
});

/** Our own chain's logits [T, V] for one sequence: stage by stage, fp32 between stages. */
function ourLogits(ids: number[]): Float32Array {
  return tf.tidy(() => {
    let x: tf.Tensor = tf.tensor2d(ids, [1, ids.length], 'int32');
    for (const stage of stages.slice(0, -1)) x = stage.forward({ batch: 1, time: ids.length, x });
    return stages.at(-1)!.logits({ batch: 1, time: ids.length, x }).dataSync() as Float32Array;
  });
}

function argmax(values: ArrayLike<number>, from = 0, to = values.length): number {
  let best = from;
  for (let i = from; i < to; i++) if (values[i]! > values[best]!) best = i;
  return best - from;
}

/** Largest difference against the largest magnitude: relative agreement of two logit arrays. */
function relativeError(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < b.length; i++) {
    diff = Math.max(diff, Math.abs(a[i]! - b[i]!));
    scale = Math.max(scale, Math.abs(b[i]!));
  }
  return diff / scale;
}

const prompt = 'The people of the United States';

describe('an exported model folder', () => {
  it('holds every stage\'s weights in model.safetensors, under their names and shapes', async () => {
    const read = readSafetensors(new Uint8Array(readFileSync(join(dir, 'test', 'model.safetensors'))));
    expect(read.metadata).toMatchObject({ format: 'pt', run: 'test', round: '7' });
    expect(read.tensors.map((t) => t.name)).toEqual(tensors.map((t) => t.name));
    for (const [i, t] of read.tensors.entries()) {
      expect(t.shape).toEqual(tensors[i]!.shape);
      expect(t.data).toEqual(tensors[i]!.data);
    }
  });

  it('runs in onnxruntime-node: the same logits as the stage chain, and its key/value cache continues a prompt as a whole recompute does', async () => {
    const session = await InferenceSession.create(join(dir, 'test', ONNX_PATH));
    const ids = tokenizer.encode(prompt);
    const H = config.nHead;
    const hd = config.dModel / H;
    const run = async (fresh: number[], past: Record<string, Tensor> | undefined, pastLength: number): Promise<Record<string, Tensor>> => {
      const feeds: Record<string, Tensor> = {
        input_ids: new Tensor('int64', BigInt64Array.from(fresh.map(BigInt)), [1, fresh.length]),
        attention_mask: new Tensor('int64', new BigInt64Array(pastLength + fresh.length).fill(1n), [1, pastLength + fresh.length]),
        position_ids: new Tensor('int64', BigInt64Array.from(fresh.map((_, i) => BigInt(pastLength + i))), [1, fresh.length]),
      };
      for (let l = 0; l < config.nLayer; l++) {
        for (const kind of ['key', 'value']) {
          feeds[`past_key_values.${l}.${kind}`] = past?.[`present.${l}.${kind}`] ?? new Tensor('float32', new Float32Array(0), [1, H, 0, hd]);
        }
      }
      return session.run(feeds);
    };
    const whole = await run(ids, undefined, 0);
    const theirs = whole.logits!.data as Float32Array;
    const ours = ourLogits(ids);
    expect(whole.logits!.dims).toEqual([1, ids.length, config.vocabSize]);
    const error = relativeError(theirs, ours);
    console.log(`export: onnxruntime against the stage chain, ${ids.length} positions: relative error ${error.toExponential(2)}`);
    expect(error).toBeLessThan(1e-4);

    // One more token through the cache: the logits of the whole sequence's last position.
    const next = argmax(ours, (ids.length - 1) * config.vocabSize, ids.length * config.vocabSize);
    const stepped = await run([next], whole, ids.length);
    expect(stepped['present.0.key']!.dims).toEqual([1, H, ids.length + 1, hd]);
    const full = ourLogits([...ids, next]);
    expect(relativeError(stepped.logits!.data as Float32Array, full.subarray(ids.length * config.vocabSize))).toBeLessThan(1e-4);
    await session.release();
  });

  it('loads in transformers.js from local files: its tokenizer gives the run\'s ids, its logits and greedy continuation are the stage chain\'s', async () => {
    env.allowRemoteModels = false;
    env.localModelPath = dir;
    const theirTokenizer = await AutoTokenizer.from_pretrained('test');
    const sample = `${texts[3]!.slice(0, 400)} — ünïcödé, 1,234.5 and\ttabs\n\nend`;
    expect(theirTokenizer.encode(sample, { add_special_tokens: false })).toEqual(tokenizer.encode(sample));
    expect(theirTokenizer.decode(tokenizer.encode(sample))).toBe(tokenizer.decode(tokenizer.encode(sample)));
    expect(theirTokenizer.encode('<|eot|>', { add_special_tokens: false })).toEqual([json.eotId]);

    const model = await AutoModelForCausalLM.from_pretrained('test', { dtype: 'fp32', local_files_only: true });
    const ids = tokenizer.encode(prompt);
    const inputs = theirTokenizer(prompt);
    const out = (await model(inputs)) as { logits: { data: Float32Array } };
    expect(relativeError(out.logits.data, ourLogits(ids))).toBeLessThan(1e-4);

    // Greedy continuation: ours recomputes the whole sequence each token; theirs uses the graph's cache.
    const newTokens = 12;
    const greedy = [...ids];
    for (let n = 0; n < newTokens; n++) {
      const logits = ourLogits(greedy);
      greedy.push(argmax(logits, (greedy.length - 1) * config.vocabSize, greedy.length * config.vocabSize));
    }
    const generated = (await model.generate({ ...inputs, max_new_tokens: newTokens, do_sample: false, eos_token_id: -1 })) as { tolist(): bigint[][] };
    const theirIds = generated.tolist()[0]!.map(Number);
    console.log(`export: greedy continuation of "${prompt}": ${JSON.stringify(tokenizer.decode(greedy.slice(ids.length)))}`);
    expect(theirIds).toEqual(greedy);
    await model.dispose();
  });
});
