// One file over 400 lines: an audit's replay of a whole round is one procedure (start state, every recorded op against
// its receipts, end state, merge contribution) whose checks share the replayed stage; the record format is record.ts's.
import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex } from '@noble/hashes/utils';
import * as tf from '@tensorflow/tfjs';
import { assignedWindows, contentHash, deserializeWeights, exportStageWeights, importStageWeights, type BackendName, type Stage, type StageInput, type TokenBatch } from '@train-at-home/model';
import { payloadHashHex } from '@train-at-home/protocol';
import { decodeMicrobatch, microbatchInputs, type Microbatch } from '../microbatch';
import { OuterOptimizer } from '../allreduce/outer';
import { roundPartitionMap } from '../allreduce/butterfly';
import { contributionRoot } from '../allreduce/commitment';
import { encodeContribution } from '../allreduce/codec';
import type { AllReducePrecision } from '../allreduce/values';
import { readFlat } from '../merge';
import { StageCompute, type InnerTraining } from '../stage-compute';
import type { RoundOp, RoundRecord } from './record';

/** Why an audit failed; each names whose fault it is (always the audited miner's: its own bytes, commitments and receipts). */
export type AuditFailure =
  /** The record's start is not what the miner committed (its optimizer state) or not the weights it names. */
  | 'AUDIT_START_MISMATCH'
  /** The record names bytes no confirmed transfer carried, or leaves out a transfer the miner confirmed sending. */
  | 'AUDIT_INPUT_MISMATCH'
  | 'AUDIT_INCOMPLETE'
  /** Stage 0 fed tokens that are not its microbatch's assigned windows of the run's data. */
  | 'FOREIGN_TOKENS'
  /** What it sent forward is not what its computation gives. */
  | 'AUDIT_OUTPUT_MISMATCH'
  /** The input gradient it sent back is not what its computation gives. */
  | 'AUDIT_GRADIENT_MISMATCH'
  /** The loss it reported is not its microbatch's loss. */
  | 'AUDIT_LOSS_MISMATCH'
  /** Its weights or optimizer state at the merge (what it committed, and contributed) are not where its steps lead. */
  | 'AUDIT_WEIGHTS_MISMATCH'
  /** What the owners of its partitions received from it in the merge is not the contribution its round leads to (scaled, random). */
  | 'AUDIT_CONTRIBUTION_MISMATCH'
  | 'AUDIT_STATE_MISMATCH'
  /** The record cannot be read or contradicts itself. */
  | 'AUDIT_BAD_RECORD';

export interface AuditVerdict {
  passed: boolean;
  reason?: AuditFailure;
  /** The op at which it failed (index in the record), and what was compared there. */
  op?: number;
  detail?: string;
  metrics?: { cosine?: number; maxAbsDiff?: number; relErr?: number; relToUpdate?: number; reported?: number; replayed?: number };
  ops: number;
  steps: number;
  ms: number;
}

/** A receipt of a transfer to or from the audited miner, by either end, as the coordinator holds it. */
export interface ConfirmedTransfer {
  direction: 'activation' | 'gradient';
  activationId: string;
  from: string;
  to: string;
  payloadHash: string;
  /** Who confirmed it (absent: the audited miner). */
  reporter?: string;
  /** The miner's own receipt of it arrived within the round (absent: yes): every such send must be in the record. */
  inRound?: boolean;
}

export interface AuditInputs {
  /** A fresh stage of the audited miner's spec, holding the weights the record starts from (checked by the caller against anchorHash). */
  stage: Stage;
  training: InnerTraining;
  record: RoundRecord;
  /** The hash the miner committed for its optimizer state at the merge its record starts from; null: it started fresh (took up the stage). */
  startStateHash: string | null;
  /** What the miner committed with `merge-ready` of record.round: its weights' content hash and its optimizer state's hash. */
  endWeightsHash: string;
  endStateHash: string;
  /** The miner's own receipts of the round's transfers (and of any older microbatch its record names). */
  transfers: ConfirmedTransfer[];
  /** Losses the miner reported (last stage), by activation id. */
  reportedLosses: Map<string, number>;
  /** The run's training split and data seed: stage 0's tokens are checked against the windows each id is assigned. */
  tokens?: Uint16Array;
  dataSeed: number;
  /** The run's microbatch size (stage 0's rows), and the most rows a received microbatch may have. */
  batchSize: number;
  maxBatch: number;
  /**
   * The merge the round ended in, and what each owner of a partition said it received from the miner
   * (the hash of the encoded slice): the replay computes the contribution its round leads to (outer:
   * anchor − weights; average: the weights) and compares. Absent: a round merged alone.
   */
  merge?: {
    mode: 'outer' | 'average';
    seed: number;
    participants: string[];
    precision: AllReducePrecision;
    received: Array<{ partition: number; owner: string; hash: string }>;
    /** The contribution root the miner committed with merge-ready, for the merge's mode (commitment.ts); absent: it committed none. */
    committed?: string;
  };
  /**
   * The miner computed on another backend than the validator's: what it sent, reported and ended with may differ
   * from the replay by this much (its record carries its end state; absent there, the end is checked exactly).
   * Absent: the replay is bit-exact.
   */
  tolerance?: ReplayTolerance;
}

