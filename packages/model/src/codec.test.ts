import { deflateSync } from 'fflate';
import { describe, expect, it } from 'vitest';
import {
  CODEC_HEADER_BYTES,
  QUANT_BITS,
  type Precision,
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

describe('grouped low-bit codecs (version 2 frames)', () => {
  const rows = 64;
  const cols = 8;
  // Rows of different magnitudes, as gradients have.
  const data = randomMatrix(rows, cols, 11, (r) => 10 ** ((r % 5) - 3));
  const relRms = (a: Float32Array, b: Float32Array): number => {
    let err = 0;
    let norm = 0;
    for (let i = 0; i < a.length; i++) {
      err += (a[i]! - b[i]!) ** 2;
      norm += b[i]! ** 2;
    }
    return Math.sqrt(err / norm);
  };

  it('round-trip every value within half a step of its group (scale = group max / qmax), at the size they state', () => {
    for (const bits of QUANT_BITS) {
      for (const group of [1, 4, 16]) {
        for (const z of ['', 'z']) {
          const name = `q${bits}g${group}${z}` as Precision;
          const bytes = encodeBoundary({ rows, cols, data }, name);
          if (!z) expect(bytes.length, name).toBe(CODEC_HEADER_BYTES + Math.ceil(rows / group) * 2 + Math.ceil((rows * cols * bits) / 8));
          const out = decodeBoundary(bytes, { rows, cols, precision: name });
          expect(out.precision).toBe(name);
          const qmax = 2 ** (bits - 1) - 1;
          for (let g = 0; g < rows / group; g++) {
            let max = 0;
            for (let i = g * group * cols; i < (g + 1) * group * cols; i++) max = Math.max(max, Math.abs(data[i]!));
            const step = bf16RoundUp(max / qmax);
            for (let i = g * group * cols; i < (g + 1) * group * cols; i++) expect(Math.abs(out.data[i]! - data[i]!), `${name} value ${i}`).toBeLessThanOrEqual(step / 2 + 1e-30);
          }
        }
      }
    }
  });

  it('state their error: relative RMS on Gaussian-like rows, by bits', () => {
    const g = randomMatrix(512, 16, 12);
    const err = (name: Precision): number => relRms(decodeBoundary(encodeBoundary({ rows: 512, cols: 16, data: g }, name)).data, g);
    expect(err('q8g1')).toBeLessThan(0.005);
    expect(err('q6g4')).toBeLessThan(0.02);
    expect(err('q4g16')).toBeLessThan(0.09);
    // Deflate is lossless: the same values as without it.
    expect(Array.from(decodeBoundary(encodeBoundary({ rows: 512, cols: 16, data: g }, 'q4g16z')).data)).toEqual(Array.from(decodeBoundary(encodeBoundary({ rows: 512, cols: 16, data: g }, 'q4g16')).data));
  });

  it('round stochastically without bias, reproducibly from a seed', () => {
    const one = Float32Array.from({ length: 4096 }, (_, i) => (i === 0 ? 7 : 0.3)); // scale 1 at 4 bits: 0.3 → 0 or 1
    const a = decodeBoundary(encodeBoundary({ rows: 1, cols: 4096, data: one }, 'q4g1', { rounding: 'stochastic', seed: 5 })).data;
    const mean = a.slice(1).reduce((s, v) => s + v, 0) / 4095;
    expect(Math.abs(mean - 0.3)).toBeLessThan(0.03);
    expect(Array.from(decodeBoundary(encodeBoundary({ rows: 1, cols: 4096, data: one }, 'q4g1', { rounding: 'stochastic', seed: 5 })).data)).toEqual(Array.from(a));
    expect(new Set(decodeBoundary(encodeBoundary({ rows: 1, cols: 4096, data: one }, 'q4g1')).data.slice(1)).size).toBe(1); // nearest: all 0
  });

  it('refuse a non-finite value at the sender, by name, in every codec (NaN too)', () => {
    for (const name of ['fp32', 'int8', 'q8g1', 'q6g4', 'q4g16z'] as Precision[]) {
      for (const bad of [NaN, Infinity, -Infinity]) {
        const x = data.slice();
        x[17] = bad;
        expectCodecError(() => encodeBoundary({ rows, cols, data: x }, name), 'NON_FINITE');
      }
    }
  });

  it('name every bad frame: unknown codec, truncated, codes out of range, set padding, non-finite scales, a body that inflates wrong', () => {
    const bytes = encodeBoundary({ rows, cols, data }, 'q4g4');
    const mutate = (offset: number, value: number): Uint8Array => {
      const copy = bytes.slice();
      copy[offset] = value;
      return copy;
    };
    expectCodecError(() => decodeBoundary(mutate(5, 9)), 'BAD_PRECISION'); // unknown kind
    expectCodecError(() => decodeBoundary(mutate(6, 5)), 'BAD_PRECISION'); // 5 bits: no such codec
    expectCodecError(() => decodeBoundary(mutate(7, 0)), 'BAD_PRECISION'); // group 0
    expectCodecError(() => decodeBoundary(mutate(7, 200)), 'BAD_PRECISION');
    expectCodecError(() => decodeBoundary(bytes, { precision: 'q6g4' }), 'BAD_PRECISION'); // the run uses another codec
    expectCodecError(() => decodeBoundary(bytes, { precision: 'int8' }), 'BAD_PRECISION');
    for (let n = 0; n < bytes.length; n++) expect(() => decodeBoundary(bytes.slice(0, n)), `cut at ${n}`).toThrow(CodecError);
    const codes = CODEC_HEADER_BYTES + (rows / 4) * 2;
    expectCodecError(() => decodeBoundary(mutate(codes, 0xff)), 'OUT_OF_RANGE'); // code 15 > 14
    const scale = bytes.slice();
    new DataView(scale.buffer).setUint16(CODEC_HEADER_BYTES, 0x7fc0, true); // bf16 NaN
    expectCodecError(() => decodeBoundary(scale), 'NON_FINITE');
    // 6-bit codes of 64 × 8 values end on a byte; 3 × 3 of them do not: their padding must be zero.
    const odd = encodeBoundary({ rows: 3, cols: 3, data: Float32Array.from({ length: 9 }, (_, i) => i - 4) }, 'q6g1');
    odd[odd.length - 1]! |= 0x80;
    expectCodecError(() => decodeBoundary(odd), 'BAD_HEADER');
    // Deflated: garbage, and a body that inflates to more than the shape holds (never allocated whole).
    const z = encodeBoundary({ rows, cols, data }, 'q4g4z');
    const garbage = z.slice();
    garbage.fill(0xff, CODEC_HEADER_BYTES);
    expect(() => decodeBoundary(garbage)).toThrow(CodecError);
    const bomb = new Uint8Array([...z.subarray(0, CODEC_HEADER_BYTES), ...deflateSync(new Uint8Array(10 * 1024 * 1024))]);
    expect(() => decodeBoundary(bomb)).toThrow(CodecError);
  });
});
