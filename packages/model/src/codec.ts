import { deflateSync, inflateSync } from 'fflate';
import { mulberry32 } from './rng';

/**
 * The wire format of one boundary tensor (activations going forward, their
 * gradients going back): a [rows, cols] float matrix, rows = B*T tokens,
 * cols = the bottleneck width b. The run names its codec (a string, the same
 * on every miner), and every frame's header names the codec it was written
 * with, so a receiver never decodes with the wrong one.
 *
 * Version 1 frames, little-endian:
 *   0  u32  magic 'TAHC' (0x43484154)
 *   4  u8   version (1)
 *   5  u8   precision: 1 = fp32 ('fp32'), 2 = int8 with per-row scales ('int8')
 *   6  u16  reserved, 0
 *   8  u32  rows
 *   12 u32  cols
 *   16      fp32: rows·cols float32
 *           int8: rows bfloat16 scales, then rows·cols int8 values in [-127, 127]
 *
 * Version 2 frames: grouped uniform quantization ('q<bits>g<group>', and
 * with a 'z' suffix the body deflated):
 *   0  u32  magic, 4 u8 version (2), 5 u8 kind (3)
 *   6  u8   bits per value (4, 6 or 8), | 0x80 when the body is deflated
 *   7  u8   rows per scale group (1…64)
 *   8  u32  rows, 12 u32 cols
 *   16      body: ⌈rows/group⌉ bfloat16 scales (max |x| of the group's rows
 *           over qmax = 2^(bits−1) − 1, rounded up), then rows·cols codes of
 *           `bits` bits each, offset binary (x/scale + qmax, in 0…2·qmax),
 *           packed LSB first; with 'z', deflate (raw, fflate) of that body.
 *
 * int8 costs b + 2 bytes per token against 4·d for fp32 at full width;
 * q4g16 costs b/2 + 1/8. Scales are bfloat16 (fp32's exponent range) because
 * gradient rows can be far smaller than fp16 represents. A value that is not
 * finite is a named error at the sender (NON_FINITE) and never crosses the
 * wire; a frame that says otherwise is refused by name on arrival.
 */

export const CODEC_MAGIC = 0x43484154;
export const CODEC_VERSION = 1;
/** Frames of the grouped low-bit codecs (see the layout above). */
export const CODEC_VERSION_QUANT = 2;
const KIND_QUANT = 3;
const DEFLATED = 0x80;
export const CODEC_HEADER_BYTES = 16;
/** Bounds that keep a hostile header from asking for a huge allocation. */
export const CODEC_MAX_ROWS = 1 << 20;
export const CODEC_MAX_COLS = 1 << 16;
export const CODEC_MAX_ELEMENTS = 1 << 26;

/** The grouped low-bit codecs' names: bits per value, rows per scale, 'z' when deflated. */
export type QuantCodecName = `q${4 | 6 | 8}g${number}` | `q${4 | 6 | 8}g${number}z`;
/** A boundary codec, as a run names it ('precision' for the two of version 1). */
export type Precision = 'fp32' | 'int8' | QuantCodecName;
const PRECISION_CODE: Record<'fp32' | 'int8', number> = { fp32: 1, int8: 2 };

/** What a codec name says. */
export type CodecSpec = { name: Precision; kind: 'fp32' } | { name: Precision; kind: 'int8' } | { name: Precision; kind: 'quant'; bits: 4 | 6 | 8; group: number; deflate: boolean };

export const QUANT_BITS = [4, 6, 8] as const;
export const MAX_GROUP_ROWS = 64;
const QUANT_NAME = /^q([468])g([1-9][0-9]?)(z?)$/;

/** The codec a name stands for; an unknown name is BAD_PRECISION. */
export function parseCodec(name: string): CodecSpec {
  if (name === 'fp32' || name === 'int8') return { name, kind: name };
  const m = QUANT_NAME.exec(name);
  const group = m ? Number(m[2]) : 0;
  if (!m || group > MAX_GROUP_ROWS) throw new CodecError('BAD_PRECISION', `unknown codec ${JSON.stringify(String(name).slice(0, 20))}: fp32, int8, or q<4|6|8>g<1…${MAX_GROUP_ROWS}>[z]`);
  return { name: name as Precision, kind: 'quant', bits: Number(m[1]) as 4 | 6 | 8, group, deflate: m[3] === 'z' };
}

