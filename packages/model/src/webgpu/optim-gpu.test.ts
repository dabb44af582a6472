// What of the fused WebGPU optimizer can be checked without a GPU: that its
// reference (adamwReference) is exactly what the WASM backend computes, step
// after step, so the kernels' check on a GPU (optimizerKernelCheck, run in
// Chromium on SwiftShader by e2e/webgpu.test.ts and by every WebGPU miner)
// holds them to the WASM arithmetic; and the backend guard.
import * as tf from '@tensorflow/tfjs';
import '@tensorflow/tfjs-backend-wasm';
import { beforeAll, describe, expect, it } from 'vitest';
import { AdamW, addMany, fusedAdamWActive, type AdamWConstants } from '../optim';
import type { ParamSpec } from '../params';
import { mulberry32 } from '../rng';
import { WebGPUBackendRequiredError, adamwReference, optimizerKernelCheck, useFusedOptimizer } from './index';

describe('fused AdamW, host side', () => {
  beforeAll(async () => {
    await tf.setBackend('wasm');
  });

  it('adamwReference equals clip-by-global-norm then AdamW on the WASM backend, bit for bit, over steps with and without clipping', async () => {
    const random = mulberry32(7);
    const specs: ParamSpec[] = [
      { name: 'w', shape: [33, 17], init: 'zeros', decay: true },
      { name: 'b', shape: [17], init: 'zeros', decay: false },
    ];
    const initial = Object.fromEntries(specs.map((s) => [s.name, Float32Array.from({ length: s.shape.reduce((a, b) => a * b) }, () => (random() * 2 - 1) * 0.1)]));
    const params = Object.fromEntries(specs.map((s) => [s.name, tf.variable(tf.tensor(initial[s.name]!, s.shape))]));
    const adam = new AdamW(params, specs, { weightDecay: 0.1 });
    expect(fusedAdamWActive()).toBe(false);
    const state: Record<string, { p: Float32Array; m: Float32Array; v: Float32Array }> = Object.fromEntries(specs.map((s) => [s.name, { p: initial[s.name]!, m: new Float32Array(initial[s.name]!.length), v: new Float32Array(initial[s.name]!.length) }]));
    const maxNorm = 1;
    for (let step = 1; step <= 4; step++) {
      // Steps 1 and 3 are clipped (large gradients), 2 and 4 are not.
      const magnitude = step % 2 === 1 ? 3 : 1e-3;
      const g = Object.fromEntries(specs.map((s) => [s.name, Float32Array.from({ length: state[s.name]!.p.length }, () => (random() * 2 - 1) * magnitude)]));
      const lr = 0.003 * step;
      const norm = adam.applyClipped(Object.fromEntries(specs.map((s) => [s.name, tf.tensor(g[s.name]!, s.shape)])), lr, maxNorm);
      const n = (await norm.data())[0]!;
      norm.dispose();
      const scale = Math.fround(maxNorm / Math.max(n, maxNorm));
      if (step % 2 === 1) expect(scale).toBeLessThan(1);
      else expect(scale).toBe(1);
      const f = Math.fround;
      const k: AdamWConstants = { beta1: f(0.9), oneMinusBeta1: f(1 - 0.9), beta2: f(0.95), oneMinusBeta2: f(1 - 0.95), c1: f(1 - 0.9 ** step), c2: f(1 - 0.95 ** step), epsilon: f(1e-8), lr: f(lr), decayFactor: f(1 - lr * 0.1) };
      for (const s of specs) {
        const st = state[s.name]!;
        const next = adamwReference(st.p, st.m, st.v, g[s.name]!, scale, { ...k, decayFactor: s.decay ? k.decayFactor : 1 });
        state[s.name] = next;
        const got = new Uint32Array(((await params[s.name]!.data()) as Float32Array).buffer);
        expect(got).toEqual(new Uint32Array(next.p.buffer));
      }
    }
    adam.dispose();
    Object.values(params).forEach((p) => p.dispose());
  });

  it('addMany adds any number of tensors in chunks of at most 7 (WebGPU binds 8 storage buffers) with the bits of one AddN', async () => {
    const random = mulberry32(11);
    for (const count of [1, 2, 7, 8, 13, 30]) {
      const ts = Array.from({ length: count }, () => tf.tensor1d(Float32Array.from({ length: 129 }, () => (random() * 2 - 1) * 10 ** (4 * random() - 2))));
      const [a, b] = [addMany(ts), tf.addN(ts)];
      expect(new Uint32Array(((await a.data()) as Float32Array).buffer)).toEqual(new Uint32Array(((await b.data()) as Float32Array).buffer));
      tf.dispose([a, b, ...ts]);
    }
  });

  it('the kernel check and installing the fused step require the WebGPU backend', async () => {
    await expect(optimizerKernelCheck()).rejects.toBeInstanceOf(WebGPUBackendRequiredError);
    await expect(useFusedOptimizer()).rejects.toBeInstanceOf(WebGPUBackendRequiredError);
    expect(fusedAdamWActive()).toBe(false);
  });
});
