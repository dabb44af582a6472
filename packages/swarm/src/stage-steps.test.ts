// syntheticStage is what bench:webgpu-dispatch and the e2e counter test time and count: it must be a real
// microbatch of the pipeline worker's arithmetic (every step trains, frames pass through the run's codec).
import * as tf from '@tensorflow/tfjs';
import { initNodeBackend } from '@train-at-home/model/node';
import { exportStageWeights } from '@train-at-home/model';
import { beforeAll, describe, expect, it } from 'vitest';
import { syntheticStage } from './stage-steps';

beforeAll(async () => {
  await initNodeBackend();
});

describe('syntheticStage', () => {
  it.each([0, 1, 2])('stage %i of 3 trains one microbatch per step, leaking no tensor', async (stage) => {
    const s = syntheticStage({ preset: 'tiny', layout: { stages: 3, bottleneck: 32, int8: true }, stage, batch: 2 });
    expect(s.tokens).toBe(2 * 64);
    const before = await exportStageWeights(s.stage);
    await s.step();
    const tensors = tf.memory().numTensors;
    await s.step();
    // A steady step holds nothing back (what a count of its allocations assumes).
    expect(tf.memory().numTensors).toBe(tensors);
    const after = await exportStageWeights(s.stage);
    // The AdamW step ran: the weights moved.
    expect(Buffer.from(after).equals(Buffer.from(before))).toBe(false);
    s.dispose();
  });

  it('refuses a stage the layout does not have', () => {
    expect(() => syntheticStage({ preset: 'tiny', layout: { stages: 3, bottleneck: 32, int8: true }, stage: 3, batch: 2 })).toThrow(RangeError);
  });
});