/** How a sender rounds to its codes: to the nearest, or stochastically (unbiased; seeded, so a replay reproduces it). */
export interface EncodeOptions {
  rounding?: 'nearest' | 'stochastic';
  /** Seeds stochastic rounding (the validator replays a transfer with the same seed). */
  seed?: number;
}

export type CodecErrorCode =
  | 'TRUNCATED'
  | 'BAD_MAGIC'
  | 'BAD_VERSION'
  | 'BAD_PRECISION'
  | 'BAD_HEADER'
  | 'BAD_SHAPE'
  | 'SHAPE_MISMATCH'
  | 'LENGTH_MISMATCH'
  | 'NON_FINITE'
  | 'OUT_OF_RANGE';

export class CodecError extends Error {
  override name = 'CodecError';
  constructor(
    readonly code: CodecErrorCode,
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

export interface BoundaryTensor {
  rows: number;
  cols: number;
  /** Row-major values, rows·cols long. */
  data: Float32Array;
}

/** int8 quantization of each row with its own scale (max |x| / 127, rounded up to bfloat16). */
export function quantizeRows(data: Float32Array, rows: number, cols: number): { scales: Float32Array; values: Int8Array } {
  const scales = new Float32Array(rows);
  const values = new Int8Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    let max = 0;
    const base = r * cols;
    for (let c = 0; c < cols; c++) {
      const a = Math.abs(data[base + c]!);
      // NaN fails every comparison: tested on its own, or it would quantize to 0.
      if (!(a <= Number.MAX_VALUE)) throw new CodecError('NON_FINITE', `row ${r} holds a non-finite value (${data[base + c]})`);
      if (a > max) max = a;
    }
    const scale = bf16RoundUp(max / 127);
    scales[r] = scale;
    if (scale === 0) continue;
    const inv = 1 / scale;
    for (let c = 0; c < cols; c++) values[base + c] = Math.max(-127, Math.min(127, Math.round(data[base + c]! * inv)));
  }
  return { scales, values };
}

export function dequantizeRows(scales: Float32Array, values: Int8Array, cols: number): Float32Array {
  const out = new Float32Array(values.length);
  for (let r = 0; r < scales.length; r++) {
    const s = scales[r]!;
    const base = r * cols;
    for (let c = 0; c < cols; c++) out[base + c] = values[base + c]! * s;
  }
  return out;
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** Rounds a non-negative float up to the nearest bfloat16 (top 16 bits of float32). */
export function bf16RoundUp(x: number): number {
  f32[0] = x;
  if ((u32[0]! & 0xffff) !== 0) u32[0] = ((u32[0]! >>> 16) + 1) << 16;
  return f32[0]!;
}
function bf16Bits(x: number): number {
  f32[0] = x;
  return u32[0]! >>> 16;
}
function fromBf16Bits(bits: number): number {
  u32[0] = bits << 16;
  return f32[0]!;
}

/** Bytes of a quantized body before any deflate: the group scales, then the packed codes. */
function quantBodyBytes(rows: number, cols: number, bits: number, group: number): number {
  return Math.ceil(rows / group) * 2 + Math.ceil((rows * cols * bits) / 8);
}

/** A deflated body may grow a little on incompressible input: at most this much (deflate's stored blocks, 5 bytes per 64 KiB, and its end). */
function deflateBound(raw: number): number {
  return raw + 5 * Math.ceil(raw / 65535 + 1) + 16;
}

/**
 * The size of a frame: exact for every codec but a deflated one, whose size
 * depends on its contents (this is then the size before deflate).
 */
export function encodedBytes(rows: number, cols: number, precision: Precision): number {
  const spec = parseCodec(precision);
  if (spec.kind === 'fp32') return CODEC_HEADER_BYTES + rows * cols * 4;
  if (spec.kind === 'int8') return CODEC_HEADER_BYTES + rows * 2 + rows * cols;
  return CODEC_HEADER_BYTES + quantBodyBytes(rows, cols, spec.bits, spec.group);
}

export function encodeBoundary(t: BoundaryTensor, precision: Precision, options: EncodeOptions = {}): Uint8Array {
  const { rows, cols, data } = t;
  checkShape(rows, cols);
  if (data.length !== rows * cols) throw new CodecError('SHAPE_MISMATCH', `${data.length} values for [${rows}, ${cols}]`);
  const spec = parseCodec(precision);
  if (spec.kind === 'quant') return encodeQuant(t, spec, options);
  const out = new Uint8Array(encodedBytes(rows, cols, precision));
  const view = writeFrameHeader(out, rows, cols, precision);
  if (spec.kind === 'fp32') {
    for (let i = 0; i < data.length; i++) {
      if (!Number.isFinite(data[i]!)) throw new CodecError('NON_FINITE', `value ${i} is not finite`);
      view.setFloat32(CODEC_HEADER_BYTES + i * 4, data[i]!, true);
    }
  } else {
    const { scales, values } = quantizeRows(data, rows, cols);
    for (let r = 0; r < rows; r++) view.setUint16(CODEC_HEADER_BYTES + r * 2, bf16Bits(scales[r]!), true);
    out.set(new Uint8Array(values.buffer), CODEC_HEADER_BYTES + rows * 2);
  }
  return out;
}

function encodeQuant({ rows, cols, data }: BoundaryTensor, spec: Extract<CodecSpec, { kind: 'quant' }>, options: EncodeOptions): Uint8Array {
  const { bits, group } = spec;
  const qmax = 2 ** (bits - 1) - 1;
  const groups = Math.ceil(rows / group);
  const body = new Uint8Array(quantBodyBytes(rows, cols, bits, group));
  const bodyView = new DataView(body.buffer);
  const codesAt = groups * 2;
  const random = options.rounding === 'stochastic' ? mulberry32(options.seed ?? 0) : undefined;
  let bit = 0; // position in the packed codes
  for (let g = 0; g < groups; g++) {
    const start = g * group * cols;
    const end = Math.min(rows, (g + 1) * group) * cols;
    let max = 0;
    for (let i = start; i < end; i++) {
      const a = Math.abs(data[i]!);
      if (!(a <= Number.MAX_VALUE)) throw new CodecError('NON_FINITE', `value ${i} is not finite (${data[i]})`);
      if (a > max) max = a;
    }
    const scale = bf16RoundUp(max / qmax);
    bodyView.setUint16(g * 2, bf16Bits(scale), true);
    const inv = scale === 0 ? 0 : 1 / scale;
    for (let i = start; i < end; i++) {
      const x = data[i]! * inv;
      const q = random ? Math.floor(x + random()) : Math.round(x);
      let code = Math.max(-qmax, Math.min(qmax, q)) + qmax;
      // LSB-first packing: the code's bits go to the lowest free bits of the current byte, then the next.
      for (let left = bits; left > 0; ) {
        const byte = codesAt + (bit >> 3);
        const offset = bit & 7;
        const take = Math.min(left, 8 - offset);
        body[byte]! |= (code & ((1 << take) - 1)) << offset;
        code >>= take;
        left -= take;
        bit += take;
      }
    }
  }
  const payload = spec.deflate ? deflateSync(body, { level: 6 }) : body;
  const out = new Uint8Array(CODEC_HEADER_BYTES + payload.length);
  writeFrameHeader(out, rows, cols, spec.name);
  out.set(payload, CODEC_HEADER_BYTES);
  return out;
}

/**
 * Decodes and checks a boundary frame. Anything malformed — truncated, wrong
 * magic or version, a codec or shape other than `expect`, non-finite scales,
 * codes outside the codec's range — throws a CodecError; garbage is never returned.
 */
export function decodeBoundary(bytes: Uint8Array, expect?: { rows?: number; cols?: number; precision?: Precision }): BoundaryTensor & { precision: Precision } {
  const { view, rows, cols, precision, spec } = readFrameHeader(bytes, expect);
  if (spec.kind === 'quant') return { rows, cols, data: decodeQuant(bytes.subarray(CODEC_HEADER_BYTES), rows, cols, spec), precision };
  const data = new Float32Array(rows * cols);
  if (spec.kind === 'fp32') {
    for (let i = 0; i < data.length; i++) {
      const v = view.getFloat32(CODEC_HEADER_BYTES + i * 4, true);
      if (!Number.isFinite(v)) throw new CodecError('NON_FINITE', `value ${i} is not finite`);
      data[i] = v;
    }
    return { rows, cols, data, precision };
  }
  const scales = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    const s = fromBf16Bits(view.getUint16(CODEC_HEADER_BYTES + r * 2, true));
    if (!Number.isFinite(s) || s < 0) throw new CodecError('NON_FINITE', `row ${r} has scale ${s}`);
    scales[r] = s;
  }
  const valuesOffset = bytes.byteOffset + CODEC_HEADER_BYTES + rows * 2;
  const values = new Int8Array(bytes.buffer.slice(valuesOffset, valuesOffset + rows * cols));
  for (let i = 0; i < values.length; i++) {
    if (values[i] === -128) throw new CodecError('OUT_OF_RANGE', `value ${i} is -128; the encoder emits [-127, 127]`);
  }
  return { rows, cols, data: dequantizeRows(scales, values, cols), precision };
}

function decodeQuant(payload: Uint8Array, rows: number, cols: number, spec: Extract<CodecSpec, { kind: 'quant' }>): Float32Array {
  const { bits, group } = spec;
  const raw = quantBodyBytes(rows, cols, bits, group);
  let body = payload;
  if (spec.deflate) {
    try {
      // One byte of room: a body that inflates to more than it should is caught, never allocated.
      body = inflateSync(payload, { out: new Uint8Array(raw + 1) });
    } catch (e) {
      throw new CodecError('BAD_HEADER', `the deflated body does not inflate: ${(e as Error).message}`);
    }
    if (body.length !== raw) throw new CodecError('LENGTH_MISMATCH', `the body inflates to ${body.length} bytes, a [${rows}, ${cols}] ${spec.name} body is ${raw}`);
  }
  const view = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const qmax = 2 ** (bits - 1) - 1;
  const groups = Math.ceil(rows / group);
  const codesAt = groups * 2;
  const out = new Float32Array(rows * cols);
  let bit = 0;
  for (let g = 0; g < groups; g++) {
    const scale = fromBf16Bits(view.getUint16(g * 2, true));
    if (!Number.isFinite(scale) || scale < 0) throw new CodecError('NON_FINITE', `group ${g} has scale ${scale}`);
    const end = Math.min(rows, (g + 1) * group) * cols;
    for (let i = g * group * cols; i < end; i++) {
      let code = 0;
      for (let got = 0; got < bits; ) {
        const offset = bit & 7;
        const take = Math.min(bits - got, 8 - offset);
        code |= ((body[codesAt + (bit >> 3)]! >> offset) & ((1 << take) - 1)) << got;
        got += take;
        bit += take;
      }
      if (code > 2 * qmax) throw new CodecError('OUT_OF_RANGE', `code ${code} of value ${i}: a ${bits}-bit codec emits 0…${2 * qmax}`);
      out[i] = (code - qmax) * scale;
    }
  }
  // The padding bits after the last code are zero, as the encoder leaves them.
  if (bit % 8 !== 0 && body[codesAt + (bit >> 3)]! >> (bit % 8) !== 0) throw new CodecError('BAD_HEADER', 'padding bits after the last code are set');
  return out;
}

/** Writes a frame's 16-byte header into `out`; returns a view of `out` for the body. */
export function writeFrameHeader(out: Uint8Array, rows: number, cols: number, precision: Precision): DataView {
  const spec = parseCodec(precision);
  const view = new DataView(out.buffer, out.byteOffset, out.byteLength);
  view.setUint32(0, CODEC_MAGIC, true);
  if (spec.kind === 'quant') {
    view.setUint8(4, CODEC_VERSION_QUANT);
    view.setUint8(5, KIND_QUANT);
    view.setUint8(6, spec.bits | (spec.deflate ? DEFLATED : 0));
    view.setUint8(7, spec.group);
  } else {
    view.setUint8(4, CODEC_VERSION);
    view.setUint8(5, PRECISION_CODE[spec.kind]);
    view.setUint16(6, 0, true);
  }
  view.setUint32(8, rows, true);
  view.setUint32(12, cols, true);
  return view;
}

/**
 * Checks a frame's header and length against `expect` (every CodecError of
 * decodeBoundary short of the body's values) and returns what it says.
 */
export function readFrameHeader(
  bytes: Uint8Array,
  expect?: { rows?: number; cols?: number; precision?: Precision },
): { view: DataView; rows: number; cols: number; precision: Precision; spec: CodecSpec } {
  if (!(bytes instanceof Uint8Array)) throw new CodecError('BAD_HEADER', 'a frame must be bytes');
  if (bytes.length < CODEC_HEADER_BYTES) throw new CodecError('TRUNCATED', `${bytes.length} bytes, the header alone is ${CODEC_HEADER_BYTES}`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(0, true) !== CODEC_MAGIC) throw new CodecError('BAD_MAGIC', 'not a boundary tensor frame');
  const version = view.getUint8(4);
  let spec: CodecSpec;
  if (version === CODEC_VERSION) {
    const code = view.getUint8(5);
    const name = (Object.keys(PRECISION_CODE) as Array<'fp32' | 'int8'>).find((p) => PRECISION_CODE[p] === code);
    if (!name) throw new CodecError('BAD_PRECISION', `unknown precision code ${code}`);
    if (view.getUint16(6, true) !== 0) throw new CodecError('BAD_HEADER', 'reserved bits are set');
    spec = parseCodec(name);
  } else if (version === CODEC_VERSION_QUANT) {
    const kind = view.getUint8(5);
    if (kind !== KIND_QUANT) throw new CodecError('BAD_PRECISION', `unknown codec kind ${kind}`);
    const bitsByte = view.getUint8(6);
    const name = `q${bitsByte & ~DEFLATED}g${view.getUint8(7)}${bitsByte & DEFLATED ? 'z' : ''}`;
    spec = parseCodec(name); // an impossible width or group is BAD_PRECISION
  } else {
    throw new CodecError('BAD_VERSION', `version ${version}, expected ${CODEC_VERSION} or ${CODEC_VERSION_QUANT}`);
  }
  const precision = spec.name;
  const rows = view.getUint32(8, true);
  const cols = view.getUint32(12, true);
  checkShape(rows, cols);
  if (expect?.rows !== undefined && rows !== expect.rows) throw new CodecError('SHAPE_MISMATCH', `${rows} rows, expected ${expect.rows}`);
  if (expect?.cols !== undefined && cols !== expect.cols) throw new CodecError('SHAPE_MISMATCH', `${cols} columns, expected ${expect.cols}`);
  if (expect?.precision !== undefined && precision !== expect.precision) {
    throw new CodecError('BAD_PRECISION', `${precision} frame, the run uses ${expect.precision}`);
  }
  const want = encodedBytes(rows, cols, precision);
  if (spec.kind === 'quant' && spec.deflate) {
    if (bytes.length > CODEC_HEADER_BYTES + deflateBound(want - CODEC_HEADER_BYTES)) throw new CodecError('LENGTH_MISMATCH', `${bytes.length} bytes, more than a deflated [${rows}, ${cols}] ${precision} body can take`);
    if (bytes.length === CODEC_HEADER_BYTES) throw new CodecError('TRUNCATED', 'no body');
  } else {
    if (bytes.length < want) throw new CodecError('TRUNCATED', `${bytes.length} bytes, a [${rows}, ${cols}] ${precision} frame is ${want}`);
    if (bytes.length > want) throw new CodecError('LENGTH_MISMATCH', `${bytes.length} bytes, a [${rows}, ${cols}] ${precision} frame is ${want}`);
  }
  return { view, rows, cols, precision, spec };
}

/** Rows and columns within the codec's limits, or BAD_SHAPE. */
export function checkShape(rows: number, cols: number): void {
  if (!Number.isInteger(rows) || !Number.isInteger(cols) || rows < 1 || cols < 1 || rows > CODEC_MAX_ROWS || cols > CODEC_MAX_COLS || rows * cols > CODEC_MAX_ELEMENTS) {
    throw new CodecError('BAD_SHAPE', `shape [${rows}, ${cols}] is outside [1..${CODEC_MAX_ROWS}] × [1..${CODEC_MAX_COLS}]`);
  }
}
