/**
 * The boundary codec's int8 path on WebGPU: quantize on the GPU and read back
 * only the packed bytes, or upload a frame's bytes and dequantize on the GPU.
 * Frames are byte-identical to ../codec.ts's encodeBoundary(..., 'int8');
 * see ./programs.ts for the packed layout and why the results are exact.
 *
 * Browser only: nothing here imports the WebGPU backend (the caller
 * registers it, e.g. `import '@tensorflow/tfjs-backend-webgpu'`, and selects
 * it), and the package's main index never imports this module.
 */
import * as tf from '@tensorflow/tfjs';
import type { WebGPUBackend } from '@tensorflow/tfjs-backend-webgpu';
import { CODEC_HEADER_BYTES, CodecError, checkShape, decodeBoundary, encodedBytes, readFrameHeader, writeFrameHeader } from '../codec';
import { DequantizeRowsProgram, QuantizeRowsProgram, packedRowWords } from './programs';

const INF_BITS = 0x7f800000;

/** Thrown when a GPU codec function runs while the active tfjs backend is not 'webgpu'. */
export class WebGPUBackendRequiredError extends Error {
  override name = 'WebGPUBackendRequiredError';
  constructor(readonly activeBackend: string) {
    super(`the WebGPU codec kernels need the 'webgpu' tfjs backend; the active backend is '${activeBackend}'`);
  }
}

/** The active backend as a WebGPUBackend, or WebGPUBackendRequiredError. */
export function requireWebGPUBackend(): WebGPUBackend {
  const name = tf.getBackend();
  if (name !== 'webgpu') throw new WebGPUBackendRequiredError(String(name));
  return tf.backend() as unknown as WebGPUBackend;
}

/**
 * Runs QuantizeRowsProgram: float32 [rows, cols] → int32 [rows,
 * packedRowWords(cols)] packed codes (layout in ./programs.ts), left on the
 * GPU. A non-float32 x is cast first. The caller owns the result.
 */
export function quantizeRowsGPU(x: tf.Tensor2D): tf.Tensor2D {
  const backend = requireWebGPUBackend();
  if (x.rank !== 2) throw new CodecError('BAD_SHAPE', `a boundary tensor is rank 2, got rank ${x.rank}`);
  const [rows, cols] = x.shape;
  checkShape(rows, cols);
  const input = x.dtype === 'float32' ? x : tf.cast(x, 'float32');
  try {
    const info = backend.runWebGPUProgram(new QuantizeRowsProgram(rows, cols), [input], 'int32');
    return tf.engine().makeTensorFromTensorInfo(info) as tf.Tensor2D;
  } finally {
    if (input !== x) input.dispose();
  }
}

/**
 * Runs DequantizeRowsProgram: packed codes int32 [rows, packedRowWords(cols)]
 * → float32 [rows, cols]. The caller owns the result.
 */
export function dequantizeRowsGPU(codes: tf.Tensor2D, cols: number): tf.Tensor2D {
  const backend = requireWebGPUBackend();
  const [rows, words] = codes.shape;
  checkShape(rows, cols);
  if (codes.dtype !== 'int32' || words !== packedRowWords(cols)) {
    throw new CodecError('SHAPE_MISMATCH', `packed codes must be int32 [rows, ${packedRowWords(cols)}] for ${cols} columns, got ${codes.dtype} [${codes.shape.join(', ')}]`);
  }
  const info = backend.runWebGPUProgram(new DequantizeRowsProgram(rows, cols), [codes], 'float32');
  return tf.engine().makeTensorFromTensorInfo(info) as tf.Tensor2D;
}

/**
 * The int8 frame of x, equal byte for byte to
 * `encodeBoundary({ rows, cols, data: await x.data() }, 'int8')`, including
 * its CodecErrors (BAD_SHAPE; NON_FINITE for the first row holding ±Infinity
 * or NaN). Only the packed codes come off the
 * GPU: rows·(4 + 4·ceil(cols/4)) bytes instead of rows·cols·4.
 */
