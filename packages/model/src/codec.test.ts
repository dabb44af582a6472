import { describe, expect, it } from 'vitest';
import {
  CODEC_HEADER_BYTES,
  CodecError,
  bf16RoundUp,
  decodeBoundary,
  encodeBoundary,
  encodedBytes,
  quantizeRows,
  dequantizeRows,
} from './codec';
import { mulberry32 } from './rng';

function randomMatrix(rows: number, cols: number, seed: number, scaleOfRow: (r: number) => number = () => 1): Float32Array {
  const random = mulberry32(seed);
  const data = new Float32Array(rows * cols);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) data[r * cols + c] = (random() * 2 - 1) * scaleOfRow(r);
  return data;
}

function expectCodecError(fn: () => unknown, code: string): void {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(CodecError);
    expect((e as CodecError).code).toBe(code);
    return;
  }
  throw new Error(`expected CodecError ${code}, nothing was thrown`);
}

describe('int8 quantization with per-row scales', () => {
  it('keeps every value within half a quantization step of its row (scale = max|x|/127, bf16 rounded up)', () => {
    const rows = 300;
    const cols = 16;
    // Rows spanning 12 orders of magnitude: gradients can be tiny, activations large.
    const data = randomMatrix(rows, cols, 1, (r) => 10 ** ((r % 13) - 9));
    const { scales, values } = quantizeRows(data, rows, cols);
    const back = dequantizeRows(scales, values, cols);
    for (let r = 0; r < rows; r++) {
      let max = 0;
      for (let c = 0; c < cols; c++) max = Math.max(max, Math.abs(data[r * cols + c]!));
      // bf16 keeps 8 significant bits: the stored scale is at most 2^-7 above max/127.
      expect(scales[r]).toBeGreaterThanOrEqual(max / 127);
      expect(scales[r]).toBeLessThanOrEqual((max / 127) * (1 + 2 ** -7));
      for (let c = 0; c < cols; c++) {
        expect(Math.abs(back[r * cols + c]! - data[r * cols + c]!)).toBeLessThanOrEqual(scales[r]! / 2 + 1e-30);
      }
    }
  });

  it('reconstructs with relative RMS error below 1% on Gaussian-like rows', () => {
    const rows = 512;
    const cols = 64;
    const data = randomMatrix(rows, cols, 2);
    const decoded = decodeBoundary(encodeBoundary({ rows, cols, data }, 'int8'));
    let err = 0;
    let norm = 0;
    for (let i = 0; i < data.length; i++) {
      err += (decoded.data[i]! - data[i]!) ** 2;
      norm += data[i]! ** 2;
    }
    expect(Math.sqrt(err / norm)).toBeLessThan(0.01);
  });

  it('encodes zero rows exactly and never emits -128', () => {
    const rows = 4;
    const cols = 8;
    const data = new Float32Array(rows * cols);
    data.fill(-3, 8, 16); // a row of equal negatives maps to exactly -127
    const { values } = quantizeRows(data, rows, cols);
    expect(Math.min(...values)).toBe(-127);
    const decoded = decodeBoundary(encodeBoundary({ rows, cols, data }, 'int8'));
    expect(Array.from(decoded.data.subarray(0, 8))).toEqual(new Array(8).fill(0));
    for (const v of decoded.data.subarray(8, 16)) expect(v).toBeCloseTo(-3, 1);
  });

  it('rounds scales up to bfloat16', () => {
    expect(bf16RoundUp(1)).toBe(1);
    expect(bf16RoundUp(1 + 2 ** -10)).toBe(1 + 2 ** -7);
    expect(bf16RoundUp(0)).toBe(0);
  });
});

