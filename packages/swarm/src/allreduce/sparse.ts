import { BLOCK } from './values';

/**
 * Compressed merge contributions (issue 45): a pseudo-gradient cut into the all-reduce's 256-value blocks, each
 * sent as its k largest magnitudes, with int8 values under one fp32 scale per block, and indices within the block.
 *
 *   contribution (top-k)  per block: f32 scale, k × u8 index (ascending), k × i8 value (−127…127)
 *                         k = min(K, the block's length): a fixed size for n values (topKBytes), so a
 *                         message claiming more values than its budget is the wrong length.
 *   result (sparse)       per block: u16 count c, f32 scale, c × u8 index (ascending), c × i8 value: a
 *                         reduction of top-k contributions is zero outside the union of their indices,
 *                         so an owner's result is as sparse as the replicas' contributions together.
 *                         A block with more non-zero values than half its length (many replicas whose
 *                         indices differ) is sent dense instead: c = DENSE_BLOCK, f32 scale, one i8 per
 *                         value, so a result never costs more than int8's 1 byte a value (+ 6 a block).
 *
 * Both are deterministic (ties in magnitude go to the lower index), so two owners that reduce the same inputs
 * send the same bytes. What a contribution leaves out is not lost: `ErrorFeedback` carries it into the next one.
 */
