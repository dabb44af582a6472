/**
 * The payload of an activation message: what the next stage needs besides
 * the boundary tensor. Little-endian:
 *   0   u32  magic 'TAHM' (0x4d484154)
 *   4   u16  batch B
 *   6   u16  time T
 *   8   u8   pathway length P (miners the microbatch has passed, stage 0 first)
 *   9   3B   reserved, 0
 *   12  P × 32 bytes: each miner's id (its public key)
 *   then B u16 first input tokens (row i's input is [first_i, targets_i[0..T-2]])
 *   then B·T u16 target token ids (the last stage computes the loss with them)
 *   then the boundary tensor frame (codec.ts)
 * With the first tokens the payload names stage 0's whole input, so the
 * validator can replay stage 0 from bytes both ends of the transfer confirmed.
 * A gradient message's payload is just the boundary tensor frame.
 */
export const MICROBATCH_MAGIC = 0x4d484154;

export interface Microbatch {
  batch: number;
  time: number;
  pathway: string[];
  /** The first input token of each row [B]. */
  firstTokens: Int32Array;
  targets: Int32Array;
  frame: Uint8Array;
}

/** Stage 0's input [B·T] for a microbatch: each row's first token, then its targets shifted by one. */
export function microbatchInputs(m: Pick<Microbatch, 'batch' | 'time' | 'firstTokens' | 'targets'>): Int32Array {
  const inputs = new Int32Array(m.batch * m.time);
  for (let b = 0; b < m.batch; b++) {
    inputs[b * m.time] = m.firstTokens[b]!;
    inputs.set(m.targets.subarray(b * m.time, (b + 1) * m.time - 1), b * m.time + 1);
  }
  return inputs;
}

export class MicrobatchError extends Error {
  override name = 'MicrobatchError';
}

const ID_BYTES = 32;

export function encodeMicrobatch(m: Microbatch): Uint8Array {
  if (m.targets.length !== m.batch * m.time) throw new MicrobatchError('targets do not match batch × time');
  if (m.firstTokens.length !== m.batch) throw new MicrobatchError('one first token per row');
  const head = 12 + m.pathway.length * ID_BYTES + m.batch * 2;
  const out = new Uint8Array(head + m.targets.length * 2 + m.frame.length);
  const view = new DataView(out.buffer);
  view.setUint32(0, MICROBATCH_MAGIC, true);
  view.setUint16(4, m.batch, true);
  view.setUint16(6, m.time, true);
  view.setUint8(8, m.pathway.length);
  m.pathway.forEach((id, i) => {
    if (!/^[0-9a-f]{64}$/.test(id)) throw new MicrobatchError(`pathway id ${id} is not 32 bytes of hex`);
    for (let j = 0; j < ID_BYTES; j++) out[12 + i * ID_BYTES + j] = parseInt(id.slice(2 * j, 2 * j + 2), 16);
  });
  m.firstTokens.forEach((t, i) => view.setUint16(12 + m.pathway.length * ID_BYTES + 2 * i, t, true));
  m.targets.forEach((t, i) => view.setUint16(head + 2 * i, t, true));
  out.set(m.frame, head + m.targets.length * 2);
  return out;
}

export function decodeMicrobatch(bytes: Uint8Array, limits: { maxBatch: number; time: number; vocabSize: number; maxPathway: number }): Microbatch {
  if (bytes.length < 12) throw new MicrobatchError('truncated');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(0, true) !== MICROBATCH_MAGIC) throw new MicrobatchError('not a microbatch');
  const batch = view.getUint16(4, true);
  const time = view.getUint16(6, true);
  const p = view.getUint8(8);
  if (batch < 1 || batch > limits.maxBatch || time !== limits.time) throw new MicrobatchError(`shape [${batch}, ${time}] not allowed in this run`);
  if (p > limits.maxPathway) throw new MicrobatchError(`pathway of ${p}`);
  const head = 12 + p * ID_BYTES + batch * 2;
  const targetsEnd = head + batch * time * 2;
  if (bytes.length <= targetsEnd) throw new MicrobatchError('truncated');
  const pathway = Array.from({ length: p }, (_, i) =>
    Array.from(bytes.subarray(12 + i * ID_BYTES, 12 + (i + 1) * ID_BYTES), (b) => b.toString(16).padStart(2, '0')).join(''),
  );
  const firstTokens = new Int32Array(batch);
  for (let i = 0; i < batch; i++) {
    const t = view.getUint16(12 + p * ID_BYTES + 2 * i, true);
    if (t >= limits.vocabSize) throw new MicrobatchError(`input token ${t} outside the vocabulary`);
    firstTokens[i] = t;
  }
  const targets = new Int32Array(batch * time);
  for (let i = 0; i < targets.length; i++) {
    const t = view.getUint16(head + 2 * i, true);
    if (t >= limits.vocabSize) throw new MicrobatchError(`target ${t} outside the vocabulary`);
    targets[i] = t;
  }
  return { batch, time, pathway, firstTokens, targets, frame: bytes.slice(targetsEnd) };
}
