import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { stageSpecs } from './config';
import { continueTokens, sampleToken, seededRandom } from './generate';
import { Stage } from './stage';

beforeAll(async () => {
  await tf.setBackend('cpu');
});

describe('sampling the next token', () => {
  const logits = Float32Array.from([0.1, 3, 2.9, -1, 2.95]);
  it('is the most likely token at temperature 0, and a draw among the top k otherwise, repeatable from its seed', () => {
    expect(sampleToken(logits, { temperature: 0, random: Math.random })).toBe(1);
    const draws = (seed: number, topK?: number): number[] => {
      const random = seededRandom(seed);
      return Array.from({ length: 400 }, () => sampleToken(logits, { temperature: 1, topK, random }));
    };
    expect(new Set(draws(3, 2))).toEqual(new Set([1, 4]));
    expect(new Set(draws(3))).toEqual(new Set([0, 1, 2, 3, 4]));
    expect(draws(7, 3)).toEqual(draws(7, 3));
  });

  it('continues a prompt with a chain of stages, stopping at the end-of-text token or the budget', async () => {
    const specs = stageSpecs({ vocabSize: 50, contextLength: 8, nLayer: 2, nHead: 2, dModel: 16 }, { stages: 2, bottleneck: 8, int8: true });
    const stages = specs.map((s) => new Stage(s, 5));
    const run = async (codec?: 'int8'): Promise<number[]> => {
      const out: number[] = [];
      for await (const id of continueTokens(stages, [1, 2, 3], { maxTokens: 12, contextLength: 8, eotId: 49, sampling: { temperature: 0, random: Math.random }, codec })) out.push(id);
      return out;
    };
    const plain = await run();
    expect(plain.length === 12 || plain.at(-1) === 49).toBe(true);
    expect(plain.every((id) => id >= 0 && id < 50)).toBe(true);
    expect(await run()).toEqual(plain);
    expect((await run('int8')).length).toBeGreaterThan(0);
    stages.forEach((s) => s.dispose());
  });
});
