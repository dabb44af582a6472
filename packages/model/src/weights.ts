import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex } from '@noble/hashes/utils';

/**
 * A stage's weights as bytes, for checkpoints, late joiners and all-reduce.
 * Layout, little-endian:
 *   0  u32  magic 'TAHW' (0x57484154)
 *   4  u8   version (1), then 3 reserved zero bytes
 *   8  u32  header length H
 *   12      header: UTF-8 JSON [{ name, shape }], in the stage's parameter order
 *   12+H    zero padding to a multiple of 4
 *   then    every tensor's float32 values, in header order
 * The content hash is the SHA-256 of these bytes.
 */
export const WEIGHTS_MAGIC = 0x57484154;
export const WEIGHTS_VERSION = 1;
const MAX_HEADER_BYTES = 1 << 20;

export interface NamedTensor {
  name: string;
  shape: number[];
  data: Float32Array;
}

export class WeightsError extends Error {
  override name = 'WeightsError';
}

export function serializeWeights(tensors: NamedTensor[]): Uint8Array {
  const header = new TextEncoder().encode(JSON.stringify(tensors.map(({ name, shape }) => ({ name, shape }))));
  const dataOffset = align4(12 + header.length);
  const total = dataOffset + tensors.reduce((n, t) => n + t.data.length * 4, 0);
  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  view.setUint32(0, WEIGHTS_MAGIC, true);
  view.setUint8(4, WEIGHTS_VERSION);
  view.setUint32(8, header.length, true);
  out.set(header, 12);
  let offset = dataOffset;
  for (const t of tensors) {
    if (t.data.length !== t.shape.reduce((a, b) => a * b, 1)) throw new WeightsError(`${t.name}: ${t.data.length} values for shape [${t.shape}]`);
    for (let i = 0; i < t.data.length; i++, offset += 4) view.setFloat32(offset, t.data[i]!, true);
  }
  return out;
}

export function deserializeWeights(bytes: Uint8Array): NamedTensor[] {
  if (bytes.length < 12) throw new WeightsError(`truncated: ${bytes.length} bytes`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(0, true) !== WEIGHTS_MAGIC) throw new WeightsError('not a weights blob (bad magic)');
  if (view.getUint8(4) !== WEIGHTS_VERSION) throw new WeightsError(`unknown weights version ${view.getUint8(4)}`);
  const headerLength = view.getUint32(8, true);
  if (headerLength > MAX_HEADER_BYTES || 12 + headerLength > bytes.length) throw new WeightsError(`bad header length ${headerLength}`);
  let entries: Array<{ name: string; shape: number[] }>;
  try {
    entries = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(12, 12 + headerLength)));
  } catch {
    throw new WeightsError('header is not valid JSON');
  }
  if (!Array.isArray(entries)) throw new WeightsError('header is not a list');
  let offset = align4(12 + headerLength);
  const out: NamedTensor[] = [];
  for (const e of entries) {
    if (typeof e?.name !== 'string' || !Array.isArray(e.shape) || !e.shape.every((s) => Number.isInteger(s) && s > 0 && s < 1 << 24)) {
      throw new WeightsError('header entry is malformed');
    }
    const size = e.shape.reduce((a: number, b: number) => a * b, 1);
    if (offset + size * 4 > bytes.length) throw new WeightsError(`truncated in ${e.name}`);
    const data = new Float32Array(size);
    for (let i = 0; i < size; i++, offset += 4) {
      const v = view.getFloat32(offset, true);
      if (!Number.isFinite(v)) throw new WeightsError(`${e.name}[${i}] is not finite`);
      data[i] = v;
    }
    out.push({ name: e.name, shape: e.shape, data });
  }
  if (offset !== bytes.length) throw new WeightsError(`${bytes.length - offset} trailing bytes`);
  return out;
}

export function contentHash(bytes: Uint8Array): string {
  return bytesToHex(sha256(bytes));
}

function align4(n: number): number {
  return (n + 3) & ~3;
}
