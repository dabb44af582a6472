/**
 * What a miner keeps of each training round so the validator can replay it
 * whole (an audit): the state it started from and every step it took, in
 * order, with the exact bytes it received and sent. Sent and received bytes
 * are bound beforehand by the transfers' receipts (both ends confirmed their
 * hashes), the start and end states by the hashes the miner committed with
 * `merge-ready`; the record itself proves nothing until the replay matches.
 *
 * Binary form (little-endian):
 *   0   u32  magic 'TAHR' (0x52484154)
 *   4   u32  JSON header length H
 *   8   H    JSON header (RecordHeader: every field but the byte arrays, with their lengths)
 *   then the optimizer state, the anchor weights (if any), the end weights and end optimizer state (if kept), then each
 *   op's input, outputGrad and sent bytes, in op order
 */

import { contentHash } from '@train-at-home/model';

export const RECORD_MAGIC = 0x52484154;
/** The largest record a miner uploads or the coordinator accepts. */
export const MAX_RECORD_BYTES = 64 * 1024 * 1024;
/**
 * The fewest bytes a record of a stage holding `parameters` values takes: its start weights (fp32) and optimizer
 * state (AdamW's two moments), and, from a backend whose replay is not exact, its end weights and state as well.
 * Over MAX_RECORD_BYTES (every stage of the `gpu` preset: ~0.85 GB) a round cannot be uploaded for an audit: its
 * miners keep no records, and the validator draws none of its rounds (skipped, RECORD_TOO_LARGE).
 */
export function recordFloorBytes(parameters: number, keepsEnd: boolean): number {
  return parameters * (4 + 8) * (keepsEnd ? 2 : 1);
}
/** Ops in one round's record (a round is `merge.every` microbatches, or what fits in `maxTrainingMs`). */
export const MAX_RECORD_OPS = 4096;

/** One thing the miner's pipeline worker did, in the order it did it. */
export interface RoundOp {
  /** 'forward': ran its blocks and sent the boundary tensor on (not the last stage); 'backward': the vector-Jacobian product, maybe a step, and the input gradient sent back. */
  kind: 'forward' | 'backward';
  activationId: string;
  /** The activation payload it received (empty on stage 0: its tokens are the microbatch id's assigned windows). */
  input: Uint8Array;
  /** backward, not on the last stage: the gradient payload it received. */
  outputGrad?: Uint8Array;
  /** What it sent: the activation payload (forward) or the input-gradient frame (backward, not on stage 0). */
  sent?: Uint8Array;
  /** backward: whether the weights took the step (false for a gradient of weights from before a merge). */
  applied?: boolean;
  /** backward on the last stage: the loss it reported. */
  loss?: number;
  /** stage 0's forward: the targets and first tokens travel in `sent`; nothing else to keep. */
}

export interface RoundRecord {
  runId: number;
  minerId: string;
  stage: number;
  /** The merge round whose weights the miner started from (its takeStage checkpoint's round, or 0: the run's initial weights). */
  anchorRound: number;
  /** Content hash of those weights. */
  anchorHash: string;
  /**
   * Those weights themselves (exportStageWeights): a replay starts from them when the stage's checkpoint of
   * that round has other weights (this replica's merge ended elsewhere) or is gone. The validator takes them
   * only if `anchorHash` is what the miner reported for that merge before the audit was drawn.
   */
  anchorWeights?: Uint8Array;
  /** StageCompute.exportState() at the start: the schedule's step, AdamW's step and moments. */
  optimizer: Uint8Array;
  /** The merge round whose `merge-ready` ended this record (the commitments of its end state). */
  round: number;
  ops: RoundOp[];
  /**
   * The end state it committed with that `merge-ready` (weights and optimizer state), kept by a miner whose
   * backend is not the validator's: a replay of its round on the validator's backend is within a measured
   * tolerance, not bit-exact, and compares against these (each checked against its committed hash).
   */
  end?: { weights: Uint8Array; state: Uint8Array };
}

type OpHeader = Omit<RoundOp, 'input' | 'outputGrad' | 'sent'> & { inputBytes: number; outputGradBytes: number; sentBytes: number };
type RecordHeader = Omit<RoundRecord, 'optimizer' | 'anchorWeights' | 'ops' | 'end'> & { optimizerBytes: number; anchorWeightsBytes: number; endWeightsBytes?: number; endStateBytes?: number; ops: OpHeader[] };

