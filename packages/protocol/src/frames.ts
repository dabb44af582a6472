import { sha256 } from '@noble/hashes/sha256';

/**
 * Binary frames between peers: activations going forward, their gradients
 * going back, and weight partitions in the all-reduce. A message (one
 * encoded boundary tensor, one partition) is cut into chunks that each fit
 * one data-channel message (≤ 256 KiB, header included); every chunk
 * carries the whole header, so the receiver can route and check it alone.
 *
 * Chunk layout, little-endian, 80-byte header then the chunk's payload:
 *   0   u32  magic 'TAHF' (0x46484154)
 *   4   u8   version (1)
 *   5   u8   kind: 1 activation, 2 gradient, 3 partition
 *   6   u8   pathway length P (0..MAX_PATHWAY)
 *   7   u8   reserved, 0
 *   8   u32  run id
 *   12  u32  epoch
 *   16  16B  activation id (or partition id): opaque bytes
 *   32  32B  SHA-256 of the whole message payload (all chunks joined)
 *   64  u16  chunk index
 *   66  u16  chunk count
 *   68  u32  whole payload length in bytes
 *   72  u32  this chunk's payload length
 *   76  u32  reserved, 0
 *   80  P × u32 pathway: the miner slot of each stage the microbatch has passed
 *   80 + 4P  payload bytes
 */

export const FRAME_MAGIC = 0x46484154;
export const FRAME_VERSION = 1;
export const FRAME_FIXED_HEADER_BYTES = 80;
/** A data channel rejects messages over 256 KiB. */
export const MAX_CHUNK_BYTES = 256 * 1024;
export const MAX_PATHWAY = 32;
/** The largest message reassembled (a stage's weight partition or one boundary tensor). */
export const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

export const FRAME_KINDS = { activation: 1, gradient: 2, partition: 3 } as const;
export type FrameKind = keyof typeof FRAME_KINDS;

export interface FrameHeader {
  kind: FrameKind;
  runId: number;
  epoch: number;
  /** 16 opaque bytes naming the microbatch (or the partition). */
  activationId: Uint8Array;
  pathway: number[];
}

export interface Chunk extends FrameHeader {
  payloadHash: Uint8Array;
  chunkIndex: number;
  chunkCount: number;
  totalBytes: number;
  payload: Uint8Array;
}

export type FrameErrorCode =
  | 'TRUNCATED'
  | 'BAD_MAGIC'
  | 'BAD_VERSION'
  | 'BAD_KIND'
  | 'BAD_HEADER'
  | 'TOO_LARGE'
  | 'CHUNK_MISMATCH'
  | 'HASH_MISMATCH';

