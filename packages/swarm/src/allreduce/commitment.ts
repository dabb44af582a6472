import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex } from '@noble/hashes/utils';
import { contributionBytes, encodeContribution, topKOf } from './codec';
import { BLOCK, type AllReducePrecision } from './values';

/**
 * A replica's merge contribution, committed before the all-reduce: the Merkle
 * root of its encoded blocks. Sent with `merge-ready` (before anyone knows
 * the partition map, or whether the round will be audited), relayed to every
 * participant in `merge-go`; each contribution slice then travels with a
 * range proof, and the partition's owner checks the slice it received
 * against the sender's root (butterfly.ts, COMMITMENT_MISMATCH). An audit
 * compares the root with the contribution its replay leads to.
 *
 * Leaves are the vector's blocks of BLOCK values as a contribution encodes them
 * (codec.ts: each block carries its own scale; a top-k block its own indices, and
 * is contiguous on the wire), so an owner hashes its slice's blocks
 * straight from the bytes it received: partitions are cut on block
 * boundaries (partition.ts, `align`). leaf = sha256(0x00 ‖ block bytes),
 * node = sha256(0x01 ‖ left ‖ right); a last node without a sibling is
 * carried up unchanged.
 */

export const HASH_BYTES = 32;
/** Most hashes a range proof of a contiguous range holds: two per level of a tree of 2^32 leaves. */
export const MAX_PROOF_HASHES = 64;

const leafHash = (block: Uint8Array): Uint8Array => {
  const b = new Uint8Array(block.length + 1);
  b.set(block, 1);
  return sha256(b);
};

const nodeHash = (left: Uint8Array, right: Uint8Array): Uint8Array => {
  const b = new Uint8Array(1 + 2 * HASH_BYTES);
  b[0] = 1;
  b.set(left, 1);
  b.set(right, 1 + HASH_BYTES);
  return sha256(b);
};

/** The leaf hashes of an encoded slice of n values (whose blocks start at a block boundary of the whole vector). */
export function blockLeaves(raw: Uint8Array, n: number, precision: AllReducePrecision): Uint8Array[] {
  if (raw.length !== contributionBytes(n, precision)) throw new RangeError(`${raw.length} bytes for ${n} ${precision} values`);
  const blocks = Math.ceil(n / BLOCK);
  const leaves: Uint8Array[] = [];
  const k = topKOf(precision);
  for (let b = 0, at = 0; b < blocks; b++) {
    const lo = b * BLOCK;
    const hi = Math.min(n, lo + BLOCK);
    if (k) {
      const size = 4 + 2 * Math.min(k, hi - lo);
      leaves.push(leafHash(raw.subarray(at, at + size)));
      at += size;
      continue;
    }
    if (precision === 'fp32') {
      leaves.push(leafHash(raw.subarray(4 * lo, 4 * hi)));
      continue;
    }
    const width = precision === 'fp16' ? 2 : 1;
    const data = 4 * blocks;
    const block = new Uint8Array(4 + width * (hi - lo));
    block.set(raw.subarray(4 * b, 4 * b + 4), 0);
    block.set(raw.subarray(data + width * lo, data + width * hi), 4);
    leaves.push(leafHash(block));
  }
  return leaves;
}

function parents(level: Uint8Array[]): Uint8Array[] {
  const up: Uint8Array[] = [];
  for (let i = 0; i < level.length; i += 2) up.push(i + 1 < level.length ? nodeHash(level[i]!, level[i + 1]!) : level[i]!);
  return up;
}

export function merkleRoot(leaves: Uint8Array[]): string {
  if (leaves.length === 0) throw new RangeError('no leaves');
  let level = leaves;
  while (level.length > 1) level = parents(level);
  return bytesToHex(level[0]!);
}

/** A contribution's commitment: the root of its encoded blocks. */
export function contributionRoot(values: Float32Array, precision: AllReducePrecision): string {
  return merkleRoot(blockLeaves(encodeContribution(values, precision), values.length, precision));
}

/** The hashes that, with leaves [from, to), recompute the root: at each level the left neighbour of the range's start, then the right neighbour of its end, where the range needs them. */
export function rangeProof(leaves: Uint8Array[], from: number, to: number): Uint8Array[] {
  if (!(from >= 0 && from < to && to <= leaves.length)) throw new RangeError(`range [${from}, ${to}) of ${leaves.length} leaves`);
  const proof: Uint8Array[] = [];
  let level = leaves;
  let lo = from;
  let hi = to - 1;
  while (level.length > 1) {
    if (lo % 2 === 1) proof.push(level[lo - 1]!);
    if (hi % 2 === 0 && hi + 1 < level.length) proof.push(level[hi + 1]!);
    level = parents(level);
    lo >>= 1;
    hi >>= 1;
  }
  return proof;
}

/** Whether leaves [from, from + leaves.length) of a tree of `total` leaves, with `proof`, lead to `root`. */
export function verifyRange(leaves: Uint8Array[], from: number, total: number, proof: Uint8Array[], root: string): boolean {
  if (leaves.length === 0 || from < 0 || from + leaves.length > total) return false;
  let nodes = leaves;
  let lo = from;
  let size = total;
  let k = 0;
  while (size > 1) {
    let start = lo;
    if (start % 2 === 1) {
      if (k >= proof.length) return false;
      nodes = [proof[k++]!, ...nodes];
      start--;
    }
    const end = start + nodes.length - 1;
    if (end % 2 === 0 && end + 1 < size) {
      if (k >= proof.length) return false;
      nodes = [...nodes, proof[k++]!];
    }
    nodes = parents(nodes);
    lo = start >> 1;
    size = Math.ceil(size / 2);
  }
  return k === proof.length && nodes.length === 1 && bytesToHex(nodes[0]!) === root;
}

/** A proof on the wire: its hashes back to back. */
export function encodeProof(proof: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(proof.length * HASH_BYTES);
  proof.forEach((h, i) => out.set(h, i * HASH_BYTES));
  return out;
}

export function decodeProof(bytes: Uint8Array): Uint8Array[] | undefined {
  if (bytes.length % HASH_BYTES !== 0 || bytes.length / HASH_BYTES > MAX_PROOF_HASHES) return undefined;
  return Array.from({ length: bytes.length / HASH_BYTES }, (_, i) => bytes.subarray(i * HASH_BYTES, (i + 1) * HASH_BYTES));
}

