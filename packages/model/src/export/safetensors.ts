import type { NamedTensor } from '../weights';

/**
 * The safetensors format (huggingface/safetensors, its README's spec): an 8-byte little-endian header length, a
 * JSON header naming each tensor's dtype, shape and byte range (and `__metadata__`, strings only), then the
 * tensors' bytes back to back. The header is padded with spaces to a multiple of 8 so that the data is aligned.
 * Only F32 is written: the run's weights are fp32.
 */
export function writeSafetensors(tensors: readonly NamedTensor[], metadata: Record<string, string> = {}): Uint8Array {
  const header: Record<string, unknown> = { __metadata__: metadata };
  let offset = 0;
  for (const t of tensors) {
    const bytes = t.data.length * 4;
    header[t.name] = { dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - ((8 + new TextEncoder().encode(json).length) % 8)) % 8);
  const head = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + head.length + offset);
  const view = new DataView(out.buffer);
  view.setBigUint64(0, BigInt(head.length), true);
  out.set(head, 8);
  let at = 8 + head.length;
  for (const t of tensors) {
    for (let i = 0; i < t.data.length; i++, at += 4) view.setFloat32(at, t.data[i]!, true);
  }
  return out;
}

export class SafetensorsError extends Error {
  override name = 'SafetensorsError';
}

/** Reads an F32 safetensors file back (what the export's own checks use). */
export function readSafetensors(bytes: Uint8Array): { tensors: NamedTensor[]; metadata: Record<string, string> } {
  if (bytes.length < 8) throw new SafetensorsError('truncated header length');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const length = Number(view.getBigUint64(0, true));
  if (8 + length > bytes.length) throw new SafetensorsError(`header of ${length} bytes overruns the file`);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + length))) as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
  const base = 8 + length;
  const tensors: NamedTensor[] = [];
  for (const [name, e] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    if (e.dtype !== 'F32') throw new SafetensorsError(`${name}: dtype ${e.dtype}, only F32 is read`);
    const [from, to] = e.data_offsets;
    const data = new Float32Array(bytes.slice(base + from, base + to).buffer);
    tensors.push({ name, shape: e.shape, data });
  }
  return { tensors, metadata: (header.__metadata__ as unknown as Record<string, string>) ?? {} };
}
