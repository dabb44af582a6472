import * as tf from '@tensorflow/tfjs';
import { CODEC_HEADER_BYTES, CodecError, dequantizeRows, encodeBoundary, quantizeRows } from '../codec';
import { mulberry32 } from '../rng';
import { decodeToTensorGPU, dequantizeRowsGPU, encodeBoundaryGPU, quantizeRowsGPU, requireWebGPUBackend } from './codec-gpu';

export interface CodecKernelCheck {
  rows: number;
  cols: number;
  /** Every row's bf16 scale bit-identical to codec.ts. */
  scalesEqual: boolean;
  /** Largest |GPU int8 − codec.ts int8| over all values (allowed: valueTolerance). */
  maxValueDiff: number;
  /** Largest |GPU − codec.ts| over the dequantized floats (frame upload and on-device round trip). */
  maxDequantDiff: number;
  /** The tolerance the kernels promise for int8 values: 0 (integer arithmetic, see programs.ts). */
  valueTolerance: number;
  /** encodeBoundaryGPU's frame equals encodeBoundary(..., 'int8') byte for byte. */
  framesEqual: boolean;
  /** The dequantized floats equal dequantizeRows bit for bit (signs of zeros included). */
  dequantBitExact: boolean;
  /** Values in the test data that sit exactly on a .5 rounding tie. */
  ties: number;
  /** A row holding Infinity made encodeBoundaryGPU throw CodecError NON_FINITE, as encodeBoundary does. */
  nonFiniteRejected: boolean;
  /** Everything above as promised. */
  ok: boolean;
  /** Wall time of one GPU encode (quantize + read-back + frame) and decode (upload + dequantize + read-back), after a warm-up run that compiles the shaders. */
  ms: number;
  /** The same, for the first (compiling) run. */
  msFirstRun: number;
}

/** Odd parts of these 8-bit significands make float64 round some exact ties away from "ties toward +∞" (see tieTableWGSL). */
const DEVIANT_SIGNIFICANDS = [196, 150, 154, 182, 186, 198, 206, 210, 214, 234, 246, 161, 167, 187, 191, 197, 211, 221, 227, 237, 239, 243, 245, 249, 253];

/**
 * Seeded test matrix. Rows cycle through: zeros (±0), uniform, huge (up to
 * ~3e38), tiny (1e-30), subnormal, all negative, exact .5 ties on scales
 * whose significands float64 rounds oddly, ties on random normal scales,
 * ties on subnormal scales, integers and the extreme ties ±0.5 / ±126.5,
 * a row spanning magnitudes, and neighbours of ties one float32 ulp either side.
 * (Non-finite values are refused, not encoded: checked on their own.)
 */
export function codecCheckData(rows: number, cols: number, seed = 20250601): { data: Float32Array; ties: number } {
  const random = mulberry32(seed);
  const data = new Float32Array(rows * cols);
  const f32 = new Float32Array(1);
  const u32 = new Uint32Array(f32.buffer);
  const sign = () => (random() < 0.5 ? -1 : 1);
  const fromBits = (b: number) => {
    u32[0] = b >>> 0;
    return f32[0]!;
  };
  const step = (x: number, up: boolean) => {
    f32[0] = x;
    u32[0] = u32[0]! + ((x > 0) === up ? 1 : -1);
    return f32[0]!;
  };
  let ties = 0;
  for (let r = 0; r < rows; r++) {
    const row = data.subarray(r * cols, (r + 1) * cols);
    const kind = r % 12;
    // A bf16 scale s = ms · 2^es and the row's max |x| = 127 s, so codec.ts picks exactly s.
    const tieRow = (ms: number, es: number, nOf: () => number) => {
      const s = ms * 2 ** es;
      row[0] = sign() * 127 * s;
      for (let c = 1; c < cols; c++) {
        const n = nOf();
        row[c] = sign() * (n / 2) * s;
        if (n % 2 === 1) ties++;
      }
    };
    const randomN = () => 2 * Math.floor(random() * 127) + 1;
    switch (kind) {
      case 0:
        for (let c = 0; c < cols; c++) row[c] = random() < 0.5 ? -0 : 0;
        break;
      case 1:
        for (let c = 0; c < cols; c++) row[c] = random() * 2 - 1;
        break;
      case 2: {
        const mag = r % 24 === 2 ? 3.3e38 : 1e30;
        for (let c = 0; c < cols; c++) row[c] = (random() * 2 - 1) * mag;
        break;
      }
      case 3:
        for (let c = 0; c < cols; c++) row[c] = (random() * 2 - 1) * 1e-30;
        break;
      case 4:
        for (let c = 0; c < cols; c++) row[c] = sign() * fromBits(Math.floor(random() * (r % 24 === 4 ? 0x800000 : 0x400)));
        break;
      case 5:
        for (let c = 0; c < cols; c++) row[c] = -random() * 10;
        break;
      case 6:
        tieRow(DEVIANT_SIGNIFICANDS[Math.floor(random() * DEVIANT_SIGNIFICANDS.length)]!, Math.floor(random() * 40) - 27, randomN);
        break;
      case 7:
        tieRow(128 + Math.floor(random() * 128), Math.floor(random() * 200) - 120, randomN);
        break;
      case 8:
        // Subnormal scale: s = f · 2^-133, f < 128.
        tieRow(1 + Math.floor(random() * 127), -133, randomN);
        break;
      case 9: {
        const ends = [1, 253, 2, 254, 1, 253];
        let i = 0;
        tieRow(128 + Math.floor(random() * 128), Math.floor(random() * 20) - 10, () => (i < ends.length ? ends[i++]! : 2 * Math.floor(random() * 128)));
        break;
      }
      case 10:
        for (let c = 0; c < cols; c++) row[c] = (random() * 2 - 1) * 10 ** (Math.floor(random() * 8) - 4);
        break;
      default: {
        tieRow(DEVIANT_SIGNIFICANDS[Math.floor(random() * DEVIANT_SIGNIFICANDS.length)]!, Math.floor(random() * 20) - 10, randomN);
        ties -= cols - 1;
        for (let c = 1; c < cols; c++) row[c] = step(row[c]!, c % 2 === 0);
      }
    }
  }
  return { data, ties };
}

