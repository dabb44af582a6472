import * as tf from '@tensorflow/tfjs';
import type { ProbeOutcome, ProbeResult, TabBackend } from './messages';

/**
 * A short workload shaped like a transformer block's step: a [256, 128] ×
 * [128, 512] projection, GELU-like nonlinearity, the way back down, softmax
 * attention scores over 64 positions, and the gradient of it all. Small
 * enough to run in well under a second on WASM; big enough that kernel
 * launch and shader compilation do not dominate once warm.
 */
function workload(): () => Promise<void> {
  const x = tf.randomNormal([256, 128], 0, 1, 'float32', 1);
  const w1 = tf.randomNormal([128, 512], 0, 0.05, 'float32', 2);
  const w2 = tf.randomNormal([512, 128], 0, 0.05, 'float32', 3);
  const f = (a: tf.Tensor, b: tf.Tensor): tf.Scalar =>
    tf.tidy(() => {
      const h = tf.matMul(x, a);
      const g = tf.mul(h, tf.sigmoid(tf.mul(h, 1.702)));
      const y = tf.matMul(g, b).reshape([4, 64, 128]);
      const scores = tf.softmax(tf.matMul(y, y, false, true).div(Math.sqrt(128)));
      return tf.matMul(scores, y).square().mean() as tf.Scalar;
    });
  const grads = tf.grads(f);
  return async () => {
    const out = tf.tidy(() => grads([w1, w2]));
    await Promise.all(out.map((t) => t.data()));
    out.forEach((t) => t.dispose());
  };
}

async function fallbackAdapter(): Promise<boolean | undefined> {
  type Adapter = { info?: { isFallbackAdapter?: boolean }; isFallbackAdapter?: boolean };
  const gpu = (navigator as unknown as { gpu?: { requestAdapter(): Promise<Adapter | null> } }).gpu;
  const adapter = await gpu?.requestAdapter();
  if (!adapter) return undefined;
  return adapter.info?.isFallbackAdapter ?? adapter.isFallbackAdapter ?? false;
}

/**
 * Initialises each candidate backend, times the workload on it (one warm-up
 * run, then the median of three) and picks the fastest — unless `override`
 * names one, which is then used if it initialises. A software WebGPU adapter
 * usually loses to WASM, and the timing shows it.
 */
export async function probeBackends(
  candidates: TabBackend[],
  override: TabBackend | undefined,
  onProgress: (backend: TabBackend, done: number, total: number) => void,
): Promise<ProbeOutcome> {
  const results: ProbeResult[] = [];
  const list = override ? [override] : candidates;
  for (const [i, backend] of list.entries()) {
    onProgress(backend, i, list.length);
    if (!tf.findBackendFactory(backend)) {
      const insecure = backend === 'webgpu' && !globalThis.isSecureContext;
      results.push({ backend, error: insecure ? 'WebGPU needs a secure context (https or localhost)' : 'not available in this browser' });
      continue;
    }
    try {
      const result: ProbeResult = { backend };
      // Asked before tfjs makes its device: an adapter request after it can cost that device (seen on SwiftShader).
      if (backend === 'webgpu') result.fallbackAdapter = await fallbackAdapter();
      if (!(await tf.setBackend(backend))) throw new Error('did not initialise');
      await tf.ready();
      const run = workload();
      await run();
      const times: number[] = [];
      for (let k = 0; k < 3; k++) {
        const t0 = performance.now();
        await run();
        times.push(performance.now() - t0);
      }
      result.ms = times.sort((a, b) => a - b)[1]!;
      results.push(result);
    } catch (e) {
      results.push({ backend, error: (e as Error).message || String(e) });
    }
  }
  onProgress(list[list.length - 1]!, list.length, list.length);
  const working = results.filter((r) => r.ms !== undefined).sort((a, b) => a.ms! - b.ms!);
  if (working.length === 0) throw new Error(`no compute backend initialised: ${results.map((r) => `${r.backend}: ${r.error}`).join('; ')}`);
  const chosen = working[0]!;
  await tf.setBackend(chosen.backend);
  const why = override
    ? `${override} was asked for (?backend=${override})`
    : working.length === 1
      ? `${chosen.backend} is the only backend that initialised`
      : `${chosen.backend} ran the probe fastest (${working.map((r) => `${r.backend} ${r.ms!.toFixed(0)} ms${r.fallbackAdapter ? ', software adapter' : ''}`).join(', ')})`;
  return { results, chosen: chosen.backend, why };
}