export class RecordError extends Error {
  override name = 'RecordError';
  constructor(
    readonly code: 'BAD_RECORD' | 'TOO_LARGE',
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

export function encodeRecord(r: RoundRecord): Uint8Array {
  const header: RecordHeader = {
    runId: r.runId,
    minerId: r.minerId,
    stage: r.stage,
    anchorRound: r.anchorRound,
    anchorHash: r.anchorHash,
    round: r.round,
    optimizerBytes: r.optimizer.length,
    anchorWeightsBytes: r.anchorWeights?.length ?? -1,
    ...(r.end ? { endWeightsBytes: r.end.weights.length, endStateBytes: r.end.state.length } : {}),
    ops: r.ops.map((o) => ({
      kind: o.kind,
      activationId: o.activationId,
      ...(o.applied !== undefined ? { applied: o.applied } : {}),
      ...(o.loss !== undefined ? { loss: o.loss } : {}),
      inputBytes: o.input.length,
      outputGradBytes: o.outputGrad?.length ?? -1,
      sentBytes: o.sent?.length ?? -1,
    })),
  };
  const json = new TextEncoder().encode(JSON.stringify(header));
  const blobs = [r.optimizer, r.anchorWeights ?? new Uint8Array(0), ...(r.end ? [r.end.weights, r.end.state] : []), ...r.ops.flatMap((o) => [o.input, o.outputGrad ?? new Uint8Array(0), o.sent ?? new Uint8Array(0)])];
  const total = 8 + json.length + blobs.reduce((n, b) => n + b.length, 0);
  if (total > MAX_RECORD_BYTES) throw new RecordError('TOO_LARGE', `a record of ${total} bytes exceeds ${MAX_RECORD_BYTES}`);
  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  view.setUint32(0, RECORD_MAGIC, true);
  view.setUint32(4, json.length, true);
  out.set(json, 8);
  let at = 8 + json.length;
  for (const b of blobs) {
    out.set(b, at);
    at += b.length;
  }
  return out;
}

const HEX64 = /^[0-9a-f]{64}$/;
const HEX32 = /^[0-9a-f]{32}$/;
const isCount = (n: unknown, max: number): n is number => Number.isInteger(n) && (n as number) >= 0 && (n as number) <= max;

/** Parses and checks a record's structure (not its truth: that is the replay's job); throws RecordError by name. */
export function decodeRecord(bytes: Uint8Array): RoundRecord {
  const bad = (why: string): never => {
    throw new RecordError('BAD_RECORD', why);
  };
  if (bytes.length > MAX_RECORD_BYTES) throw new RecordError('TOO_LARGE', `a record of ${bytes.length} bytes exceeds ${MAX_RECORD_BYTES}`);
  if (bytes.length < 8) bad('shorter than its header');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(0, true) !== RECORD_MAGIC) bad('not a round record (magic)');
  const jsonBytes = view.getUint32(4, true);
  if (8 + jsonBytes > bytes.length) bad('header longer than the record');
  let h: RecordHeader;
  try {
    h = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(8, 8 + jsonBytes))) as RecordHeader;
  } catch {
    return bad('header is not JSON');
  }
  if (typeof h !== 'object' || h === null) bad('header is not an object');
  if (!isCount(h.runId, 2 ** 31) || !isCount(h.stage, 63) || !isCount(h.anchorRound, 2 ** 31) || !isCount(h.round, 2 ** 31)) bad('run, stage or rounds out of range');
  if (typeof h.minerId !== 'string' || !HEX64.test(h.minerId) || typeof h.anchorHash !== 'string' || !HEX64.test(h.anchorHash)) bad('miner id or anchor hash malformed');
  if (!isCount(h.optimizerBytes, MAX_RECORD_BYTES)) bad('optimizer state length malformed');
  if (!(h.anchorWeightsBytes === -1 || isCount(h.anchorWeightsBytes, MAX_RECORD_BYTES))) bad('anchor weights length malformed');
  const hasEnd = h.endWeightsBytes !== undefined || h.endStateBytes !== undefined;
  if (hasEnd && !(isCount(h.endWeightsBytes, MAX_RECORD_BYTES) && isCount(h.endStateBytes, MAX_RECORD_BYTES))) bad('end state lengths malformed');
  if (!Array.isArray(h.ops) || h.ops.length > MAX_RECORD_OPS) bad(`ops must be a list of at most ${MAX_RECORD_OPS}`);
  let at = 8 + jsonBytes;
  const take = (n: number): Uint8Array => {
    if (at + n > bytes.length) bad('truncated');
    const b = bytes.slice(at, at + n);
    at += n;
    return b;
  };
  const optimizer = take(h.optimizerBytes);
  const anchorWeights = take(Math.max(0, h.anchorWeightsBytes));
  const end = hasEnd ? { weights: take(h.endWeightsBytes!), state: take(h.endStateBytes!) } : undefined;
  const ops: RoundOp[] = h.ops.map((o) => {
    if (typeof o !== 'object' || o === null || (o.kind !== 'forward' && o.kind !== 'backward')) bad('op kind malformed');
    if (typeof o.activationId !== 'string' || !HEX32.test(o.activationId)) bad('op activation id malformed');
    if (o.applied !== undefined && typeof o.applied !== 'boolean') bad('op applied malformed');
    if (o.loss !== undefined && !(typeof o.loss === 'number' && Number.isFinite(o.loss))) bad('op loss malformed');
    if (!isCount(o.inputBytes, MAX_RECORD_BYTES) || !(o.outputGradBytes === -1 || isCount(o.outputGradBytes, MAX_RECORD_BYTES)) || !(o.sentBytes === -1 || isCount(o.sentBytes, MAX_RECORD_BYTES))) {
      bad('op lengths malformed');
    }
    const input = take(o.inputBytes);
    const outputGrad = take(Math.max(0, o.outputGradBytes));
    const sent = take(Math.max(0, o.sentBytes));
    return {
      kind: o.kind,
      activationId: o.activationId,
      input,
      ...(o.outputGradBytes >= 0 ? { outputGrad } : {}),
      ...(o.sentBytes >= 0 ? { sent } : {}),
      ...(o.applied !== undefined ? { applied: o.applied } : {}),
      ...(o.loss !== undefined ? { loss: o.loss } : {}),
    };
  });
  if (at !== bytes.length) bad(`${bytes.length - at} trailing bytes`);
  return { runId: h.runId, minerId: h.minerId, stage: h.stage, anchorRound: h.anchorRound, anchorHash: h.anchorHash, ...(h.anchorWeightsBytes >= 0 ? { anchorWeights } : {}), optimizer, round: h.round, ops, ...(end ? { end } : {}) };
}