/** The backend whose rounds the validator (Node, WASM) replays bit for bit. */
export const EXACT_REPLAY_BACKEND: BackendName = 'wasm';

/**
 * How far an honest round computed on another backend may land from its replay on the validator's: the
 * replay runs the same ops on the same received bytes, but each backend rounds its arithmetic its own way,
 * so what the miner sent and ended with differs by a little that grows with the round's inner steps.
 */
export interface ReplayTolerance {
  /** A boundary frame it sent (activation or input gradient), both decoded: ‖sent − replayed‖ / ‖replayed‖. */
  frame: number;
  /** A loss it reported: |reported − replayed|, in nats. */
  loss: number;
  /** Its end weights, relative to the round's own update: ‖end − replayed‖ / ‖replayed − start‖ (what its merge contribution differs by). */
  weights: number;
  /** Its end optimizer moments, each of m and v: ‖carried − replayed‖ / ‖replayed‖. */
  moments: number;
}

/**
 * How far an honest tab's round on WebGL or WebGPU may land from this validator's WASM replay of it
 * (server/src/jobs/audits.ts). Measured by bench:backend-spread (bench/results/backend-spread.json, 2 cores,
 * Chromium's software WebGL and WebGPU (SwiftShader) against Node's WASM): tabs ran the rounds of a 3-stage
 * tiny run (b = 32, int8 boundaries) on the very inputs its miners had received, 20 microbatches from fresh
 * and from trained weights. Worst over both backends, every stage and both starts:
 *   - boundary frames: 1.36e-3 relative error (int8 codes that flip; it grows with the step: 8e-5 on the first microbatch, 9e-4 on the 20th);
 *   - losses: 3.3e-6 nats;
 *   - end weights: 7.8e-5 of the round's own update; AdamW's moments: 8.7e-4.
 * Each bound is ~3× (frames) to ~13× (weights) the honest worst, and below what the gentlest cheats change:
 * noise of 1% of the output's RMS is 1e-2 of a frame, a 0.999× loss 3e-3 nats, one skipped step in 20 roughly
 * 5e-2 of the update, a lazy learner 1. Measured for rounds of up to 20 inner steps of `tiny`; the end
 * weights drift further with more steps (on stage 1, 7.8e-5 at 20 against 2.8e-6 at 10), which a longer round would need measured.
 */
const BROWSER_GPU_TOLERANCE: ReplayTolerance = { frame: 4e-3, loss: 1e-4, weights: 1e-3, moments: 5e-3 };
export const REPLAY_TOLERANCE: Partial<Record<string, ReplayTolerance>> = { webgl: BROWSER_GPU_TOLERANCE, webgpu: BROWSER_GPU_TOLERANCE };

const fromHex = (h: string): Uint8Array => Uint8Array.from(h.match(/../g)!.map((b) => parseInt(b, 16)));

class Failed extends Error {
  constructor(
    readonly reason: AuditFailure,
    readonly op: number | undefined,
    message: string,
    readonly metrics?: AuditVerdict['metrics'],
  ) {
    super(message);
  }
}

/**
 * Replays a miner's whole round from the state it committed to, every op in
 * the order it ran them, with the bytes it received (each checked against a
 * transfer both ends confirmed), and compares everything it sent, every loss
 * it reported and the state it committed at the merge with what the same
 * code computes (StageCompute: the pipeline worker's own arithmetic). On the
 * miner's backend the replay is bit-exact: any deviation, a noise of 1% or a
 * skipped step, shows. Returns the first failure by name, or a pass.
 */
