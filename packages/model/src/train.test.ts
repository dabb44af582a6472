import { describe, expect, it } from 'vitest';
import { encodedBytes } from './codec';
import { PRESETS } from './config';
import { runLocalTraining } from './node/train';

describe('local training (tiny preset, 3 stages, int8 boundaries)', () => {
  it('brings held-out loss below the bigram baseline of the same tokenizer', async () => {
    const result = await runLocalTraining({
      preset: 'tiny',
      stages: 3,
      int8: true,
      // 409,600 tokens: the CI-sized budget (two to three minutes on one core of this machine).
      steps: 200,
      batchSize: 32,
      peakLr: 0.006,
      evalEvery: 100,
      seed: 1,
      log: (line) => {
        if (line.includes('held-out') || line.includes('bigram')) console.log(line);
      },
    });
    // Every boundary tensor of every training step went through the codec as an int8 frame, both ways:
    // 200 steps × 2 boundaries × one [32·64, d] frame.
    const frame = encodedBytes(32 * PRESETS.tiny.contextLength, PRESETS.tiny.dModel, 'int8');
    expect(result.wire.forwardBytes).toBe(200 * 2 * frame);
    expect(result.wire.backwardBytes).toBe(200 * 2 * frame);
    // Learning, monotone at the coarse scale, and past adjacent-token statistics.
    const losses = result.evaluations.map((e) => e.heldOutLoss);
    expect(losses[losses.length - 1]).toBeLessThan(losses[0]!);
    expect(result.heldOutLoss).toBeLessThan(result.bigramLoss);
  });
});