/**
 * A miner's records: the round in progress, and the last few finished ones
 * (an audit is chosen only after its round closed, and answered within a
 * deadline). Memory: RECORDS_KEPT finished rounds plus the current one, each
 * about (its microbatches × the boundary payloads in and out) + 8 bytes per
 * parameter of the stage's optimizer state + its anchor weights; on a backend other than the validator's, its
 * end state too (12 bytes per parameter, shared with the next round's start until a merge replaces it).
 */
export const RECORDS_KEPT = 3;
/**
 * Records of rounds drawn for an audit and not answered yet are kept beyond RECORDS_KEPT (an upload on a slow line can
 * outlast several rounds, and a record dropped before its turn to upload could never be answered), up to this many.
 */
export const RECORDS_PINNED = 8;

export class RoundRecorder {
  private current?: RoundRecord;
  private readonly finished: RoundRecord[] = [];
  /**
   * Which round's record is in progress, for the pipeline worker (PipelineWorkerOptions.round): a gradient takes a
   * step only if its forward ran in the same record, which is what an audit's replay expects of the record. It changes
   * exactly where a record begins (start, close) and goes back where a closed one goes on (reopen), so the worker's
   * steps follow the record's bounds whatever order the merge's messages come in.
   */
  serial = 0;
  private serials = 0;
  private closedSerial = 0;

  constructor(
    private readonly runId: number,
    private readonly minerId: string,
    readonly stage: number,
  ) {}

  /** The content hash of the round in progress's start optimizer state, when known (it was committed with merge-ready). */
  private currentOptimizerHash?: string;

