import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { initNodeBackend } from './node/backend';
import { PRESETS, stageSpecs, type RunLayout } from './config';
import { decodeBoundary, encodeBoundary } from './codec';
import { Stage, StageError, type StageInput } from './stage';
import { mulberry32 } from './rng';
import { deserializeWeights, serializeWeights, WeightsError } from './weights';
import { exportStageWeights, importStageWeights, stageWeightsHash } from './stage-weights';

const config = PRESETS.tiny;
const B = 4;
const T = 32;

function randomIds(seed: number): Int32Array {
  const random = mulberry32(seed);
  return Int32Array.from({ length: B * T }, () => Math.floor(random() * config.vocabSize));
}

function relativeError(a: Float32Array, b: Float32Array): number {
  let diff = 0;
  let norm = 0;
  for (let i = 0; i < a.length; i++) {
    diff += (a[i]! - b[i]!) ** 2;
    norm += b[i]! ** 2;
  }
  return Math.sqrt(diff) / Math.max(Math.sqrt(norm), 1e-30);
}

/** Runs the pipeline forward and backward through the codec; returns every parameter's gradient by name. */
function pipelineGradients(layout: RunLayout, ids: Int32Array, targets: Int32Array): { grads: Map<string, Float32Array>; loss: number } {
  const stages = stageSpecs(config, layout).map((s) => new Stage(s, 42));
  const precision = layout.int8 ? 'int8' : 'fp32';
  const inputs: StageInput[] = [{ batch: B, time: T, x: tf.tensor2d(ids, [B, T], 'int32') }];
  for (const stage of stages.slice(0, -1)) {
    const out = stage.forward(inputs[inputs.length - 1]!);
    const [rows, cols] = out.shape as [number, number];
    const frame = decodeBoundary(encodeBoundary({ rows, cols, data: out.dataSync() as Float32Array }, precision), { rows, cols });
    inputs.push({ batch: B, time: T, x: tf.tensor2d(frame.data, [rows, cols]) });
  }
  inputs[inputs.length - 1]!.targets = tf.tensor2d(targets, [B, T], 'int32');
  const grads = new Map<string, Float32Array>();
  let loss = NaN;
  let outputGrad: tf.Tensor | undefined;
  for (let s = stages.length - 1; s >= 0; s--) {
    const r = stages[s]!.backward(inputs[s]!, outputGrad);
    if (r.loss !== undefined) loss = r.loss;
    for (const [name, g] of Object.entries(r.grads)) grads.set(name, g.dataSync() as Float32Array);
    if (r.inputGrad) {
      const [rows, cols] = r.inputGrad.shape;
      const frame = decodeBoundary(encodeBoundary({ rows, cols, data: r.inputGrad.dataSync() as Float32Array }, precision));
      outputGrad = tf.tensor2d(frame.data, [rows, cols]);
    }
  }
  stages.forEach((s) => s.dispose());
  return { grads, loss };
}

beforeAll(async () => {
  expect(await initNodeBackend()).toBe('wasm');
});

describe('stage split', () => {
  it('gives the same weight gradients as the unsplit model (3 stages, no bottleneck, fp32), within 1e-4 relative', () => {
    const ids = randomIds(1);
    const targets = randomIds(2);
    const whole = pipelineGradients({ stages: 1, bottleneck: config.dModel, int8: false }, ids, targets);
    const split = pipelineGradients({ stages: 3, bottleneck: config.dModel, int8: false }, ids, targets);
    expect(split.loss).toBeCloseTo(whole.loss, 5);
    expect([...split.grads.keys()].sort()).toEqual([...whole.grads.keys()].sort());
    for (const [name, g] of whole.grads) {
      const norm = Math.sqrt(g.reduce((n, v) => n + v * v, 0));
      expect(norm, `${name} has a gradient`).toBeGreaterThan(0);
      expect(relativeError(split.grads.get(name)!, g), name).toBeLessThan(1e-4);
    }
  });

  it('computes the embedding gradient without UnsortedSegmentSum (absent on WASM)', () => {
    expect(tf.getKernel('UnsortedSegmentSum', 'wasm')).toBeUndefined();
    const { grads } = pipelineGradients({ stages: 2, bottleneck: config.dModel, int8: false }, randomIds(3), randomIds(4));
    const wte = grads.get('wte')!;
    // Only rows of tokens that occurred get a gradient.
    const seen = new Set(randomIds(3));
    for (let v = 0; v < config.vocabSize; v++) {
      const row = wte.subarray(v * config.dModel, (v + 1) * config.dModel);
      const nonzero = row.some((x) => x !== 0);
      expect(nonzero, `row ${v}`).toBe(seen.has(v));
    }
  });

  it('with a bottleneck and int8, sends b-wide tensors and still produces finite gradients everywhere', () => {
    const layout = { stages: 2, bottleneck: 8, int8: true };
    const [first] = stageSpecs(config, layout);
    expect(first!.outputWidth).toBe(8);
    const { grads, loss } = pipelineGradients(layout, randomIds(5), randomIds(6));
    expect(Number.isFinite(loss)).toBe(true);
    expect(grads.has('bneck.0.down')).toBe(true);
    expect(grads.has('bneck.0.up')).toBe(true);
    for (const [name, g] of grads) expect(g.every(Number.isFinite), name).toBe(true);
  });

  it('rejects inputs of the wrong shape with a StageError', () => {
    const [, second] = stageSpecs(config, { stages: 2, bottleneck: 8, int8: true }).map((s) => new Stage(s, 1));
    expect(() => second!.forward({ batch: B, time: T, x: tf.zeros([B * T, 9]) })).toThrow(StageError);
    expect(() => second!.backward({ batch: B, time: T, x: tf.zeros([B * T, 8]) }, tf.zeros([1]))).toThrow(StageError);
    second!.dispose();
  });
});

