import { readFileSync } from 'node:fs';
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { assembleKernel } from '../../../../scripts/wasm-kernels';
import { initNodeBackend } from '../node/backend';
import { batchMatMulRunner, installWasmBatchMatMul, type WasmBackendLike } from './batch-matmul';

/** A batched product summed over k in order in float32, one multiply and one add per term: what the kernel computes. */
function reference(a: Float32Array, b: Float32Array, n: number, m: number, k: number, p: number): Float32Array {
  const out = new Float32Array(n * m * p);
  for (let q = 0; q < n; q++)
    for (let i = 0; i < m; i++)
      for (let j = 0; j < p; j++) {
        let s = 0;
        for (let t = 0; t < k; t++) s = Math.fround(s + Math.fround(a[(q * m + i) * k + t]! * b[(q * k + t) * p + j]!));
        out[(q * m + i) * p + j] = s;
      }
  return out;
}

const random = (shape: number[], seed: number): tf.Tensor => tf.randomNormal(shape, 0, 1, 'float32', seed);

beforeAll(async () => {
  await initNodeBackend('wasm');
});

describe("the WASM backend's batched matmul kernel", () => {
  it('is installed in every Node process that trains or replays, and its bytes are what batch-matmul.wat assembles to', async () => {
    expect(tf.getBackend()).toBe('wasm');
    expect(installWasmBatchMatMul()).toBe(true);
    const wat = readFileSync(new URL('./batch-matmul.wat', import.meta.url), 'utf8');
    expect(await assembleKernel('batch-matmul', wat)).toBe(readFileSync(new URL('./batch-matmul-module.ts', import.meta.url), 'utf8'));
  });

  it('computes every batched product exactly as summing over k in order: the 16-wide, 4-wide and single-column paths alike', async () => {
    // [n, m, k, p]: attention's shapes, odd ones that leave each path a tail, one-element matrices.
    for (const [n, m, k, p] of [
      [128, 64, 64, 32],
      [128, 64, 32, 64],
      [4, 17, 33, 19],
      [3, 5, 7, 37],
      [2, 1, 1, 1],
      [5, 3, 40, 3],
    ] as const) {
      const a = random([n, m, k], n + m);
      const b = random([n, k, p], k + p);
      const got = tf.matMul(a, b);
      expect(got.shape).toEqual([n, m, p]);
      expect(await got.data(), `[${n}, ${m}, ${k}, ${p}]`).toEqual(reference((await a.data()) as Float32Array, (await b.data()) as Float32Array, n, m, k, p));
      tf.dispose([a, b, got]);
    }
  });

  it('takes batches of any rank, and gives the same bytes every time', async () => {
    const a = random([2, 3, 8, 16], 1);
    const b = random([2, 3, 16, 20], 2);
    const first = await tf.matMul(a, b).data();
    const again = await tf.matMul(a, b).data();
    expect(again).toEqual(first);
    expect(first).toEqual(reference((await a.data()) as Float32Array, (await b.data()) as Float32Array, 6, 8, 16, 20));
  });

  it("gives the same bytes on a memory of its own (where the backend's heap cannot be shared), operands copied in and out", async () => {
    const backend = tf.backend() as unknown as WasmBackendLike;
    const [n, m, k, p] = [6, 9, 21, 35];
    const a = random([n, m, k], 13);
    const b = random([n, k, p], 14);
    const shared = tf.matMul(a, b);
    const copied = tf.zerosLike(shared);
    const offset = (t: tf.Tensor): number => backend.dataIdMap.get(t.dataId)!.memoryOffset;
    batchMatMulRunner(backend, false)(backend, offset(a), offset(b), offset(copied), n, m, k, p);
    expect(await copied.data()).toEqual(await shared.data());
    tf.dispose([a, b, shared, copied]);
  });

  it("leaves what it does not take to tfjs-backend-wasm's kernel: transposed operands, broadcast batches, 2-D products", async () => {
    const cases: Array<[tf.Tensor, tf.Tensor, boolean, boolean]> = [
      [random([4, 6, 5], 3), random([4, 7, 5], 4), false, true],
      [random([4, 5, 6], 5), random([4, 5, 7], 6), true, false],
      [random([1, 6, 5], 7), random([4, 5, 7], 8), false, false],
      [random([6, 5], 9), random([5, 7], 10), false, false],
    ];
    for (const [a, b, ta, tb] of cases) {
      const wasm = await tf.matMul(a, b, ta, tb).array();
      await tf.setBackend('cpu');
      const cpu = await tf.matMul(tf.tensor(await a.array()), tf.tensor(await b.array()), ta, tb).array();
      await tf.setBackend('wasm');
      const [w, c] = [tf.util.flatten(wasm as number[]) as number[], tf.util.flatten(cpu as number[]) as number[]];
      expect(w.length).toBe(c.length);
      expect(Math.max(...w.map((v, i) => Math.abs(v - c[i]!)))).toBeLessThan(1e-5);
    }
  });

  it('differentiates: the gradients of a batched product through it match the CPU backend', async () => {
    const a = random([3, 4, 6], 11);
    const b = random([3, 6, 5], 12);
    const grads = tf.grads((x: tf.Tensor, y: tf.Tensor) => tf.sum(tf.square(tf.matMul(x, y))));
    const [ga, gb] = grads([a, b]);
    const wasm = [await ga!.data(), await gb!.data()];
    await tf.setBackend('cpu');
    const [ca, cb] = grads([tf.tensor(await a.array()), tf.tensor(await b.array())]);
    const cpu = [await ca!.data(), await cb!.data()];
    await tf.setBackend('wasm');
    for (const [w, c] of [[wasm[0]!, cpu[0]!], [wasm[1]!, cpu[1]!]]) {
      for (let i = 0; i < w.length; i++) expect(Math.abs(w[i]! - c[i]!)).toBeLessThan(1e-4 * (1 + Math.abs(c[i]!)));
    }
  });
});
