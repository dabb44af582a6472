import * as tf from '@tensorflow/tfjs';
import type { Misbehaviour } from '@train-at-home/swarm';

/**
 * Every kind of cheat the validator must catch, as fault injection for the
 * adversarial test and drills: where in the pipeline it can act, and the
 * flag it must earn.
 */
export const CHEATS = {
  'zeroed outputs': { stage: 0, flags: ['OUTPUT_MISMATCH'], make: (): Misbehaviour => ({ output: (out) => tf.zerosLike(out) }) },
  'replayed stale activations': { stage: 0, flags: ['OUTPUT_MISMATCH'], make: (): Misbehaviour => ({ output: staleOutputs() }) },
  'forged receipts': { stage: 0, flags: ['FORGED_RECEIPTS'], make: (): Misbehaviour => ({ forgeReceipts: true }) },
  'noise on outputs': {
    stage: 1,
    flags: ['OUTPUT_MISMATCH'],
    make: (): Misbehaviour => ({ output: (out) => tf.tidy(() => out.add(tf.randomNormal(out.shape).mul(tf.sqrt(tf.mean(tf.square(out)))))) }),
  },
  'free-rider': { stage: 1, flags: ['OUTPUT_MISMATCH', 'GRADIENT_MISMATCH'], make: (): Misbehaviour => ({ freeRide: true }) },
  'sign-flipped gradients': { stage: 2, flags: ['GRADIENT_MISMATCH'], make: (): Misbehaviour => ({ inputGrad: (g) => tf.neg(g) }) },
  'under-reported losses': { stage: 2, flags: ['LOSS_MISREPORTED'], make: (): Misbehaviour => ({ reportedLoss: (loss) => loss * 0.7 }) },
} as const satisfies Record<string, { stage: number; flags: readonly string[]; make: () => Misbehaviour }>;

export type CheatName = keyof typeof CHEATS;

/** A stage that computes its first output and sends that one ever after. */
function staleOutputs(): (out: tf.Tensor2D) => tf.Tensor2D {
  let first: tf.Tensor2D | undefined;
  return (out) => {
    first ??= tf.keep(out.clone());
    return first.clone();
  };
}
