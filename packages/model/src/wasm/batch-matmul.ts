import * as tf from '@tensorflow/tfjs';
import { WASM_BASE64 } from './batch-matmul-module';

/**
 * The WASM backend's BatchMatMul with batched operands run by the project's own kernel (batch-matmul.wat), the
 * rest by tfjs-backend-wasm's as before. tfjs-backend-wasm 4.22 hands a 2-D product to XNNPACK (about 15 GMAC/s
 * here) but loops over a batched one in scalar code (about 1 GMAC/s): attention's q·kᵀ and weights·v, a twentieth
 * of a `tiny` stage's arithmetic, took half of its step. The kernel reads and writes the backend's own heap.
 *
 * Every process that trains or replays on WASM installs it (node/backend.ts; the tab's and the Try page's workers):
 * the tab, the Node miner and the validator compute the same bytes, which exact replays need.
 */

interface WasmTensorData {
  memoryOffset: number;
}
export interface WasmBackendLike {
  wasm: { asm?: { memory?: WebAssembly.Memory }; HEAPU8: Uint8Array };
  dataIdMap: { get(dataId: object): WasmTensorData | undefined };
  makeOutput(shape: number[], dtype: 'float32'): tf.TensorInfo;
}

type Bmm = (a: number, b: number, c: number, n: number, m: number, k: number, p: number) => void;
/** Runs the kernel on byte offsets of the backend's heap. */
export type BatchMatMulRun = (backend: WasmBackendLike, a: number, b: number, c: number, n: number, m: number, k: number, p: number) => void;

let installed = false;

const PAGE = 65_536;

/**
 * The kernel for this backend: on the backend's own memory where it exports one it can share (operands and result
 * in place), else on a memory of its own, the operands copied in and the result out (a build whose memory is
 * shared between threads). Either way the same arithmetic: a tab, a miner and the validator always agree.
 */
export function batchMatMulRunner(backend: WasmBackendLike, share = true): BatchMatMulRun {
  const module = new WebAssembly.Module(Uint8Array.from(atob(WASM_BASE64), (c) => c.charCodeAt(0)));
  const memory = backend.wasm.asm?.memory;
  if (share && memory instanceof WebAssembly.Memory) {
    try {
      const bmm = new WebAssembly.Instance(module, { env: { memory } }).exports.bmm as Bmm;
      return (_, a, b, c, n, m, k, p) => bmm(a, b, c, n, m, k, p);
    } catch {
      // not importable here: copies below
    }
  }
  const own = new WebAssembly.Memory({ initial: 1 });
  const bmm = new WebAssembly.Instance(module, { env: { memory: own } }).exports.bmm as Bmm;
  return (backend, a, b, c, n, m, k, p) => {
    const [aBytes, bBytes, cBytes] = [4 * n * m * k, 4 * n * k * p, 4 * n * m * p];
    const need = aBytes + bBytes + cBytes;
    if (own.buffer.byteLength < need) own.grow(Math.ceil((need - own.buffer.byteLength) / PAGE));
    const heap = backend.wasm.HEAPU8;
    const mine = new Uint8Array(own.buffer);
    mine.set(heap.subarray(a, a + aBytes), 0);
    mine.set(heap.subarray(b, b + bBytes), aBytes);
    bmm(0, aBytes, aBytes + bBytes, n, m, k, p);
    backend.wasm.HEAPU8.set(new Uint8Array(own.buffer, aBytes + bBytes, cBytes), c);
  };
}

const sameShape = (x: number[], y: number[]): boolean => x.length === y.length && x.every((v, i) => v === y[i]);

/**
 * Installs the kernel for the 'wasm' backend (once; later calls do nothing). Products it does not take (2-D or
 * broadcast batches, transposed operands, other dtypes, empty shapes) go to tfjs-backend-wasm's own kernel.
 * Returns whether it is installed (false only where tfjs-backend-wasm is not loaded).
 */
export function installWasmBatchMatMul(): boolean {
  if (installed) return true;
  const original = tf.getKernel(tf.BatchMatMul, 'wasm');
  if (!original) return false;
  const fallback = original.kernelFunc;
  let run: BatchMatMulRun | undefined;
  const kernelFunc: tf.KernelFunc = (args) => {
    const { a, b } = args.inputs as { a: tf.TensorInfo; b: tf.TensorInfo };
    const { transposeA, transposeB } = args.attrs as { transposeA: boolean; transposeB: boolean };
    const backend = args.backend as unknown as WasmBackendLike;
    const rank = a.shape.length;
    const batch = a.shape.slice(0, -2);
    const n = batch.reduce((x, y) => x * y, 1);
    const [m, k, p] = [a.shape[rank - 2]!, a.shape[rank - 1]!, b.shape[rank - 1]!];
    const taken =
      !transposeA && !transposeB && a.dtype === 'float32' && b.dtype === 'float32' && rank >= 3 && b.shape.length === rank && sameShape(batch, b.shape.slice(0, -2)) && b.shape[rank - 2] === k && n > 1 && m > 0 && k > 0 && p > 0;
    if (!taken) return fallback(args);
    const out = backend.makeOutput([...batch, m, p], 'float32');
    const offset = (t: tf.TensorInfo): number => backend.dataIdMap.get(t.dataId)!.memoryOffset;
    run ??= batchMatMulRunner(backend);
    run(backend, offset(a), offset(b), offset(out), n, m, k, p);
    return out;
  };
  tf.unregisterKernel(tf.BatchMatMul, 'wasm');
  tf.registerKernel({ ...original, kernelFunc });
  installed = true;
  return true;
}
