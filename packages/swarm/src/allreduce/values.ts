/**
 * How a slice of the pseudo-gradient travels in the all-reduce. A run setting:
 *   fp32    4 bytes per value;
 *   fp16    2 bytes per value + a 4-byte fp32 scale per block of 256 (values are
 *           divided by their block's largest magnitude, so no block under- or overflows);
 *   int8    1 byte per value + a 4-byte fp32 scale per block of 256 (round to nearest);
 *   topk32  the 32 largest of each block of 256, int8 under the block's scale, with
 *           their indices (sparse.ts; results as the reduction's non-zero values): 0.27 bytes a value;
 *   topk8   the 8 largest: 0.08 bytes a value.
 * Encoding is deterministic, so two owners that reduce the same inputs send the same bytes.
 * This file encodes the dense ones; codec.ts picks the encoding of each message by precision.
 */
export type DensePrecision = 'fp32' | 'fp16' | 'int8';
export type AllReducePrecision = DensePrecision | 'topk8' | 'topk32';

export const PRECISION_CODES: Record<AllReducePrecision, number> = { fp32: 0, fp16: 1, int8: 2, topk8: 3, topk32: 4 };
/** Values kept per block by the top-k precisions. */
export const TOP_K: Partial<Record<AllReducePrecision, number>> = { topk8: 8, topk32: 32 };
export const BLOCK = 256;

/** Encoded size of n values. */
export function encodedBytes(n: number, precision: DensePrecision): number {
  const blocks = Math.ceil(n / BLOCK);
  return precision === 'fp32' ? 4 * n : precision === 'fp16' ? 2 * n + 4 * blocks : n + 4 * blocks;
}

/** Bytes per value of a contribution, scales (and a top-k's indices) included, for a long vector: what a precision costs on the wire. */
export function bytesPerValue(precision: AllReducePrecision): number {
  const k = TOP_K[precision];
  if (k) return (4 + 2 * k) / BLOCK;
  return precision === 'fp32' ? 4 : precision === 'fp16' ? 2 + 4 / BLOCK : 1 + 4 / BLOCK;
}

export class ValuesError extends Error {
  override name = 'ValuesError';
  constructor(
    readonly code: 'BAD_LENGTH' | 'NOT_FINITE',
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float32 → IEEE half (round to nearest even), for |x| ≤ 1 after scaling. */
function toHalf(x: number): number {
  f32[0] = x;
  const bits = u32[0]!;
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  let mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let half = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    if (rem > mid || (rem === mid && half & 1)) half++;
    return sign | half;
  }
  let half = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && half & 1)) half++;
  return sign | half;
}

function fromHalf(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

export function encodeValues(values: Float32Array, precision: DensePrecision): Uint8Array {
  const n = values.length;
  const out = new Uint8Array(encodedBytes(n, precision));
  const view = new DataView(out.buffer);
  if (precision === 'fp32') {
    for (let i = 0; i < n; i++) view.setFloat32(4 * i, values[i]!, true);
    return out;
  }
  const blocks = Math.ceil(n / BLOCK);
  const dataStart = 4 * blocks;
  for (let b = 0; b < blocks; b++) {
    const lo = b * BLOCK;
    const hi = Math.min(n, lo + BLOCK);
    let max = 0;
    for (let i = lo; i < hi; i++) {
      const v = values[i]!;
      if (!Number.isFinite(v)) throw new ValuesError('NOT_FINITE', `value ${i} is ${v}`);
      max = Math.max(max, Math.abs(v));
    }
    const scale = Math.fround(precision === 'fp16' ? max : max / 127);
    view.setFloat32(4 * b, scale, true);
    for (let i = lo; i < hi; i++) {
      const q = scale === 0 ? 0 : values[i]! / scale;
      if (precision === 'fp16') view.setUint16(dataStart + 2 * i, toHalf(q), true);
      else view.setInt8(dataStart + i, Math.max(-127, Math.min(127, Math.round(q))));
    }
  }
  return out;
}

export function decodeValues(bytes: Uint8Array, n: number, precision: DensePrecision): Float32Array {
  if (bytes.length !== encodedBytes(n, precision)) throw new ValuesError('BAD_LENGTH', `${bytes.length} bytes for ${n} ${precision} values`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(n);
  if (precision === 'fp32') {
    for (let i = 0; i < n; i++) out[i] = view.getFloat32(4 * i, true);
  } else {
    const blocks = Math.ceil(n / BLOCK);
    const dataStart = 4 * blocks;
    for (let b = 0; b < blocks; b++) {
      const scale = view.getFloat32(4 * b, true);
      const hi = Math.min(n, (b + 1) * BLOCK);
      for (let i = b * BLOCK; i < hi; i++) {
        out[i] = scale * (precision === 'fp16' ? fromHalf(view.getUint16(dataStart + 2 * i, true)) : view.getInt8(dataStart + i));
      }
    }
  }
  for (let i = 0; i < n; i++) if (!Number.isFinite(out[i]!)) throw new ValuesError('NOT_FINITE', `value ${i} decodes to ${out[i]}`);
  return out;
}
