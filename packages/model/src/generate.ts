import * as tf from '@tensorflow/tfjs';
import { decodeBoundary, encodeBoundary } from './codec';
import type { Precision } from './codec';
import type { Stage } from './stage';

/** How the next token is drawn from its logits. */
export interface Sampling {
  /** 0: the most likely token (greedy); else logits / temperature, softmax, a draw. */
  temperature: number;
  /** Draw among the k most likely tokens only (unset or 0: all). */
  topK?: number;
  /** Uniform in [0, 1): seededRandom for a repeatable draw. */
  random: () => number;
}

/** A small seeded generator (mulberry32's step): the validator's samples are repeatable from their seed. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0 || 1;
  return () => (state = (Math.imul(state ^ (state >>> 15), 1 | state) + 0x6d2b79f5) >>> 0) / 2 ** 32;
}

/** The next token from one position's logits [V]. */
export function sampleToken(logits: Float32Array, s: Sampling): number {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i]! > logits[best]!) best = i;
  if (s.temperature <= 0) return best;
  let candidates = Array.from(logits.keys());
  if (s.topK && s.topK > 0 && s.topK < logits.length) candidates = candidates.sort((a, b) => logits[b]! - logits[a]!).slice(0, s.topK);
  const max = logits[best]!;
  const weights = candidates.map((i) => Math.exp((logits[i]! - max) / s.temperature));
  let r = s.random() * weights.reduce((a, b) => a + b, 0);
  for (let i = 0; i < weights.length; i++) if ((r -= weights[i]!) <= 0) return candidates[i]!;
  return candidates[candidates.length - 1]!;
}

export interface ContinueOptions {
  maxTokens: number;
  /** The model's context: only the last this many tokens are read. */
  contextLength: number;
  /** Generation stops after this token (end of text). */
  eotId: number;
  sampling: Sampling;
  /** Round trips each boundary through the run's wire codec, as the run's own pipeline does; unset: fp32. */
  codec?: Precision;
}

/**
 * Continues `ids` with a chain of stages (every stage of a run, in order), one token at a time: each step runs the
 * window through the stages and draws from the last position's logits. Yields each new token. Every read is
 * awaited (GPU backends have no synchronous read). What the validator writes on the Dashboard and what the Try
 * page writes in a tab.
 */
export async function* continueTokens(stages: readonly Stage[], prompt: readonly number[], o: ContinueOptions): AsyncGenerator<number> {
  const ids = [...prompt];
  for (let n = 0; n < o.maxTokens; n++) {
    const window = ids.slice(-o.contextLength);
    let x: tf.Tensor = tf.tensor2d(window, [1, window.length], 'int32');
    for (const stage of stages.slice(0, -1)) {
      const out = stage.forward({ batch: 1, time: window.length, x }) as tf.Tensor2D;
      x.dispose();
      x = o.codec ? await roundTrip(out, o.codec) : out;
    }
    const logits = tf.tidy(() => {
      const all = stages[stages.length - 1]!.logits({ batch: 1, time: window.length, x });
      return tf.slice(all, [window.length - 1, 0], [1, -1]).reshape([-1]);
    });
    x.dispose();
    const values = (await logits.data()) as Float32Array;
    logits.dispose();
    const next = sampleToken(values, o.sampling);
    ids.push(next);
    yield next;
    if (next === o.eotId) return;
  }
}

async function roundTrip(t: tf.Tensor2D, precision: Precision): Promise<tf.Tensor2D> {
  const [rows, cols] = t.shape;
  const bytes = encodeBoundary({ rows, cols, data: (await t.data()) as Float32Array }, precision);
  t.dispose();
  return tf.tensor2d(decodeBoundary(bytes, { rows, precision }).data, [rows, cols]);
}