  /**
   * A new round starts from these weights (their hash, and the bytes when known) and this optimizer state (a merge just
   * ended, or the stage was taken up), whose hash the caller may already hold.
   */
  start(anchorRound: number, anchorHash: string, optimizer: Uint8Array, anchorWeights?: Uint8Array, optimizerHash?: string): void {
    this.current = { runId: this.runId, minerId: this.minerId, stage: this.stage, anchorRound, anchorHash, ...(anchorWeights ? { anchorWeights } : {}), optimizer, round: 0, ops: [] };
    this.currentOptimizerHash = optimizerHash;
    this.serial = ++this.serials;
  }

  /** Records an op of the round in progress (none before start: a round not begun from known weights is not auditable). */
  add(op: RoundOp): void {
    if (!this.current) return;
    if (this.current.ops.length >= MAX_RECORD_OPS) {
      this.current = undefined; // past the bound: this round cannot be audited (and its audit fails as unanswered)
      return;
    }
    this.current.ops.push(op);
  }

  /** Where the round in progress began: the merge round of its start weights, their hash and its optimizer state's (committed with merge-ready, beside its end). */
  begun(): { round: number; hash: string; optimizerHash: string } | undefined {
    if (!this.current) return undefined;
    this.currentOptimizerHash ??= contentHash(this.current.optimizer);
    return { round: this.current.anchorRound, hash: this.current.anchorHash, optimizerHash: this.currentOptimizerHash };
  }

  /** The round in progress ended with `merge-ready` for this merge round (it goes on if the merge then does not happen for this miner). */
  ready(round: number): void {
    if (this.current) this.current.round = round;
  }

  /**
   * The round in progress ended with `merge-ready` for this merge round, committing to its end state: it is kept
   * whatever the merge then does (it may be drawn for an audit even when the miner's merge failed or never came),
   * and the next round goes on from that committed end state until a merge replaces it (start).
   */
  close(round: number, endHash: string, optimizer: Uint8Array, endWeights?: Uint8Array, keepEnd = false, optimizerHash?: string): void {
    if (!this.current) return;
    this.current.round = round;
    // Shared with the next round's start (no copy) until a merge replaces it.
    if (keepEnd && endWeights) this.current.end = { weights: endWeights, state: optimizer };
    this.closedSerial = this.serial;
    this.finish();
    this.start(round, endHash, optimizer, endWeights, optimizerHash);
  }

  /**
   * The coordinator did not take that `merge-ready`, or its answer never came: the round goes on as if it had not
   * been closed, from the anchor it began with, so its next commitment ends it and its work is in a record an audit
   * can draw. Not once the next round has work. The closed record is kept as well: a `merge-ready` whose answer was
   * lost may have been stored all the same (a coordinator stalled past the miner's wait), and an audit of that
   * round is then answered from it rather than failed unanswered.
   */
  reopen(round: number): boolean {
    const last = this.finished[this.finished.length - 1];
    if (!last || last.round !== round || !this.current || this.current.anchorRound !== round || this.current.ops.length > 0) return false;
    const { end: _uncommitted, ...reopened } = last;
    this.current = { ...reopened, ops: [...last.ops], round: 0 };
    this.currentOptimizerHash = undefined;
    this.serial = this.closedSerial;
    return true;
  }

  /** The merge went through: the round in progress is finished and kept. */
  finish(): void {
    if (!this.current || this.current.round === 0) return;
    this.finished.push(this.current);
    // The oldest go first, but not those pinned for an audit still to answer (at most RECORDS_PINNED of them).
    const pinned = (r: RoundRecord): boolean => this.pinned.has(r.round);
    while (this.finished.filter((r) => !pinned(r)).length > RECORDS_KEPT) this.finished.splice(this.finished.findIndex((r) => !pinned(r)), 1);
    while (this.finished.length > RECORDS_KEPT + RECORDS_PINNED) this.unpin(this.finished.shift()!.round);
    this.current = undefined;
  }

  /** The finished round that ended with the merge of `round`. */
  find(round: number): RoundRecord | undefined {
    return this.finished.find((r) => r.round === round);
  }

  private readonly pinned = new Set<number>();

  /** Keeps the record of `round` until unpinned (an audit of it is waiting its turn to upload); false when none is kept. */
  pin(round: number): boolean {
    if (!this.find(round)) return false;
    this.pinned.add(round);
    return true;
  }

  unpin(round: number): void {
    this.pinned.delete(round);
  }
}
