import { describe, expect, it } from 'vitest';
import { FRAME_FIXED_HEADER_BYTES, FrameError, MAX_CHUNK_BYTES, Reassembler, decodeChunk, encodeFrames, framedBytes, type FrameHeader } from './frames';

const header: FrameHeader = {
  kind: 'activation',
  runId: 7,
  epoch: 3,
  activationId: Uint8Array.from({ length: 16 }, (_, i) => i + 1),
  pathway: [4, 0, 9],
};

function payloadOf(length: number, seed = 1): Uint8Array {
  const out = new Uint8Array(length);
  let x = seed;
  for (let i = 0; i < length; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    out[i] = x >>> 24;
  }
  return out;
}

function expectFrameError(fn: () => unknown, code: string): void {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(FrameError);
    expect((e as FrameError).code).toBe(code);
    return;
  }
  throw new Error(`expected FrameError ${code}`);
}

describe('peer frames', () => {
  it('cut a message into chunks of at most 256 KiB and reassemble it exactly, in any order', () => {
    const payload = payloadOf(1_000_000);
    const chunks = encodeFrames(header, payload);
    expect(chunks.length).toBe(4);
    for (const c of chunks) expect(c.length).toBeLessThanOrEqual(MAX_CHUNK_BYTES);
    const r = new Reassembler();
    const order = [2, 0, 3, 1];
    const results = order.map((i) => r.push(chunks[i]!));
    expect(results.slice(0, 3)).toEqual([undefined, undefined, undefined]);
    const message = results[3]!;
    expect(message.payload).toEqual(payload);
    expect(message.pathway).toEqual(header.pathway);
    expect(message.activationId).toEqual(header.activationId);
    expect(message.kind).toBe('activation');
    expect(r.pendingMessages).toBe(0);
  });

  it('count their bytes on the wire as encodeFrames makes them (framedBytes: every chunk\'s header and the payload)', () => {
    for (const [size, max] of [[0, MAX_CHUNK_BYTES], [1, MAX_CHUNK_BYTES], [1_000_000, MAX_CHUNK_BYTES], [300, 200], [MAX_CHUNK_BYTES, MAX_CHUNK_BYTES]] as const) {
      const wire = encodeFrames(header, payloadOf(size), max).reduce((n, c) => n + c.length, 0);
      expect(framedBytes(size, header.pathway.length, max)).toBe(wire);
    }
  });

  it('carry an empty payload and interleaved messages', () => {
    const r = new Reassembler();
    const a = encodeFrames(header, payloadOf(300), 200);
    const b = encodeFrames({ ...header, kind: 'gradient' }, new Uint8Array(0));
    expect(r.push(a[0]!)).toBeUndefined();
    expect(r.push(b[0]!)!.payload.length).toBe(0);
    expect(r.push(a[1]!)).toBeUndefined();
    expect(r.push(a[2]!)!.payload).toEqual(payloadOf(300));
  });

  it('name every malformed chunk', () => {
    const [chunk] = encodeFrames(header, payloadOf(100));
    const mutate = (offset: number, value: number): Uint8Array => {
      const c = chunk!.slice();
      c[offset] = value;
      return c;
    };
    expectFrameError(() => decodeChunk(chunk!.slice(0, 10)), 'TRUNCATED');
    expectFrameError(() => decodeChunk(chunk!.slice(0, chunk!.length - 1)), 'TRUNCATED');
    expectFrameError(() => decodeChunk(mutate(0, 0)), 'BAD_MAGIC');
    expectFrameError(() => decodeChunk(mutate(4, 2)), 'BAD_VERSION');
    expectFrameError(() => decodeChunk(mutate(5, 9)), 'BAD_KIND');
    expectFrameError(() => decodeChunk(mutate(6, 200)), 'BAD_HEADER');
    expectFrameError(() => decodeChunk(mutate(7, 1)), 'BAD_HEADER');
    expectFrameError(() => decodeChunk(mutate(66, 0)), 'BAD_HEADER'); // zero chunks
    expectFrameError(() => decodeChunk(new Uint8Array(MAX_CHUNK_BYTES + 1)), 'TOO_LARGE');
    const big = chunk!.slice();
    new DataView(big.buffer).setUint32(68, 0xffffffff, true);
    expectFrameError(() => decodeChunk(big), 'TOO_LARGE');
  });

  it('refuse a payload that does not match its hash, and keep nothing of it', () => {
    const chunks = encodeFrames(header, payloadOf(500), 300);
    const bad = chunks[1]!.slice();
    bad[bad.length - 1]! ^= 0xff;
    expect(chunks.length).toBe(3);
    const r = new Reassembler();
    r.push(chunks[0]!);
    r.push(chunks[2]!);
    expectFrameError(() => r.push(bad), 'HASH_MISMATCH');
    expect(r.pendingMessages).toBe(0);
  });

  it('refuse duplicated or inconsistent chunks', () => {
    const chunks = encodeFrames(header, payloadOf(500), 300);
    const r = new Reassembler();
    r.push(chunks[0]!);
    expectFrameError(() => r.push(chunks[0]!), 'CHUNK_MISMATCH');
    const other = encodeFrames({ ...header, pathway: [1] }, payloadOf(500), 300);
    // Same id and hash, different pathway: a forged or confused sender.
    expectFrameError(() => r.push(other[1]!), 'CHUNK_MISMATCH');
  });

  it('drop messages that never complete, so partial bytes cannot pile up', () => {
    let now = 0;
    const r = new Reassembler({ timeoutMs: 1000, maxPendingBytes: 1000, now: () => now });
    const a = encodeFrames(header, payloadOf(800), 300);
    r.push(a[0]!);
    expect(r.pendingMessages).toBe(1);
    // A second large message does not fit beside it...
    const b = encodeFrames({ ...header, epoch: 4 }, payloadOf(800), 300);
    expectFrameError(() => r.push(b[0]!), 'TOO_LARGE');
    // ...until the first has timed out.
    now = 2000;
    expect(r.push(b[0]!)).toBeUndefined();
    expect(r.pendingMessages).toBe(1);
  });

  it('refuse headers it cannot encode', () => {
    expectFrameError(() => encodeFrames({ ...header, activationId: new Uint8Array(3) }, new Uint8Array(1)), 'BAD_HEADER');
    expectFrameError(() => encodeFrames({ ...header, pathway: new Array(40).fill(0) }, new Uint8Array(1)), 'BAD_HEADER');
    expectFrameError(() => encodeFrames({ ...header, kind: 'nope' as 'activation' }, new Uint8Array(1)), 'BAD_KIND');
    expectFrameError(() => encodeFrames(header, new Uint8Array(1), FRAME_FIXED_HEADER_BYTES), 'BAD_HEADER');
  });
});