describe('stage weights', () => {
  it('serialize to bytes and back with a stable content hash', async () => {
    const layout = { stages: 2, bottleneck: 16, int8: true };
    const [spec] = stageSpecs(config, layout);
    const a = new Stage(spec!, 7);
    const b = new Stage(spec!, 8);
    const bytes = await exportStageWeights(a);
    expect(stageWeightsHash(bytes)).toBe(stageWeightsHash(await exportStageWeights(new Stage(spec!, 7))));
    expect(stageWeightsHash(await exportStageWeights(b))).not.toBe(stageWeightsHash(bytes));
    importStageWeights(b, bytes);
    expect(stageWeightsHash(await exportStageWeights(b))).toBe(stageWeightsHash(bytes));
  });

  it('refuse malformed, truncated or mismatched blobs and leave the stage unchanged', async () => {
    const [s0, s1] = stageSpecs(config, { stages: 2, bottleneck: 16, int8: true }).map((s) => new Stage(s, 3));
    const bytes = await exportStageWeights(s0!);
    const before = stageWeightsHash(await exportStageWeights(s1!));
    expect(() => importStageWeights(s1!, bytes)).toThrow(WeightsError); // another stage's weights
    for (const n of [0, 5, 11, 100, bytes.length - 1]) expect(() => deserializeWeights(bytes.slice(0, n))).toThrow(WeightsError);
    const nan = bytes.slice();
    new DataView(nan.buffer).setFloat32(nan.length - 4, NaN, true);
    expect(() => deserializeWeights(nan)).toThrow(WeightsError);
    expect(() => deserializeWeights(serializeWeights([{ name: 'x', shape: [2], data: new Float32Array(2) }]).slice(1))).toThrow(WeightsError);
    expect(stageWeightsHash(await exportStageWeights(s1!))).toBe(before);
  });
});

describe('asynchronous readback (what GPU backends need)', () => {
  it('backwardAsync returns the loss and gradients backward returns; clipping on the device scales to the limit and leaves smaller gradients as they are', async () => {
    const { clipByGlobalNorm } = await import('./optim');
    const layout: RunLayout = { stages: 1, bottleneck: config.dModel, int8: false };
    const stage = new Stage(stageSpecs(config, layout)[0]!, 3);
    const input: StageInput = { batch: B, time: T, x: tf.tensor2d(randomIds(1), [B, T], 'int32'), targets: tf.tensor2d(randomIds(2), [B, T], 'int32') };
    const sync = stage.backward(input);
    const async_ = await stage.backwardAsync(input);
    expect(async_.loss).toBe(sync.loss);
    const names = Object.keys(sync.grads);
    for (const name of names) expect(await async_.grads[name]!.data()).toEqual(await sync.grads[name]!.data());
    // The norm, computed on the host in float64.
    let sq = 0;
    for (const name of names) for (const v of await sync.grads[name]!.data()) sq += v * v;
    const norm = Math.sqrt(sq);
    for (const maxNorm of [norm / 10, norm * 10]) {
      const { grads, norm: n } = clipByGlobalNorm(Object.fromEntries(names.map((k) => [k, async_.grads[k]!.clone()])), maxNorm);
      expect(Math.abs((await n.data())[0]! - norm) / norm).toBeLessThan(1e-5);
      const scale = Math.min(1, maxNorm / norm);
      for (const name of names) {
        const want = Float32Array.from(await sync.grads[name]!.data(), (v) => v * scale);
        const got = (await grads[name]!.data()) as Float32Array;
        if (scale === 1) expect(got).toEqual(await sync.grads[name]!.data());
        else expect(relativeError(got, want)).toBeLessThan(1e-5);
      }
    }
    stage.dispose();
  });
});