export class FrameError extends Error {
  override name = 'FrameError';
  constructor(
    readonly code: FrameErrorCode,
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

function headerBytes(pathwayLength: number): number {
  return FRAME_FIXED_HEADER_BYTES + 4 * pathwayLength;
}

function checkHeader(h: FrameHeader): void {
  if (!(h.kind in FRAME_KINDS)) throw new FrameError('BAD_KIND', `unknown kind ${String(h.kind)}`);
  if (!Number.isInteger(h.runId) || h.runId < 0 || h.runId > 0xffffffff) throw new FrameError('BAD_HEADER', 'run id must be a u32');
  if (!Number.isInteger(h.epoch) || h.epoch < 0 || h.epoch > 0xffffffff) throw new FrameError('BAD_HEADER', 'epoch must be a u32');
  if (!(h.activationId instanceof Uint8Array) || h.activationId.length !== 16) throw new FrameError('BAD_HEADER', 'activation id must be 16 bytes');
  if (h.pathway.length > MAX_PATHWAY || h.pathway.some((p) => !Number.isInteger(p) || p < 0 || p > 0xffffffff)) {
    throw new FrameError('BAD_HEADER', `pathway must be at most ${MAX_PATHWAY} u32 slots`);
  }
}

/** Hex SHA-256 of a message payload: what both ends of a transfer confirm. */
export function payloadHashHex(payload: Uint8Array): string {
  return hex(sha256(payload));
}

/** What encodeFrames makes of a payload this long, in bytes on the wire: the payload and every chunk's header. */
export function framedBytes(payloadBytes: number, pathwayLength: number, maxChunkBytes = MAX_CHUNK_BYTES): number {
  const head = headerBytes(pathwayLength);
  const room = Math.min(maxChunkBytes, MAX_CHUNK_BYTES) - head;
  return payloadBytes + head * Math.max(1, Math.ceil(payloadBytes / room));
}

/** Cuts one message into chunks of at most maxChunkBytes (header included). */
export function encodeFrames(header: FrameHeader, payload: Uint8Array, maxChunkBytes = MAX_CHUNK_BYTES): Uint8Array[] {
  checkHeader(header);
  if (payload.length > MAX_MESSAGE_BYTES) throw new FrameError('TOO_LARGE', `${payload.length} bytes exceed ${MAX_MESSAGE_BYTES}`);
  const head = headerBytes(header.pathway.length);
  const room = Math.min(maxChunkBytes, MAX_CHUNK_BYTES) - head;
  if (room < 1) throw new FrameError('BAD_HEADER', 'chunk size leaves no room for payload');
  const chunkCount = Math.max(1, Math.ceil(payload.length / room));
  if (chunkCount > 0xffff) throw new FrameError('TOO_LARGE', `${chunkCount} chunks`);
  const hash = sha256(payload);
  const chunks: Uint8Array[] = [];
  for (let i = 0; i < chunkCount; i++) {
    const part = payload.subarray(i * room, Math.min(payload.length, (i + 1) * room));
    const out = new Uint8Array(head + part.length);
    const view = new DataView(out.buffer);
    view.setUint32(0, FRAME_MAGIC, true);
    view.setUint8(4, FRAME_VERSION);
    view.setUint8(5, FRAME_KINDS[header.kind]);
    view.setUint8(6, header.pathway.length);
    view.setUint32(8, header.runId, true);
    view.setUint32(12, header.epoch, true);
    out.set(header.activationId, 16);
    out.set(hash, 32);
    view.setUint16(64, i, true);
    view.setUint16(66, chunkCount, true);
    view.setUint32(68, payload.length, true);
    view.setUint32(72, part.length, true);
    header.pathway.forEach((p, j) => view.setUint32(FRAME_FIXED_HEADER_BYTES + 4 * j, p, true));
    out.set(part, head);
    chunks.push(out);
  }
  return chunks;
}

/** Parses and checks one chunk; throws a FrameError naming what is wrong. */
export function decodeChunk(bytes: Uint8Array): Chunk {
  if (!(bytes instanceof Uint8Array)) throw new FrameError('BAD_HEADER', 'a chunk must be bytes');
  if (bytes.length < FRAME_FIXED_HEADER_BYTES) throw new FrameError('TRUNCATED', `${bytes.length} bytes`);
  if (bytes.length > MAX_CHUNK_BYTES) throw new FrameError('TOO_LARGE', `chunk of ${bytes.length} bytes`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(0, true) !== FRAME_MAGIC) throw new FrameError('BAD_MAGIC', 'not a peer frame');
  if (view.getUint8(4) !== FRAME_VERSION) throw new FrameError('BAD_VERSION', `version ${view.getUint8(4)}`);
  const kindCode = view.getUint8(5);
  const kind = (Object.keys(FRAME_KINDS) as FrameKind[]).find((k) => FRAME_KINDS[k] === kindCode);
  if (!kind) throw new FrameError('BAD_KIND', `kind ${kindCode}`);
  const pathwayLength = view.getUint8(6);
  if (pathwayLength > MAX_PATHWAY) throw new FrameError('BAD_HEADER', `pathway of ${pathwayLength}`);
  if (view.getUint8(7) !== 0 || view.getUint32(76, true) !== 0) throw new FrameError('BAD_HEADER', 'reserved bits are set');
  const head = headerBytes(pathwayLength);
  if (bytes.length < head) throw new FrameError('TRUNCATED', 'pathway cut short');
  const chunkIndex = view.getUint16(64, true);
  const chunkCount = view.getUint16(66, true);
  const totalBytes = view.getUint32(68, true);
  const chunkBytes = view.getUint32(72, true);
  if (chunkCount < 1 || chunkIndex >= chunkCount) throw new FrameError('BAD_HEADER', `chunk ${chunkIndex} of ${chunkCount}`);
  if (totalBytes > MAX_MESSAGE_BYTES) throw new FrameError('TOO_LARGE', `message of ${totalBytes} bytes`);
  if (bytes.length !== head + chunkBytes) throw new FrameError('TRUNCATED', `${bytes.length - head} payload bytes, header says ${chunkBytes}`);
  const pathway = Array.from({ length: pathwayLength }, (_, j) => view.getUint32(FRAME_FIXED_HEADER_BYTES + 4 * j, true));
  return {
    kind,
    runId: view.getUint32(8, true),
    epoch: view.getUint32(12, true),
    activationId: bytes.slice(16, 32),
    payloadHash: bytes.slice(32, 64),
    chunkIndex,
    chunkCount,
    totalBytes,
    pathway,
    payload: bytes.slice(head),
  };
}

const hex = (b: Uint8Array): string => Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');

export interface AssembledMessage extends FrameHeader {
  payload: Uint8Array;
  /** Hex SHA-256 of the payload, checked. */
  payloadHash: string;
}

/**
 * Reassembles chunks into messages, checking that every chunk of a message
 * agrees on its header and that the joined payload matches its hash. A
 * message that is never completed is dropped after `timeoutMs` (the sender
 * died or the channel closed), so partial messages cannot pile up.
 */
export class Reassembler {
  private readonly pending = new Map<string, { first: Chunk; parts: Array<Uint8Array | undefined>; received: number; bytes: number; startedAt: number }>();
  private pendingBytes = 0;

  constructor(
    private readonly options: { timeoutMs?: number; maxPendingBytes?: number; now?: () => number } = {},
  ) {}

  /** Adds one chunk; returns the message when it is complete, else undefined. Throws FrameError on bad input (nothing is kept). */
  push(bytes: Uint8Array): AssembledMessage | undefined {
    const chunk = decodeChunk(bytes);
    const now = this.options.now?.() ?? Date.now();
    this.expire(now);
    const key = `${chunk.kind}:${chunk.runId}:${chunk.epoch}:${hex(chunk.activationId)}:${hex(chunk.payloadHash)}`;
    let entry = this.pending.get(key);
    if (!entry) {
      if (chunk.totalBytes > (this.options.maxPendingBytes ?? MAX_MESSAGE_BYTES) - this.pendingBytes) {
        throw new FrameError('TOO_LARGE', 'too many bytes waiting for reassembly');
      }
      entry = { first: chunk, parts: new Array(chunk.chunkCount), received: 0, bytes: 0, startedAt: now };
    } else if (
      entry.first.chunkCount !== chunk.chunkCount ||
      entry.first.totalBytes !== chunk.totalBytes ||
      entry.first.pathway.join() !== chunk.pathway.join()
    ) {
      throw new FrameError('CHUNK_MISMATCH', 'chunk disagrees with the rest of its message');
    }
    if (entry.parts[chunk.chunkIndex]) throw new FrameError('CHUNK_MISMATCH', `chunk ${chunk.chunkIndex} arrived twice`);
    if (entry.bytes + chunk.payload.length > chunk.totalBytes) throw new FrameError('CHUNK_MISMATCH', 'more payload than the header announced');
    if (!this.pending.has(key)) {
      this.pending.set(key, entry);
      this.pendingBytes += chunk.totalBytes;
    }
    entry.parts[chunk.chunkIndex] = chunk.payload;
    entry.received++;
    entry.bytes += chunk.payload.length;
    if (entry.received < chunk.chunkCount) return undefined;

    this.pending.delete(key);
    this.pendingBytes -= chunk.totalBytes;
    if (entry.bytes !== chunk.totalBytes) throw new FrameError('CHUNK_MISMATCH', `${entry.bytes} payload bytes, header says ${chunk.totalBytes}`);
    const payload = new Uint8Array(chunk.totalBytes);
    let offset = 0;
    for (const p of entry.parts) {
      payload.set(p!, offset);
      offset += p!.length;
    }
    const digest = sha256(payload);
    if (hex(digest) !== hex(chunk.payloadHash)) throw new FrameError('HASH_MISMATCH', 'payload does not match its hash');
    const { kind, runId, epoch, activationId, pathway } = entry.first;
    return { kind, runId, epoch, activationId, pathway, payload, payloadHash: hex(digest) };
  }

  /** Messages still waiting for chunks. */
  get pendingMessages(): number {
    return this.pending.size;
  }

  private expire(now: number): void {
    const timeoutMs = this.options.timeoutMs ?? 30_000;
    for (const [key, entry] of this.pending) {
      if (now - entry.startedAt > timeoutMs) {
        this.pending.delete(key);
        this.pendingBytes -= entry.first.totalBytes;
      }
    }
  }
}
