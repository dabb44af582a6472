import { decodeSparse, decodeTopK, encodeSparse, encodeTopK, topKBytes } from './sparse';
import { TOP_K, decodeValues, encodeValues, encodedBytes, type AllReducePrecision, type DensePrecision } from './values';

/**
 * How each message of a merge round carries values, by the round's precision (values.ts). A dense precision
 * sends contributions and results alike (encodeValues). A top-k one (sparse.ts) sends each contribution as the
 * k largest of each 256-value block, a fixed size, and each owner's result as the non-zero values of the reduction
 * (zero outside the union of the contributions' indices). What a contribution leaves out is not sent at all:
 * bench:merge measured top-32 of 256 without error feedback at a held-out loss no worse than fp16's dense merge,
 * and error feedback worse (bench/results/merge.json), so no private state crosses a round.
 */
export const topKOf = (precision: AllReducePrecision): number | undefined => TOP_K[precision];

/**
 * The precision a round of `mode` runs at: weights themselves (an 'average' round, a newcomer joined) are never
 * sparsified, so a top-k run averages them at fp16. The coordinator names it in merge-go; the replicas commit to it.
 */
export function roundPrecision(precision: AllReducePrecision, mode: 'outer' | 'average'): AllReducePrecision {
  return mode === 'average' && topKOf(precision) ? 'fp16' : precision;
}

/** Bytes of a contribution of n values: a fixed size at every precision (a message of another length is refused). */
export function contributionBytes(n: number, precision: AllReducePrecision): number {
  const k = topKOf(precision);
  return k ? topKBytes(n, k) : encodedBytes(n, precision as DensePrecision);
}

export function encodeContribution(values: Float32Array, precision: AllReducePrecision): Uint8Array {
  const k = topKOf(precision);
  return k ? encodeTopK(values, k) : encodeValues(values, precision as DensePrecision);
}

/** Throws a named ValuesError or SparseError on a malformed contribution. */
export function decodeContribution(bytes: Uint8Array, n: number, precision: AllReducePrecision): Float32Array {
  const k = topKOf(precision);
  return k ? decodeTopK(bytes, n, k) : decodeValues(bytes, n, precision as DensePrecision);
}

export function encodeResult(values: Float32Array, precision: AllReducePrecision): Uint8Array {
  return topKOf(precision) ? encodeSparse(values) : encodeValues(values, precision as DensePrecision);
}

/** Throws a named ValuesError or SparseError on a malformed result. */
export function decodeResult(bytes: Uint8Array, n: number, precision: AllReducePrecision): Float32Array {
  return topKOf(precision) ? decodeSparse(bytes, n) : decodeValues(bytes, n, precision as DensePrecision);
}
