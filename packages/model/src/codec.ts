/**
 * The wire format of one boundary tensor (activations going forward, their
 * gradients going back): a [rows, cols] float matrix, rows = B*T tokens,
 * cols = the bottleneck width b.
 *
 * Layout, little-endian:
 *   0  u32  magic 'TAHC' (0x43484154)
 *   4  u8   version (1)
 *   5  u8   precision: 1 = fp32, 2 = int8 with per-row scales
 *   6  u16  reserved, 0
 *   8  u32  rows
 *   12 u32  cols
 *   16      fp32: rows·cols float32
 *           int8: rows bfloat16 scales, then rows·cols int8 values in [-127, 127]
 *
 * int8 costs b + 2 bytes per token against 4·d for fp32 at full width.
 * Scales are bfloat16 (fp32's exponent range) because gradient rows can be
 * far smaller than fp16 represents.
 */

export const CODEC_MAGIC = 0x43484154;
export const CODEC_VERSION = 1;
export const CODEC_HEADER_BYTES = 16;
/** Bounds that keep a hostile header from asking for a huge allocation. */
export const CODEC_MAX_ROWS = 1 << 20;
export const CODEC_MAX_COLS = 1 << 16;
export const CODEC_MAX_ELEMENTS = 1 << 26;

export type Precision = 'fp32' | 'int8';
const PRECISION_CODE: Record<Precision, number> = { fp32: 1, int8: 2 };

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
      if (a > max) max = a;
    }
    if (!Number.isFinite(max)) throw new CodecError('NON_FINITE', `row ${r} holds a non-finite value`);
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

export function encodedBytes(rows: number, cols: number, precision: Precision): number {
  return CODEC_HEADER_BYTES + (precision === 'fp32' ? rows * cols * 4 : rows * 2 + rows * cols);
}

export function encodeBoundary(t: BoundaryTensor, precision: Precision): Uint8Array {
  const { rows, cols, data } = t;
  checkShape(rows, cols);
  if (data.length !== rows * cols) throw new CodecError('SHAPE_MISMATCH', `${data.length} values for [${rows}, ${cols}]`);
  const out = new Uint8Array(encodedBytes(rows, cols, precision));
  const view = writeFrameHeader(out, rows, cols, precision);
  if (precision === 'fp32') {
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

/**
 * Decodes and checks a boundary frame. Anything malformed — truncated, wrong
 * magic or version, a shape other than `expect`, non-finite numbers, -128 —
 * throws a CodecError; garbage is never returned.
 */
export function decodeBoundary(bytes: Uint8Array, expect?: { rows?: number; cols?: number; precision?: Precision }): BoundaryTensor & { precision: Precision } {
  const { view, rows, cols, precision } = readFrameHeader(bytes, expect);
  const data = new Float32Array(rows * cols);
  if (precision === 'fp32') {
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

/** Writes a frame's 16-byte header into `out`; returns a view of `out` for the body. */
export function writeFrameHeader(out: Uint8Array, rows: number, cols: number, precision: Precision): DataView {
  const view = new DataView(out.buffer, out.byteOffset, out.byteLength);
  view.setUint32(0, CODEC_MAGIC, true);
  view.setUint8(4, CODEC_VERSION);
  view.setUint8(5, PRECISION_CODE[precision]);
  view.setUint16(6, 0, true);
  view.setUint32(8, rows, true);
  view.setUint32(12, cols, true);
  return view;
}

/**
 * Checks a frame's header and length against `expect` (every CodecError of
 * decodeBoundary short of the body's values) and returns what it says.
 */
export function readFrameHeader(bytes: Uint8Array, expect?: { rows?: number; cols?: number; precision?: Precision }): { view: DataView; rows: number; cols: number; precision: Precision } {
  if (!(bytes instanceof Uint8Array)) throw new CodecError('BAD_HEADER', 'a frame must be bytes');
  if (bytes.length < CODEC_HEADER_BYTES) throw new CodecError('TRUNCATED', `${bytes.length} bytes, the header alone is ${CODEC_HEADER_BYTES}`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(0, true) !== CODEC_MAGIC) throw new CodecError('BAD_MAGIC', 'not a boundary tensor frame');
  if (view.getUint8(4) !== CODEC_VERSION) throw new CodecError('BAD_VERSION', `version ${view.getUint8(4)}, expected ${CODEC_VERSION}`);
  const code = view.getUint8(5);
  const precision = (Object.keys(PRECISION_CODE) as Precision[]).find((p) => PRECISION_CODE[p] === code);
  if (!precision) throw new CodecError('BAD_PRECISION', `unknown precision code ${code}`);
  if (view.getUint16(6, true) !== 0) throw new CodecError('BAD_HEADER', 'reserved bits are set');
  const rows = view.getUint32(8, true);
  const cols = view.getUint32(12, true);
  checkShape(rows, cols);
  if (expect?.rows !== undefined && rows !== expect.rows) throw new CodecError('SHAPE_MISMATCH', `${rows} rows, expected ${expect.rows}`);
  if (expect?.cols !== undefined && cols !== expect.cols) throw new CodecError('SHAPE_MISMATCH', `${cols} columns, expected ${expect.cols}`);
  if (expect?.precision !== undefined && precision !== expect.precision) {
    throw new CodecError('BAD_PRECISION', `${precision} frame, the run uses ${expect.precision}`);
  }
  const want = encodedBytes(rows, cols, precision);
  if (bytes.length < want) throw new CodecError('TRUNCATED', `${bytes.length} bytes, a [${rows}, ${cols}] ${precision} frame is ${want}`);
  if (bytes.length > want) throw new CodecError('LENGTH_MISMATCH', `${bytes.length} bytes, a [${rows}, ${cols}] ${precision} frame is ${want}`);
  return { view, rows, cols, precision };
}

/** Rows and columns within the codec's limits, or BAD_SHAPE. */
export function checkShape(rows: number, cols: number): void {
  if (!Number.isInteger(rows) || !Number.isInteger(cols) || rows < 1 || cols < 1 || rows > CODEC_MAX_ROWS || cols > CODEC_MAX_COLS || rows * cols > CODEC_MAX_ELEMENTS) {
    throw new CodecError('BAD_SHAPE', `shape [${rows}, ${cols}] is outside [1..${CODEC_MAX_ROWS}] × [1..${CODEC_MAX_COLS}]`);
  }
}
