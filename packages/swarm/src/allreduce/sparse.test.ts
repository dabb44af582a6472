import { describe, expect, it } from 'vitest';
import { mulberry32 } from '@train-at-home/model';
import { BLOCK } from './values';
import { DENSE_BLOCK, ErrorFeedback, SparseError, decodeSparse, decodeTopK, encodeSparse, encodeTopK, topKBytes } from './sparse';

const random = (n: number, seed: number): Float32Array => {
  const r = mulberry32(seed);
  return Float32Array.from({ length: n }, () => (r() - 0.5) * (r() < 0.05 ? 10 : 1));
};

function code(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(SparseError);
    return (e as SparseError).code;
  }
  return 'accepted';
}

describe('top-k merge contributions', () => {
  it('keep each block\'s k largest magnitudes within int8 precision of their block, zero elsewhere, in a fixed budget', () => {
    const n = 3 * BLOCK + 40;
    const x = random(n, 1);
    for (const k of [1, 8, 64]) {
      const bytes = encodeTopK(x, k);
      // Per block a 4-byte scale and k (index, value) pairs; the short last block keeps min(k, 40).
      expect(bytes.length).toBe(topKBytes(n, k));
      expect(bytes.length).toBe(3 * (4 + 2 * k) + 4 + 2 * Math.min(k, 40));
      const y = decodeTopK(bytes, n, k);
      for (let b = 0; b * BLOCK < n; b++) {
        const lo = b * BLOCK;
        const block = Array.from(x.subarray(lo, Math.min(n, lo + BLOCK)));
        const kept = block.map((v, i) => [Math.abs(v), i] as const).sort((a, c) => c[0] - a[0] || a[1] - c[1]).slice(0, k).map(([, i]) => i);
        const scale = Math.max(...kept.map((i) => Math.abs(block[i]!))) / 127;
        block.forEach((v, i) => {
          if (kept.includes(i)) expect(Math.abs(y[lo + i]! - v)).toBeLessThanOrEqual(scale / 2 + 1e-6);
          else expect(y[lo + i]).toBe(0);
        });
      }
    }
  });

  it('are deterministic: equal inputs give equal bytes, ties go to the lower index', () => {
    const x = random(1000, 2);
    expect(encodeTopK(x, 8)).toEqual(encodeTopK(Float32Array.from(x), 8));
    const ties = new Float32Array(BLOCK).fill(1);
    const y = decodeTopK(encodeTopK(ties, 3), BLOCK, 3);
    expect([...y.subarray(0, 4)]).toEqual([1, 1, 1, 0]);
    expect(decodeTopK(encodeTopK(new Float32Array(BLOCK), 4), BLOCK, 4)).toEqual(new Float32Array(BLOCK));
  });

  it('with error feedback send every part of a pseudo-gradient over rounds: what was left out is carried, not lost', () => {
    const n = 4 * BLOCK;
    const g = random(n, 3);
    const ef = new ErrorFeedback(n, 8);
    const total = new Float32Array(n);
    const rounds = 320;
    for (let r = 0; r < rounds; r++) {
      const { bytes, sent } = ef.compress(g);
      expect(bytes.length).toBe(topKBytes(n, 8));
      for (let i = 0; i < n; i++) total[i]! += sent[i]!;
      // What was sent plus what is carried is everything so far.
      for (let i = 0; i < n; i += 97) expect(Math.abs(total[i]! + ef.residual[i]! - (r + 1) * g[i]!)).toBeLessThan(1e-3 * (r + 1));
    }
    // Averaged over the rounds, what went out is the pseudo-gradient itself (without feedback, the small values never go).
    let err = 0;
    let norm = 0;
    for (let i = 0; i < n; i++) (err += (total[i]! / rounds - g[i]!) ** 2), (norm += g[i]! ** 2);
    expect(Math.sqrt(err / norm)).toBeLessThan(0.1);
    const once = decodeTopK(encodeTopK(g, 8), n, 8);
    let lost = 0;
    for (let i = 0; i < n; i++) lost += (once[i]! - g[i]!) ** 2;
    expect(Math.sqrt(lost / norm)).toBeGreaterThan(0.4);
  });

  it('refuse by name what is malformed: wrong length (more values than the budget), indices out of bounds, duplicated or out of order, −128, a bad scale, a bad budget', () => {
    const n = 2 * BLOCK;
    const good = encodeTopK(random(n, 4), 4);
    expect(code(() => decodeTopK(good, n, 4))).toBe('accepted');
    expect(code(() => decodeTopK(good, n, 5))).toBe('BAD_LENGTH');
    expect(code(() => decodeTopK(good.subarray(1), n, 4))).toBe('BAD_LENGTH');
    expect(code(() => decodeTopK(new Uint8Array([...good, 0, 0]), n, 4))).toBe('BAD_LENGTH');
    const with_ = (edit: (b: Uint8Array, v: DataView) => void): Uint8Array => {
      const b = Uint8Array.from(good);
      edit(b, new DataView(b.buffer));
      return b;
    };
    expect(code(() => decodeTopK(with_((b) => (b[5] = b[4]!)), n, 4))).toBe('BAD_INDEX'); // duplicated
    expect(code(() => decodeTopK(with_((b) => ([b[4], b[5]] = [b[5]!, b[4]!])), n, 4))).toBe('BAD_INDEX'); // out of order
    const short = encodeTopK(random(BLOCK + 10, 5), 4);
    short[4 + 8 + 4 + 3] = 200; // the short block's last index, past its 10 values
    expect(code(() => decodeTopK(short, BLOCK + 10, 4))).toBe('BAD_INDEX');
    expect(code(() => decodeTopK(with_((b) => (b[8] = 0x80)), n, 4))).toBe('OUT_OF_RANGE');
    expect(code(() => decodeTopK(with_((_b, v) => v.setFloat32(0, Number.NaN, true)), n, 4))).toBe('NOT_FINITE');
    expect(code(() => decodeTopK(with_((_b, v) => v.setFloat32(0, -1, true)), n, 4))).toBe('NOT_FINITE');
    expect(code(() => encodeTopK(Float32Array.of(1, Number.POSITIVE_INFINITY), 1))).toBe('NOT_FINITE');
    for (const k of [0, 257, 1.5]) expect(code(() => topKBytes(n, k))).toBe('BAD_BUDGET');
  });
});