export async function encodeBoundaryGPU(x: tf.Tensor2D): Promise<Uint8Array> {
  const codes = quantizeRowsGPU(x);
  let words: Int32Array;
  try {
    words = (await codes.data()) as Int32Array;
  } finally {
    codes.dispose();
  }
  const [rows, cols] = x.shape;
  return frameFromCodes(words, rows, cols);
}

/** Assembles an int8 frame from packed codes read back from the GPU. */
export function frameFromCodes(words: Int32Array, rows: number, cols: number): Uint8Array {
  const w = packedRowWords(cols);
  if (words.length !== rows * w) throw new CodecError('LENGTH_MISMATCH', `${words.length} packed words, [${rows}, ${cols}] needs ${rows * w}`);
  const out = new Uint8Array(encodedBytes(rows, cols, 'int8'));
  const view = writeFrameHeader(out, rows, cols, 'int8');
  const bytes = new Uint8Array(words.buffer, words.byteOffset, words.byteLength);
  const valuesAt = CODEC_HEADER_BYTES + rows * 2;
  for (let r = 0; r < rows; r++) {
    const scaleBits = words[r * w]! >>> 0;
    if ((scaleBits & INF_BITS) === INF_BITS) throw new CodecError('NON_FINITE', `row ${r} holds a non-finite value`);
    view.setUint16(CODEC_HEADER_BYTES + r * 2, scaleBits >>> 16, true);
    const from = (r * w + 1) * 4;
    out.set(bytes.subarray(from, from + cols), valuesAt + r * cols);
  }
  return out;
}

/**
 * Checks an int8 frame the way decodeBoundary does (same CodecErrors) and
 * repacks it into the GPU layout: int32 [rows, packedRowWords(cols)].
 */
export function codesFromFrame(bytes: Uint8Array, rows: number, cols: number): Int32Array {
  const { view } = readFrameHeader(bytes, { rows, cols, precision: 'int8' });

  const w = packedRowWords(cols);
  const words = new Int32Array(rows * w);
  const out = new Uint8Array(words.buffer);
  for (let r = 0; r < rows; r++) {
    const bf16 = view.getUint16(CODEC_HEADER_BYTES + r * 2, true);
    // decodeBoundary rejects a non-finite or negative scale (-0 passes).
    if ((bf16 & 0x7f80) === 0x7f80 || (bf16 & 0x8000 && bf16 !== 0x8000)) {
      const s = new Float32Array(new Uint32Array([bf16 << 16]).buffer)[0];
      throw new CodecError('NON_FINITE', `row ${r} has scale ${s}`);
    }
    words[r * w] = bf16 << 16;
  }
  const valuesAt = bytes.byteOffset + CODEC_HEADER_BYTES + rows * 2;
  const values = new Uint8Array(bytes.buffer, valuesAt, rows * cols);
  const bad = values.indexOf(0x80);
  if (bad >= 0) throw new CodecError('OUT_OF_RANGE', `value ${bad} is -128; the encoder emits [-127, 127]`);
  for (let r = 0; r < rows; r++) out.set(values.subarray(r * cols, (r + 1) * cols), (r * w + 1) * 4);
  return words;
}

/**
 * Decodes a frame into a float32 [rows, cols] tensor on the GPU, equal bit
 * for bit to decodeBoundary(frameBytes, { rows, cols }).data. The frame is
 * checked first (decodeBoundary's CodecErrors); int8 frames are dequantized
 * by DequantizeRowsProgram, fp32 frames are uploaded as they are. The caller
 * owns the result.
 */
export function decodeToTensorGPU(frameBytes: Uint8Array, rows: number, cols: number): tf.Tensor2D {
  requireWebGPUBackend();
  if (readFrameHeader(frameBytes, { rows, cols }).precision === 'fp32') {
    const { data } = decodeBoundary(frameBytes, { rows, cols, precision: 'fp32' });
    return tf.tensor2d(data, [rows, cols], 'float32');
  }
  const codes = tf.tensor2d(codesFromFrame(frameBytes, rows, cols), [rows, packedRowWords(cols)], 'int32');
  try {
    return dequantizeRowsGPU(codes, cols);
  } finally {
    codes.dispose();
  }
}
