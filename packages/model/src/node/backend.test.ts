import * as tf from '@tensorflow/tfjs';
import { describe, expect, it } from 'vitest';
import { initNodeBackend } from './backend';

describe('the Node backend', () => {
  it('takes WebGPU through Dawn when asked, and where no adapter is found says why by name and falls back to WASM, as a tab does', async () => {
    const lines: string[] = [];
    const backend = await initNodeBackend('webgpu', (l) => lines.push(l));
    expect(tf.getBackend()).toBe(backend);
    if (backend === 'webgpu') {
      // A machine with a GPU and its Vulkan driver (the lent device).
      expect(lines).toEqual([expect.stringMatching(/^backend webgpu on /)]);
    } else {
      // These CI machines: Dawn loads and finds no adapter.
      expect(backend).toBe('wasm');
      expect(lines).toEqual([expect.stringMatching(/^webgpu unavailable, using wasm: Dawn found no WebGPU adapter/)]);
    }
    // Training works on what was chosen.
    const x = tf.tensor2d([1, 2, 3, 4], [2, 2]);
    expect(Array.from(await tf.matMul(x, x).data())).toEqual([7, 10, 15, 22]);
  });
});