export class SparseError extends Error {
  override name = 'SparseError';
  constructor(
    readonly code: 'BAD_LENGTH' | 'BAD_INDEX' | 'OUT_OF_RANGE' | 'NOT_FINITE' | 'BAD_BUDGET',
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

const blockLength = (n: number, b: number): number => Math.min(BLOCK, n - b * BLOCK);

/** The count of a result block sent dense (every value, in order). */
export const DENSE_BLOCK = 0xffff;

function checkBudget(k: number): void {
  if (!Number.isInteger(k) || k < 1 || k > BLOCK) throw new SparseError('BAD_BUDGET', `k = ${k}: between 1 and ${BLOCK} values per block`);
}

/** Encoded size of n values, k kept per block. */
export function topKBytes(n: number, k: number): number {
  checkBudget(k);
  let bytes = 0;
  for (let b = 0; b * BLOCK < n; b++) bytes += 4 + 2 * Math.min(k, blockLength(n, b));
  return bytes;
}

/** The k indices of largest magnitude in values[lo, hi), ascending; ties to the lower index. */
function topIndices(values: Float32Array, lo: number, hi: number, k: number): number[] {
  const order = Array.from({ length: hi - lo }, (_, i) => i);
  order.sort((a, b) => Math.abs(values[lo + b]!) - Math.abs(values[lo + a]!) || a - b);
  return order.slice(0, k).sort((a, b) => a - b);
}

const quantize = (v: number, scale: number): number => (scale === 0 ? 0 : Math.max(-127, Math.min(127, Math.round(v / scale))));

export function encodeTopK(values: Float32Array, k: number): Uint8Array {
  const n = values.length;
  const out = new Uint8Array(topKBytes(n, k));
  const view = new DataView(out.buffer);
  let at = 0;
  for (let b = 0; b * BLOCK < n; b++) {
    const lo = b * BLOCK;
    const len = blockLength(n, b);
    for (let i = lo; i < lo + len; i++) if (!Number.isFinite(values[i]!)) throw new SparseError('NOT_FINITE', `value ${i} is ${values[i]}`);
    const kept = topIndices(values, lo, lo + len, Math.min(k, len));
    const scale = Math.fround(kept.reduce((m, i) => Math.max(m, Math.abs(values[lo + i]!)), 0) / 127);
    view.setFloat32(at, scale, true);
    kept.forEach((i, j) => {
      out[at + 4 + j] = i;
      view.setInt8(at + 4 + kept.length + j, quantize(values[lo + i]!, scale));
    });
    at += 4 + 2 * kept.length;
  }
  return out;
}

/** Reads one block's scale, indices and values at `at`, checking each; writes them into `out`. */
function readBlock(view: DataView, at: number, count: number, len: number, lo: number, out: Float32Array): void {
  const scale = view.getFloat32(at, true);
  if (!Number.isFinite(scale) || scale < 0) throw new SparseError('NOT_FINITE', `block ${lo / BLOCK}'s scale is ${scale}`);
  let previous = -1;
  for (let j = 0; j < count; j++) {
    const index = view.getUint8(at + 4 + j);
    if (index >= len || index <= previous) throw new SparseError('BAD_INDEX', `block ${lo / BLOCK}: index ${index} after ${previous} in a block of ${len}`);
    previous = index;
    const q = view.getInt8(at + 4 + count + j);
    if (q === -128) throw new SparseError('OUT_OF_RANGE', `block ${lo / BLOCK}: value −128`);
    out[lo + index] = scale * q;
  }
}

export function decodeTopK(bytes: Uint8Array, n: number, k: number): Float32Array {
  if (bytes.length !== topKBytes(n, k)) throw new SparseError('BAD_LENGTH', `${bytes.length} bytes for ${n} values at ${k} per block`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(n);
  let at = 0;
  for (let b = 0; b * BLOCK < n; b++) {
    const len = blockLength(n, b);
    const count = Math.min(k, len);
    readBlock(view, at, count, len, b * BLOCK, out);
    at += 4 + 2 * count;
  }
  return out;
}

/** A mostly-zero vector (an owner's reduction of top-k contributions) as its non-zero values, block by block. */
export function encodeSparse(values: Float32Array): Uint8Array {
  const n = values.length;
  const blocks: Array<{ kept: number[]; scale: number; lo: number; dense: boolean }> = [];
  let size = 0;
  for (let b = 0; b * BLOCK < n; b++) {
    const lo = b * BLOCK;
    const kept: number[] = [];
    let max = 0;
    for (let i = 0; i < blockLength(n, b); i++) {
      const v = values[lo + i]!;
      if (!Number.isFinite(v)) throw new SparseError('NOT_FINITE', `value ${lo + i} is ${v}`);
      if (v !== 0) kept.push(i), (max = Math.max(max, Math.abs(v)));
    }
    const dense = 2 * kept.length > blockLength(n, b);
    blocks.push({ kept, scale: Math.fround(max / 127), lo, dense });
    size += 6 + (dense ? blockLength(n, b) : 2 * kept.length);
  }
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  let at = 0;
  for (const [b, { kept, scale, lo, dense }] of blocks.entries()) {
    view.setFloat32(at + 2, scale, true);
    if (dense) {
      view.setUint16(at, DENSE_BLOCK, true);
      const len = blockLength(n, b);
      for (let i = 0; i < len; i++) view.setInt8(at + 6 + i, quantize(values[lo + i]!, scale));
      at += 6 + len;
      continue;
    }
    view.setUint16(at, kept.length, true);
    kept.forEach((i, j) => {
      out[at + 6 + j] = i;
      view.setInt8(at + 6 + kept.length + j, quantize(values[lo + i]!, scale));
    });
    at += 6 + 2 * kept.length;
  }
  return out;
}

export function decodeSparse(bytes: Uint8Array, n: number): Float32Array {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(n);
  let at = 0;
  for (let b = 0; b * BLOCK < n; b++) {
    const len = blockLength(n, b);
    if (at + 6 > bytes.length) throw new SparseError('BAD_LENGTH', `${bytes.length} bytes end inside block ${b} of ${Math.ceil(n / BLOCK)}`);
    const count = view.getUint16(at, true);
    if (count === DENSE_BLOCK) {
      if (at + 6 + len > bytes.length) throw new SparseError('BAD_LENGTH', `${bytes.length} bytes end inside dense block ${b}`);
      const scale = view.getFloat32(at + 2, true);
      if (!Number.isFinite(scale) || scale < 0) throw new SparseError('NOT_FINITE', `block ${b}'s scale is ${scale}`);
      for (let i = 0; i < len; i++) {
        const q = view.getInt8(at + 6 + i);
        if (q === -128) throw new SparseError('OUT_OF_RANGE', `block ${b}: value −128`);
        out[b * BLOCK + i] = scale * q;
      }
      at += 6 + len;
      continue;
    }
    if (count > len) throw new SparseError('BAD_INDEX', `block ${b} claims ${count} values of ${len}`);
    if (at + 6 + 2 * count > bytes.length) throw new SparseError('BAD_LENGTH', `${bytes.length} bytes end inside block ${b}`);
    readBlock(view, at + 2, count, len, b * BLOCK, out);
    at += 6 + 2 * count;
  }
  if (at !== bytes.length) throw new SparseError('BAD_LENGTH', `${bytes.length - at} bytes after the last block`);
  return out;
}

/**
 * Error feedback: what a replica's top-k contribution left out is added to its next one, so over rounds every part
 * of the pseudo-gradient is sent (a large value at once, a small one once it has accumulated).
 */
export class ErrorFeedback {
  residual: Float32Array;

  constructor(
    n: number,
    readonly k: number,
  ) {
    checkBudget(k);
    this.residual = new Float32Array(n);
  }

  /** The bytes to send for this round's pseudo-gradient, and what they decode to; keeps what was left out. */
  compress(pseudoGradient: Float32Array): { bytes: Uint8Array; sent: Float32Array } {
    const c = new Float32Array(pseudoGradient.length);
    for (let i = 0; i < c.length; i++) c[i] = pseudoGradient[i]! + this.residual[i]!;
    const bytes = encodeTopK(c, this.k);
    const sent = decodeTopK(bytes, c.length, this.k);
    for (let i = 0; i < c.length; i++) this.residual[i] = c[i]! - sent[i]!;
    return { bytes, sent };
  }
}