export async function replayRound(a: AuditInputs): Promise<AuditVerdict> {
  const started = performance.now();
  const r = a.record;
  const spec = a.stage.spec;
  const compute = new StageCompute(a.stage, a.training);
  let steps = 0;
  const anchor = a.merge ? await readFlat(a.stage) : undefined;
  const tol = a.tolerance;
  const startWeights = tol && r.end ? await exportStageWeights(a.stage) : undefined;
  try {
    // The start: the optimizer state it committed (or a fresh one).
    if (a.startStateHash === null ? r.optimizer.some((b) => b !== 0) : contentHash(r.optimizer) !== a.startStateHash) {
      throw new Failed('AUDIT_START_MISMATCH', undefined, a.startStateHash === null ? 'a round begun on a newly taken stage starts from a fresh optimizer' : 'the optimizer state is not the one committed at the merge the round starts from');
    }
    try {
      compute.importState(r.optimizer);
    } catch (e) {
      throw new Failed('AUDIT_BAD_RECORD', undefined, (e as Error).message);
    }
    const self = r.minerId;
    /**
     * Whether bytes the record says crossed a transfer are the ones confirmed: the miner's own receipt binds
     * first, else the other end's. A transfer nobody confirmed binds nothing (it earned nothing either): the
     * replay still checks what the miner computed from it.
     */
    const confirmed = (direction: 'activation' | 'gradient', activationId: string, sent: boolean, bytes: Uint8Array): boolean => {
      const of = a.transfers.filter((t) => t.direction === direction && t.activationId === activationId && (sent ? t.from === self : t.to === self));
      if (of.length === 0) return true;
      const hash = payloadHashHex(bytes);
      const own = of.filter((t) => (t.reporter ?? self) === self);
      return (own.length > 0 ? own : of).some((t) => t.payloadHash === hash);
    };
    const limits = { maxBatch: a.maxBatch, time: spec.config.contextLength, vocabSize: spec.config.vocabSize, maxPathway: spec.stages };
    const envelope = (bytes: Uint8Array, i: number, what: string): Microbatch => {
      try {
        return decodeMicrobatch(bytes, limits);
      } catch (e) {
        throw new Failed('AUDIT_BAD_RECORD', i, `${what}: ${(e as Error).message}`);
      }
    };
    const windowsOf = (activationId: string, batch: number, i: number): TokenBatch => {
      if (!a.tokens) throw new Failed('AUDIT_BAD_RECORD', i, 'no dataset to check stage 0 against');
      return assignedWindows(a.tokens, batch, spec.config.contextLength, a.dataSeed, fromHex(activationId));
    };
    // The input of an op as the stage saw it; stage 0's is its id's windows (the batch size from what it sent).
    const inputOf = (op: RoundOp, i: number, batch: number): StageInput => {
      if (spec.isFirst) {
        const w = windowsOf(op.activationId, batch, i);
        return { batch: w.batch, time: w.time, x: tf.tensor2d(w.inputs, [w.batch, w.time], 'int32') };
      }
      if (!confirmed('activation', op.activationId, false, op.input)) throw new Failed('AUDIT_INPUT_MISMATCH', i, 'an activation other than the one confirmed received');
      const mb = envelope(op.input, i, 'activation received');
      const x = decodeFrame(compute, mb.frame, mb.batch * mb.time, spec.inputWidth, i);
      const input: StageInput = { batch: mb.batch, time: mb.time, x };
      if (spec.isLast) input.targets = tf.tensor2d(mb.targets, [mb.batch, mb.time], 'int32');
      return input;
    };
    const forwarded = new Map<string, number>(); // activation id → rows, for stage 0's backward
    const covered = new Set<string>();
    for (let i = 0; i < r.ops.length; i++) {
      const op = r.ops[i]!;
      if (op.kind === 'forward') {
        if (spec.isLast || !op.sent) throw new Failed('AUDIT_BAD_RECORD', i, 'a forward must send an activation, and the last stage sends none');
        const sent = envelope(op.sent, i, 'activation sent');
        if (spec.isFirst) {
          // Checked first: a receiver that refused foreign tokens never confirmed them either.
          const w = windowsOf(op.activationId, sent.batch, i);
          if (!sameInts(microbatchInputs(sent), w.inputs) || !sameInts(sent.targets, w.targets)) throw new Failed('FOREIGN_TOKENS', i, 'the tokens sent are not the windows of the run data this microbatch id is assigned');
        }
        if (!confirmed('activation', op.activationId, true, op.sent)) throw new Failed('AUDIT_INPUT_MISMATCH', i, 'an activation other than the one confirmed sent');
        covered.add(`activation:${op.activationId}`);
        const input = inputOf(op, i, sent.batch);
        try {
          // What travels on must be what came in (stage 0: its assigned windows).
          const expected = spec.isFirst ? windowsOf(op.activationId, sent.batch, i) : (() => { const m = envelope(op.input, i, 'activation received'); return { inputs: microbatchInputs(m), targets: m.targets }; })();
          if (!sameInts(microbatchInputs(sent), expected.inputs) || !sameInts(sent.targets, expected.targets)) {
            throw new Failed(spec.isFirst ? 'FOREIGN_TOKENS' : 'AUDIT_OUTPUT_MISMATCH', i, spec.isFirst ? 'the tokens sent are not the windows of the run data this microbatch id is assigned' : 'the tokens sent on are not the ones received');
          }
          const out = compute.forward(input);
          const frame = await compute.encode(out);
          if (!sameBytes(frame, sent.frame)) {
            const metrics = compare(compute, sent.frame, out, frame);
            out.dispose();
            if (!tol || !(metrics.relErr! <= tol.frame)) throw new Failed('AUDIT_OUTPUT_MISMATCH', i, 'the activation sent is not what the stage computes', metrics);
          } else out.dispose();
        } finally {
          tf.dispose([input.x, ...(input.targets ? [input.targets] : [])]);
        }
        forwarded.set(op.activationId, sent.batch);
        continue;
      }
      // backward
      const applied = spec.isLast || forwarded.has(op.activationId);
      if (op.applied !== applied) throw new Failed('AUDIT_BAD_RECORD', i, `a backward ${applied ? 'after a forward of this round steps' : 'of a forward from before the round takes no step'}`);
      let outputGrad: tf.Tensor2D | undefined;
      const rowsHint = forwarded.get(op.activationId) ?? a.batchSize;
      if (!spec.isLast) {
        if (!op.outputGrad || !confirmed('gradient', op.activationId, false, op.outputGrad)) throw new Failed('AUDIT_INPUT_MISMATCH', i, 'a gradient other than the one confirmed received');
      }
      const input = inputOf(op, i, spec.isFirst ? rowsHint : 0);
      try {
        if (!spec.isLast) outputGrad = decodeFrame(compute, op.outputGrad!, input.batch * input.time, spec.outputWidth, i);
        const result = await compute.backward(input, outputGrad, applied);
        if (applied) steps++;
        if (spec.isLast) {
          const reported = a.reportedLosses.get(op.activationId);
          const off = (x: number | undefined): boolean => x !== result.loss && !(tol && x !== undefined && result.loss !== undefined && Math.abs(x - result.loss) <= tol.loss);
          if (off(op.loss) || (reported !== undefined && off(reported))) {
            throw new Failed('AUDIT_LOSS_MISMATCH', i, 'the loss reported is not the microbatch\'s loss', { reported: reported ?? op.loss, replayed: result.loss });
          }
        }
        if (!spec.isFirst) {
          if (!op.sent || !result.inputGrad) throw new Failed('AUDIT_BAD_RECORD', i, 'a backward off stage 0 sends a gradient');
          if (!confirmed('gradient', op.activationId, true, op.sent)) throw new Failed('AUDIT_INPUT_MISMATCH', i, 'a gradient other than the one confirmed sent');
          covered.add(`gradient:${op.activationId}`);
          const frame = await compute.encode(result.inputGrad);
          if (!sameBytes(frame, op.sent)) {
            const metrics = compare(compute, op.sent, result.inputGrad, frame);
            if (!tol || !(metrics.relErr! <= tol.frame)) throw new Failed('AUDIT_GRADIENT_MISMATCH', i, 'the gradient sent back is not what the stage computes', metrics);
          }
        }
      } finally {
        tf.dispose([input.x, ...(input.targets ? [input.targets] : []), ...(outputGrad ? [outputGrad] : [])]);
      }
    }
    // Nothing it confirmed sending in the round is left out of the record.
    const missing = a.transfers.filter((t) => t.from === self && (t.reporter ?? self) === self && t.inRound !== false && !covered.has(`${t.direction}:${t.activationId}`));
    if (missing.length > 0) {
      const named = missing.slice(0, 4).map((t) => `${t.direction} ${t.activationId}`).join(', ');
      throw new Failed('AUDIT_INCOMPLETE', undefined, `${missing.length} transfer(s) the miner confirmed sending are not in its record (${named})`);
    }
    // The end: what it committed at the merge (and contributed to it) is where its steps lead.
    if (tol && r.end && startWeights) {
      // Computed elsewhere: the end it carries is the one it committed, and within the tolerance of where the replay's steps lead.
      if (contentHash(r.end.weights) !== a.endWeightsHash) throw new Failed('AUDIT_WEIGHTS_MISMATCH', undefined, 'the end weights in the record are not the ones committed at the merge');
      if (contentHash(r.end.state) !== a.endStateHash) throw new Failed('AUDIT_STATE_MISMATCH', undefined, 'the end optimizer state in the record is not the one committed at the merge');
      const replayed = await exportStageWeights(a.stage);
      let carried: Float32Array;
      try {
        carried = flatWeights(r.end.weights, replayed);
      } catch (e) {
        throw new Failed('AUDIT_BAD_RECORD', undefined, `end weights: ${(e as Error).message}`);
      }
      const mine = flatWeights(replayed, replayed);
      const update = distance(mine, flatWeights(startWeights, replayed));
      const relToUpdate = update > 0 ? distance(carried, mine) / update : distance(carried, mine) === 0 ? 0 : Infinity;
      if (!(relToUpdate <= tol.weights)) throw new Failed('AUDIT_WEIGHTS_MISMATCH', undefined, 'the weights committed at the merge are not where the round\'s steps lead', { relToUpdate });
      const relErr = momentsError(r.end.state, await compute.exportState());
      if (!(relErr <= tol.moments)) throw new Failed('AUDIT_STATE_MISMATCH', undefined, 'the optimizer state committed at the merge is not where the round\'s steps lead', { relErr });
      // What it contributed to the merge is computed from what it committed.
      importStageWeights(a.stage, r.end.weights);
    } else {
      if (contentHash(await exportStageWeights(a.stage)) !== a.endWeightsHash) throw new Failed('AUDIT_WEIGHTS_MISMATCH', undefined, 'the weights committed at the merge are not where the round\'s steps lead');
      if (contentHash(await compute.exportState()) !== a.endStateHash) throw new Failed('AUDIT_STATE_MISMATCH', undefined, 'the optimizer state committed at the merge is not where the round\'s steps lead');
    }
    if (a.merge && anchor) {
      // The contribution it sent: each partition's owners say what they received; both owners agreeing on other bytes
      // than the replay's is the miner's doing (an owner alone could be the liar: recorded by the merge, not here).
      const m = a.merge;
      const current = await readFlat(a.stage);
      const contribution = m.mode === 'outer' ? new OuterOptimizer(anchor).pseudoGradient(current) : current;
      // What it committed to before the round could be drawn: owners took only slices this root proves.
      if (m.committed !== undefined && contributionRoot(contribution, m.precision) !== m.committed) {
        throw new Failed('AUDIT_CONTRIBUTION_MISMATCH', undefined, 'the contribution committed with merge-ready is not the one its round leads to');
      }
      for (const p of roundPartitionMap(m.participants, contribution.length, m.seed)) {
        const said = m.received.filter((r) => r.partition === p.index && p.owners.includes(r.owner));
        if (said.length === 0) continue;
        const hash = bytesToHex(sha256(encodeContribution(contribution.subarray(p.start, p.end), m.precision)));
        if (said.every((r) => r.hash !== hash)) {
          throw new Failed('AUDIT_CONTRIBUTION_MISMATCH', undefined, `the owners of partition ${p.index} received a contribution other than the one its round leads to`);
        }
      }
    }
    return { passed: true, ops: r.ops.length, steps, ms: performance.now() - started };
  } catch (e) {
    if (!(e instanceof Failed)) throw e;
    return { passed: false, reason: e.reason, ...(e.op !== undefined ? { op: e.op } : {}), detail: e.message, ...(e.metrics ? { metrics: e.metrics } : {}), ops: r.ops.length, steps, ms: performance.now() - started };
  } finally {
    compute.dispose();
  }
}