describe('sparse owner results', () => {
  it('carry the union of the contributions\' indices: a mean of two top-k contributions round-trips within int8 of its block', () => {
    const n = 3 * BLOCK + 7;
    const a = decodeTopK(encodeTopK(random(n, 6), 8), n, 8);
    const b = decodeTopK(encodeTopK(random(n, 7), 8), n, 8);
    const mean = a.map((v, i) => (v + b[i]!) / 2);
    const bytes = encodeSparse(mean);
    const nonZero = mean.subarray(0, 3 * BLOCK).filter((v) => v !== 0).length;
    expect(nonZero).toBeLessThanOrEqual(3 * 2 * 8);
    // The three whole blocks sparse; the tail's 7 values are all non-zero, so it goes dense (6 + 7 bytes, not 6 + 14).
    expect(bytes.length).toBe(3 * 6 + 2 * nonZero + 6 + 7);
    const back = decodeSparse(bytes, n);
    for (let i = 0; i < n; i++) {
      if (mean[i] === 0) expect(back[i]).toBe(0);
      else expect(Math.abs(back[i]! - mean[i]!)).toBeLessThan(0.05);
    }
    expect(encodeSparse(mean)).toEqual(bytes);
  });

  it('refuse by name a result that is cut short, runs on, claims more values than its block or repeats an index', () => {
    const n = BLOCK + 3;
    const good = encodeSparse(decodeTopK(encodeTopK(random(n, 8), 2), n, 2));
    expect(code(() => decodeSparse(good, n))).toBe('accepted');
    expect(code(() => decodeSparse(good.subarray(0, good.length - 1), n))).toBe('BAD_LENGTH');
    expect(code(() => decodeSparse(new Uint8Array([...good, 1]), n))).toBe('BAD_LENGTH');
    const claims = Uint8Array.from(good);
    new DataView(claims.buffer).setUint16(0, 300, true);
    expect(code(() => decodeSparse(claims, n))).toBe('BAD_INDEX');
    const repeats = Uint8Array.from(good);
    repeats[7] = repeats[6]!;
    expect(code(() => decodeSparse(repeats, n))).toBe('BAD_INDEX');
  });

  it('a result block with more non-zero values than half its length is sent dense: never more than int8 a value, decoded alike', () => {
    const n = 256 * 3 + 40;
    // Block 0 dense (every value non-zero), block 1 sparse (8 values), block 2 exactly half (sparse), the tail dense.
    const v = random(n, 9);
    for (let i = 256; i < 512; i++) if (i % 32 !== 0) v[i] = 0;
    for (let i = 512; i < 768; i++) if (i % 2 === 0) v[i] = 0;
    const bytes = encodeSparse(v);
    expect(bytes.length).toBe(6 + 256 + (6 + 2 * 8) + (6 + 2 * 128) + (6 + 40));
    const view = new DataView(bytes.buffer);
    expect(view.getUint16(0, true)).toBe(DENSE_BLOCK);
    const back = decodeSparse(bytes, n);
    for (let i = 0; i < n; i++) {
      if (v[i] === 0) expect(back[i]).toBe(0);
      else expect(Math.abs(back[i]! - v[i]!)).toBeLessThan(0.05);
    }
    expect(encodeSparse(v)).toEqual(bytes);
    // A dense block cut short, or holding −128, is refused by name.
    expect(code(() => decodeSparse(bytes.subarray(0, 100), n))).toBe('BAD_LENGTH');
    const low = Uint8Array.from(bytes);
    low[6] = 0x80;
    expect(code(() => decodeSparse(low, n))).toBe('OUT_OF_RANGE');
  });
});
