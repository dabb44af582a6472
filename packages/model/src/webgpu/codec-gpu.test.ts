// What of the WebGPU codec can be checked without a GPU: the packed layout's
// frame assembly and parsing, the tie table, and the backend guard. The
// kernels themselves run in Chromium (codecKernelCheck).
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { CODEC_HEADER_BYTES, CodecError, decodeBoundary, encodeBoundary } from '../codec';
import { codecCheckData, codecKernelCheck, codesFromFrame, decodeToTensorGPU, encodeBoundaryGPU, frameFromCodes, packedRowWords, tieTableWGSL, WebGPUBackendRequiredError } from './index';

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

describe('webgpu codec, host side', () => {
  beforeAll(async () => {
    await tf.setBackend('cpu');
  });

  it('repacks a frame into the GPU layout and back, byte for byte', () => {
    for (const [rows, cols] of [[256, 32], [97, 13], [3, 1], [5, 130]] as const) {
      const { data } = codecCheckData(rows, cols);
      const frame = encodeBoundary({ rows, cols, data }, 'int8');
      const words = codesFromFrame(frame, rows, cols);
      expect(words.length).toBe(rows * packedRowWords(cols));
      expect(frameFromCodes(words, rows, cols)).toEqual(frame);
    }
  });

  it('rejects the frames decodeBoundary rejects, with the same codes', () => {
    const rows = 4;
    const cols = 6;
    const frame = encodeBoundary({ rows, cols, data: codecCheckData(rows, cols).data }, 'int8');
    expectCodecError(() => codesFromFrame(frame, rows, cols + 1), 'SHAPE_MISMATCH');
    expectCodecError(() => codesFromFrame(frame.subarray(0, frame.length - 1), rows, cols), 'TRUNCATED');
    const minus128 = frame.slice();
    minus128[CODEC_HEADER_BYTES + rows * 2 + 7] = 0x80;
    expectCodecError(() => decodeBoundary(minus128), 'OUT_OF_RANGE');
    expectCodecError(() => codesFromFrame(minus128, rows, cols), 'OUT_OF_RANGE');
    const negativeScale = frame.slice();
    negativeScale[CODEC_HEADER_BYTES + 1] = 0xbf;
    expectCodecError(() => decodeBoundary(negativeScale), 'NON_FINITE');
    expectCodecError(() => codesFromFrame(negativeScale, rows, cols), 'NON_FINITE');
  });

  it('turns a flagged (Infinity) row into NON_FINITE naming that row', () => {
    const words = new Int32Array(3 * packedRowWords(4));
    words[packedRowWords(4)] = 0x7f800000;
    expect(() => frameFromCodes(words, 3, 4)).toThrow(/row 1 holds a non-finite value/);
  });

  it('bakes the float64 tie outcomes into the shader', () => {
    const wgsl = tieTableWGSL();
    expect(wgsl.match(/case \d+u/g)).toHaveLength(25);
    expect(wgsl).toContain('case 49u:');
  });

  it('throws WebGPUBackendRequiredError on another backend', async () => {
    await expect(codecKernelCheck()).rejects.toBeInstanceOf(WebGPUBackendRequiredError);
    const x = tf.zeros([2, 2]) as tf.Tensor2D;
    await expect(encodeBoundaryGPU(x)).rejects.toThrow(WebGPUBackendRequiredError);
    x.dispose();
    expect(() => decodeToTensorGPU(new Uint8Array(20), 1, 2)).toThrow(WebGPUBackendRequiredError);
  });
});