function decodeFrame(compute: StageCompute, bytes: Uint8Array, rows: number, cols: number, i: number): tf.Tensor2D {
  try {
    return compute.decode(bytes, rows, cols);
  } catch (e) {
    throw new Failed('AUDIT_BAD_RECORD', i, `frame: ${(e as Error).message}`);
  }
}

/**
 * How far what was sent is from what the replay computed (for the evidence: a cosine near 1 with bytes that differ
 * is small noise), and `relErr`: both frames decoded, ‖sent − replayed‖ / ‖replayed‖ (what a tolerance bounds;
 * Infinity when the frame cannot be decoded).
 */
function compare(compute: StageCompute, sent: Uint8Array, replayed: tf.Tensor2D, replayedFrame: Uint8Array): NonNullable<AuditVerdict['metrics']> {
  try {
    const [rows, cols] = replayed.shape;
    return tf.tidy(() => {
      const got = compute.decode(sent, rows, cols);
      const want = compute.decode(replayedFrame, rows, cols);
      const dot = tf.sum(tf.mul(got, replayed)).dataSync()[0]!;
      const norms = Math.sqrt(tf.sum(tf.square(got)).dataSync()[0]! * tf.sum(tf.square(replayed)).dataSync()[0]!);
      const wantNorm = Math.sqrt(tf.sum(tf.square(want)).dataSync()[0]!);
      const off = Math.sqrt(tf.sum(tf.square(tf.sub(got, want))).dataSync()[0]!);
      return {
        cosine: norms > 0 ? dot / norms : 0,
        maxAbsDiff: tf.max(tf.abs(tf.sub(got, replayed))).dataSync()[0]!,
        relErr: wantNorm > 0 ? off / wantNorm : off === 0 ? 0 : Infinity,
      };
    });
  } catch {
    return { relErr: Infinity };
  }
}

