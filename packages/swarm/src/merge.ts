import * as tf from '@tensorflow/tfjs';
import { contentHash, exportStageWeights, type Stage } from '@train-at-home/model';
import type { MergeGo } from '@train-at-home/protocol';
import { AllReduceError, type ButterflyNode, type Evidence, type RoundResult } from './allreduce/butterfly';
import { roundPrecision } from './allreduce/codec';
import { contributionRoot } from './allreduce/commitment';
import { OuterOptimizer } from './allreduce/outer';
import type { AllReducePrecision } from './allreduce/values';

/** A stage's parameters as one flat vector, in its parameter order (the all-reduce's view); read asynchronously. */
export async function readFlat(stage: Stage): Promise<Float32Array> {
  const parts = (await Promise.all(stage.specs.map((s) => stage.params[s.name]!.data()))) as Float32Array[];
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

export function writeFlat(stage: Stage, flat: Float32Array): void {
  let at = 0;
  for (const s of stage.specs) {
    const size = s.shape.reduce((a, b) => a * b, 1);
    const slice = flat.subarray(at, at + size);
    tf.tidy(() => stage.params[s.name]!.assign(tf.tensor(slice, s.shape)));
    at += size;
  }
  if (at !== flat.length) throw new Error(`flat vector of ${flat.length} for a stage of ${at} parameters`);
}

export interface MergeOutcome {
  ok: boolean;
  error?: string;
  /** Hash of the stage's weights after the round (the same on every replica when it went well). */
  hash: string;
  /** The stage's weights after the round, exported when `hash` was taken (what its checkpoint uploads: training may already have moved on). */
  weights: Uint8Array;
  clipped: number;
  evidence: Evidence[];
  round?: RoundResult;
}

/**
 * What a replica will contribute to its merge, in either mode, and the roots
 * it commits to with `merge-ready` (commitment.ts), computed while it is
 * paused: outer sends anchor − weights, average the weights themselves (the
 * coordinator picks the mode after every replica answered).
 */
export interface PreparedContribution {
  current: Float32Array;
  outer: Float32Array;
  average: Float32Array;
  roots: { outer: string; average: string };
}

export async function prepareContribution(stage: Stage, outer: OuterOptimizer, precision: AllReducePrecision, rewrite?: (contribution: Float32Array) => Float32Array): Promise<PreparedContribution> {
  // Fault injection (a poisoned contribution, for the validator's tests): what this replica commits to and sends, not what it holds.
  const send = (v: Float32Array): Float32Array => (rewrite ? rewrite(v) : v);
  const current = await readFlat(stage);
  const pseudo = send(outer.pseudoGradient(current));
  const average = send(current);
  // Each root is seconds of hashing on a gpu stage (28 M values: 6 s for both on this project's 2-core machine):
  // the event loop gets a turn between them, so the miner's heartbeats and answers go out meanwhile.
  await nextTurn();
  const outerRoot = contributionRoot(pseudo, roundPrecision(precision, 'outer'));
  await nextTurn();
  const averageRoot = contributionRoot(average, roundPrecision(precision, 'average'));
  return { current, outer: pseudo, average, roots: { outer: outerRoot, average: averageRoot } };
}

/** A turn of the event loop (timers and sockets run) between long synchronous steps. */
export const nextTurn = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 0));

/**
 * One replica's merge: DiLoCo's outer step over the butterfly all-reduce.
 * mode 'outer': all-reduce the pseudo-gradients (anchor − current), then the
 * same Nesterov step from the same anchor on every replica; mode 'average':
 * all-reduce the weights themselves, which become the new anchor (the
 * replicas' states differed, e.g. a newcomer joined). A lone replica's round
 * just takes its weights as the anchor. A failed round changes nothing.
 * It sends what it committed to (`prepared`); owners refuse anything else.
 */
export async function runMerge(go: MergeGo, stage: Stage, outer: OuterOptimizer, node: ButterflyNode, prepared: PreparedContribution): Promise<MergeOutcome> {
  const current = prepared.current;
  const done = async (ok: boolean, extra: Partial<MergeOutcome> = {}): Promise<MergeOutcome> => {
    const weights = await exportStageWeights(stage);
    return { ok, hash: contentHash(weights), weights, clipped: 0, evidence: [], ...extra };
  };
  if (go.participants.length < 2) {
    outer.reset(current);
    return done(true);
  }
  const spec = { round: go.round, seed: go.seed, participants: go.participants, weights: go.weights, precision: go.precision, reduction: go.reduction, timeouts: go.timeouts, commitments: go.commitments };
  try {
    if (go.mode === 'outer') {
      const round = await node.run(spec, prepared.outer);
      writeFlat(stage, outer.step(round.values, go.outer));
      return done(true, { clipped: round.clipped, evidence: round.evidence, round });
    }
    const round = await node.run(spec, prepared.average);
    writeFlat(stage, round.values);
    outer.reset(round.values);
    return done(true, { clipped: round.clipped, evidence: round.evidence, round });
  } catch (e) {
    if (e instanceof AllReduceError) return done(false, { error: e.code });
    throw e;
  }
}
