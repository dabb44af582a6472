import * as tf from '@tensorflow/tfjs';
import type { Misbehaviour } from '@train-at-home/swarm';

/**
 * Every kind of cheat the validator must catch, as fault injection for the
 * adversarial test and drills: where in the pipeline it can act, and the
 * flag it must earn.
 */
export const CHEATS = {
  'zeroed outputs': { stage: 0, flags: ['OUTPUT_MISMATCH', 'AUDIT_FAILED'], make: (): Misbehaviour => ({ output: (out) => tf.zerosLike(out) }) },
  'replayed stale activations': { stage: 0, flags: ['OUTPUT_MISMATCH', 'AUDIT_FAILED'], make: (): Misbehaviour => ({ output: staleOutputs() }) },
  'forged receipts': { stage: 0, flags: ['FORGED_RECEIPTS', 'AUDIT_FAILED'], make: (): Misbehaviour => ({ forgeReceipts: true }) },
  'noise on outputs': {
    stage: 1,
    flags: ['OUTPUT_MISMATCH', 'AUDIT_FAILED'],
    make: (): Misbehaviour => ({ output: (out) => tf.tidy(() => out.add(tf.randomNormal(out.shape).mul(tf.sqrt(tf.mean(tf.square(out)))))) }),
  },
  'free-rider': { stage: 1, flags: ['OUTPUT_MISMATCH', 'GRADIENT_MISMATCH', 'AUDIT_FAILED'], make: (): Misbehaviour => ({ freeRide: true }) },
  'sign-flipped gradients': { stage: 2, flags: ['GRADIENT_MISMATCH', 'AUDIT_FAILED'], make: (): Misbehaviour => ({ inputGrad: (g) => tf.neg(g) }) },
  'under-reported losses': { stage: 2, flags: ['LOSS_MISREPORTED', 'AUDIT_FAILED'], make: (): Misbehaviour => ({ reportedLoss: (loss) => loss * 0.7 }) },
  // What only a whole-round audit sees (jobs/audits.ts): each is honest on the first microbatch after a merge.
  'noise of 1% after the first step': { stage: 1, flags: ['AUDIT_FAILED'], make: (): Misbehaviour => ({ output: afterFirst((out) => tf.tidy(() => out.add(tf.randomNormal(out.shape).mul(tf.sqrt(tf.mean(tf.square(out))).mul(0.01))))) }) },
  'lazy learner': { stage: 1, flags: ['AUDIT_FAILED'], make: (): Misbehaviour => ({ skipSteps: true }) },
  'audit refuser': { stage: 2, flags: ['AUDIT_UNANSWERED'], make: (): Misbehaviour => ({ refuseAudits: true }) },
  'plausible free-rider': { stage: 1, flags: ['AUDIT_FAILED'], make: (): Misbehaviour => ({ freeRideAfterFirst: true }) },
  'scaled contribution': { stage: 2, flags: ['AUDIT_FAILED'], make: (): Misbehaviour => ({ contribution: (v) => v.map((x) => 3 * x) }) },
  'random contribution': { stage: 2, flags: ['AUDIT_FAILED'], make: (): Misbehaviour => ({ contribution: randomLike }) },
  'foreign tokens': { stage: 0, flags: ['AUDIT_FAILED'], make: (): Misbehaviour => ({ tokens: (b) => ({ ...b, inputs: b.inputs.map((t) => (t + 1) % 256), targets: b.targets.map((t) => (t + 1) % 256) }) }) },
} as const satisfies Record<string, { stage: number; flags: readonly string[]; make: () => Misbehaviour }>;

export type CheatName = keyof typeof CHEATS;

/** Noise with the norm of the honest contribution: nothing a norm check would see. */
function randomLike(v: Float32Array): Float32Array {
  const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  const noise = Float32Array.from(v, () => Math.random() - 0.5);
  const scale = norm / Math.max(1e-30, Math.sqrt(noise.reduce((s, x) => s + x * x, 0)));
  return noise.map((x) => x * scale);
}

/** Rewrites every output but the first after each merge (the one an exact replay of that moment would check). */
function afterFirst(rewrite: (out: tf.Tensor2D) => tf.Tensor2D): (out: tf.Tensor2D) => tf.Tensor2D {
  let n = 0;
  return (out) => (n++ % 4 === 0 ? out : rewrite(out));
}

/** A stage that computes its first output and sends that one ever after. */
function staleOutputs(): (out: tf.Tensor2D) => tf.Tensor2D {
  let first: tf.Tensor2D | undefined;
  return (out) => {
    first ??= tf.keep(out.clone());
    return first.clone();
  };
}