/** A stage's weights blob as one vector, in the order of `like`'s tensors (each checked by name and size). */
export function flatWeights(blob: Uint8Array, like: Uint8Array): Float32Array {
  const order = deserializeWeights(like);
  const byName = new Map(deserializeWeights(blob).map((t) => [t.name, t]));
  if (byName.size !== order.length) throw new Error('not this stage\'s tensors');
  const out = new Float32Array(order.reduce((n, t) => n + t.data.length, 0));
  let at = 0;
  for (const t of order) {
    const mine = byName.get(t.name);
    if (!mine || mine.data.length !== t.data.length) throw new Error(`tensor ${t.name} missing or of another size`);
    out.set(mine.data, at);
    at += t.data.length;
  }
  return out;
}

/** Euclidean distance of two vectors of one length. */
export function distance(a: Float32Array, b: Float32Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += (a[i]! - b[i]!) ** 2;
  return Math.sqrt(s);
}

/**
 * Two optimizer states (StageCompute.exportState): the step counts must be equal; the larger relative error of
 * AdamW's two moments, m and v (Infinity when the blobs differ in size or steps).
 */
export function momentsError(carried: Uint8Array, replayed: Uint8Array): number {
  if (carried.length !== replayed.length || carried.length < 8 || (carried.length - 8) % 8 !== 0) return Infinity;
  const a = new DataView(carried.buffer, carried.byteOffset, carried.byteLength);
  const b = new DataView(replayed.buffer, replayed.byteOffset, replayed.byteLength);
  if (a.getUint32(0, true) !== b.getUint32(0, true) || a.getUint32(4, true) !== b.getUint32(4, true)) return Infinity;
  const half = (carried.length - 8) / 8;
  let worst = 0;
  for (const from of [8, 8 + 4 * half]) {
    let off = 0;
    let norm = 0;
    for (let i = 0; i < half; i++) {
      const x = a.getFloat32(from + 4 * i, true);
      const y = b.getFloat32(from + 4 * i, true);
      if (!Number.isFinite(x)) return Infinity;
      off += (x - y) ** 2;
      norm += y * y;
    }
    worst = Math.max(worst, norm > 0 ? Math.sqrt(off / norm) : off === 0 ? 0 : Infinity);
  }
  return worst;
}

const sameBytes = (a: Uint8Array, b: Uint8Array): boolean => a.length === b.length && a.every((x, i) => x === b[i]);
const sameInts = (a: Int32Array, b: Int32Array): boolean => a.length === b.length && a.every((x, i) => x === b[i]);