describe('boundary frames', () => {
  const rows = 6;
  const cols = 5;
  const data = randomMatrix(rows, cols, 3);

  it('round-trips fp32 exactly', () => {
    const bytes = encodeBoundary({ rows, cols, data }, 'fp32');
    expect(bytes.length).toBe(encodedBytes(rows, cols, 'fp32'));
    const out = decodeBoundary(bytes, { rows, cols, precision: 'fp32' });
    expect(Array.from(out.data)).toEqual(Array.from(data));
  });

  it('costs b + 2 bytes per row in int8', () => {
    expect(encodeBoundary({ rows, cols, data }, 'int8').length).toBe(CODEC_HEADER_BYTES + rows * (cols + 2));
  });

  it('rejects truncated frames at every length', () => {
    for (const precision of ['fp32', 'int8'] as const) {
      const bytes = encodeBoundary({ rows, cols, data }, precision);
      for (let n = 0; n < bytes.length; n++) {
        expect(() => decodeBoundary(bytes.slice(0, n)), `${precision} cut at ${n}`).toThrow(CodecError);
      }
    }
  });

  it('rejects trailing bytes', () => {
    const bytes = encodeBoundary({ rows, cols, data }, 'int8');
    const longer = new Uint8Array(bytes.length + 1);
    longer.set(bytes);
    expectCodecError(() => decodeBoundary(longer), 'LENGTH_MISMATCH');
  });

  it('names each malformed header', () => {
    const bytes = encodeBoundary({ rows, cols, data }, 'int8');
    const mutate = (offset: number, value: number, width: 1 | 2 | 4): Uint8Array => {
      const copy = bytes.slice();
      const view = new DataView(copy.buffer);
      if (width === 1) view.setUint8(offset, value);
      else if (width === 2) view.setUint16(offset, value, true);
      else view.setUint32(offset, value, true);
      return copy;
    };
    expectCodecError(() => decodeBoundary(mutate(0, 0xdeadbeef, 4)), 'BAD_MAGIC');
    expectCodecError(() => decodeBoundary(mutate(4, 9, 1)), 'BAD_VERSION');
    expectCodecError(() => decodeBoundary(mutate(5, 7, 1)), 'BAD_PRECISION');
    expectCodecError(() => decodeBoundary(mutate(6, 1, 2)), 'BAD_HEADER');
    expectCodecError(() => decodeBoundary(mutate(8, 0, 4)), 'BAD_SHAPE');
    expectCodecError(() => decodeBoundary(mutate(12, 0xffffffff, 4)), 'BAD_SHAPE');
    // A plausible but different shape: the byte count no longer matches.
    expectCodecError(() => decodeBoundary(mutate(8, rows + 1, 4)), 'TRUNCATED');
  });

  it('rejects a well-formed frame of the wrong shape or precision', () => {
    const bytes = encodeBoundary({ rows, cols, data }, 'int8');
    expectCodecError(() => decodeBoundary(bytes, { rows: rows + 1 }), 'SHAPE_MISMATCH');
    expectCodecError(() => decodeBoundary(bytes, { cols: cols - 1 }), 'SHAPE_MISMATCH');
    expectCodecError(() => decodeBoundary(bytes, { precision: 'fp32' }), 'BAD_PRECISION');
  });

  it('rejects non-finite values and -128', () => {
    const fp = encodeBoundary({ rows, cols, data }, 'fp32');
    new DataView(fp.buffer).setFloat32(CODEC_HEADER_BYTES + 8, NaN, true);
    expectCodecError(() => decodeBoundary(fp), 'NON_FINITE');
    const q = encodeBoundary({ rows, cols, data }, 'int8');
    const infScale = q.slice();
    new DataView(infScale.buffer).setUint16(CODEC_HEADER_BYTES, 0x7f80, true); // bf16 +Inf
    expectCodecError(() => decodeBoundary(infScale), 'NON_FINITE');
    const negScale = q.slice();
    new DataView(negScale.buffer).setUint16(CODEC_HEADER_BYTES, 0xbf80, true); // bf16 -1
    expectCodecError(() => decodeBoundary(negScale), 'NON_FINITE');
    const minus128 = q.slice();
    minus128[CODEC_HEADER_BYTES + rows * 2] = 0x80;
    expectCodecError(() => decodeBoundary(minus128), 'OUT_OF_RANGE');
  });

  it('refuses to encode values that do not fit the frame', () => {
    expectCodecError(() => encodeBoundary({ rows: 2, cols: 2, data: new Float32Array(3) }, 'int8'), 'SHAPE_MISMATCH');
    expectCodecError(() => encodeBoundary({ rows: 1, cols: 2, data: Float32Array.of(1, Infinity) }, 'int8'), 'NON_FINITE');
  });

  it('decodes random bytes to an error, never to data', () => {
    const random = mulberry32(9);
    for (let i = 0; i < 500; i++) {
      const bytes = new Uint8Array(Math.floor(random() * 64));
      for (let j = 0; j < bytes.length; j++) bytes[j] = Math.floor(random() * 256);
      if (i % 2 === 0 && bytes.length >= 16) new DataView(bytes.buffer).setUint32(0, 0x43484154, true); // valid magic, random rest
      expect(() => decodeBoundary(bytes)).toThrow(CodecError);
    }
  });
});