/**
 * Runs both kernels on seeded data (see codecCheckData) and compares them
 * with the JS codec (quantizeRows / dequantizeRows / encodeBoundary):
 * scales bit for bit, int8 values (tolerance 0: the kernels compute in
 * integers, exact ties included; see programs.ts), whole frames, and the
 * dequantized floats both from a frame upload and from the on-device
 * quantize → dequantize round trip. Throws WebGPUBackendRequiredError unless
 * the active tfjs backend is 'webgpu'.
 */
export async function codecKernelCheck(rows = 256, cols = 32): Promise<CodecKernelCheck> {
  requireWebGPUBackend();
  const { data, ties } = codecCheckData(rows, cols);
  const expected = encodeBoundary({ rows, cols, data }, 'int8');
  const { scales, values } = quantizeRows(data, rows, cols);
  const expectedFloats = dequantizeRows(scales, values, cols);

  const x = tf.tensor2d(data, [rows, cols], 'float32');
  try {
    const run = async () => {
      const t0 = performance.now();
      const frame = await encodeBoundaryGPU(x);
      const decoded = decodeToTensorGPU(frame, rows, cols);
      let floats: Float32Array;
      try {
        floats = (await decoded.data()) as Float32Array;
      } finally {
        decoded.dispose();
      }
      return { frame, floats, ms: performance.now() - t0 };
    };
    const first = await run();
    const { frame, floats, ms } = await run();

    const valuesAt = CODEC_HEADER_BYTES + rows * 2;
    let scalesEqual = frame.length === expected.length;
    for (let i = CODEC_HEADER_BYTES; scalesEqual && i < valuesAt; i++) if (frame[i] !== expected[i]) scalesEqual = false;
    const gpuValues = new Int8Array(frame.buffer, frame.byteOffset + valuesAt, rows * cols);
    let maxValueDiff = 0;
    for (let i = 0; i < values.length; i++) maxValueDiff = Math.max(maxValueDiff, Math.abs(gpuValues[i]! - values[i]!));
    const framesEqual = frame.length === expected.length && frame.every((b, i) => b === expected[i]);

    // The frame decode above started from the GPU's own frame; decode codec.ts's too, and run the on-device round trip.
    const fromJsFrame = decodeToTensorGPU(expected, rows, cols);
    const roundTrip = tf.tidy(() => {
      const codes = quantizeRowsGPU(x);
      return dequantizeRowsGPU(codes, cols);
    });
    let maxDequantDiff = 0;
    let dequantBitExact = true;
    try {
      const want = new Uint32Array(expectedFloats.buffer);
      for (const got of [floats, (await fromJsFrame.data()) as Float32Array, (await roundTrip.data()) as Float32Array]) {
        const gotBits = new Uint32Array(got.buffer, got.byteOffset, got.length);
        for (let i = 0; i < got.length; i++) {
          const d = Math.abs(got[i]! - expectedFloats[i]!);
          maxDequantDiff = Math.max(maxDequantDiff, Number.isNaN(d) ? Infinity : d);
          if (gotBits[i] !== want[i]) dequantBitExact = false;
        }
      }
    } finally {
      fromJsFrame.dispose();
      roundTrip.dispose();
    }

    // ±Infinity and NaN are refused at the sender, naming the row, as codec.ts refuses them.
    let nonFiniteRejected = true;
    for (const v of [Infinity, -Infinity, NaN]) {
      const bad = tf.tensor2d([1, 2, 3, 4, 5, v, 7, 8], [2, 4]);
      try {
        await encodeBoundaryGPU(bad);
        nonFiniteRejected = false;
      } catch (e) {
        if (!(e instanceof CodecError && e.code === 'NON_FINITE' && e.message.includes('row 1'))) nonFiniteRejected = false;
      } finally {
        bad.dispose();
      }
    }

    const valueTolerance = 0;
    return {
      rows,
      cols,
      scalesEqual,
      maxValueDiff,
      maxDequantDiff,
      valueTolerance,
      framesEqual,
      dequantBitExact,
      ties,
      nonFiniteRejected,
      ok: scalesEqual && maxValueDiff <= valueTolerance && framesEqual && maxDequantDiff === 0 && dequantBitExact && nonFiniteRejected,
      ms,
      msFirstRun: first.ms,
    };
  } finally {
    x.dispose();
  }
}
