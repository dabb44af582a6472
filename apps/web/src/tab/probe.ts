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

/** WebGL: is the context a software rasterizer (SwiftShader, llvmpipe)? */
function webglIsSoftware(): boolean | undefined {
  try {
    const gl = (tf.backend() as unknown as { gpgpu?: { gl?: WebGLRenderingContext } }).gpgpu?.gl;
    if (!gl) return undefined;
    const ext = gl.getExtension('WEBGL_debug_renderer_info');
    const renderer = `${String(gl.getParameter(gl.RENDERER))} ${ext ? String(gl.getParameter(ext.UNMASKED_RENDERER_WEBGL)) : ''}`;
    return /swiftshader|llvmpipe|softpipe|software|basic render/i.test(renderer);
  } catch {
    return undefined;
  }
}

/**
 * How much faster than WASM a software GPU adapter must run the probe to be
 * chosen. Its cost per kernel launch grows with a real model's op count, which
 * the short probe under-weights: on this project's CI machine SwiftShader
 * WebGL timed anywhere from 2.9× slower than WASM to faster (under load) on
 * the probe, but trained `small` 5.7× slower (bench/results/browser.json),
 * and a tab that picked it slowed its whole pipeline fourfold.
 */
export const SOFTWARE_ADAPTER_MARGIN = 3;

/**
 * Initialises each candidate backend, then times the workload on each in
 * three interleaved rounds (after a warm-up run each) and keeps each one's
 * fastest time, so a burst of load on the machine does not decide the
 * choice. Picks the fastest; a software GPU adapter (WebGPU's
 * isFallbackAdapter, WebGL on SwiftShader) must beat WASM by
 * SOFTWARE_ADAPTER_MARGIN. `override` names a backend to use if it initialises.
 */
export async function probeBackends(
  candidates: TabBackend[],
  override: TabBackend | undefined,
  onProgress: (backend: TabBackend, done: number, total: number) => void,
): Promise<ProbeOutcome> {
  const results: ProbeResult[] = [];
  const list = override ? [override] : candidates;
  const runs = new Map<TabBackend, () => Promise<void>>();
  const steps = list.length * 4;
  let done = 0;
  for (const backend of list) {
    onProgress(backend, done++, steps);
    if (!tf.findBackendFactory(backend)) {
      const insecure = backend === 'webgpu' && !globalThis.isSecureContext;
      results.push({ backend, error: insecure ? 'WebGPU needs a secure context: open this run at its https:// address (the coordinator serves one with --tls-cert), or at localhost on the coordinator\'s own machine' : 'not available in this browser' });
      continue;
    }
    try {
      const result: ProbeResult = { backend };
      // Asked before tfjs makes its device: an adapter request after it can cost that device (seen on SwiftShader).
      if (backend === 'webgpu') result.fallbackAdapter = await fallbackAdapter();
      if (!(await tf.setBackend(backend))) throw new Error('did not initialise');
      await tf.ready();
      if (backend === 'webgl') result.fallbackAdapter = webglIsSoftware();
      const run = workload();
      await run(); // warm-up: shader compilation, first allocations
      runs.set(backend, run);
      results.push(result);
    } catch (e) {
      results.push({ backend, error: (e as Error).message || String(e) });
    }
  }
  for (let round = 0; round < 3; round++) {
    for (const r of results) {
      const run = runs.get(r.backend);
      if (!run) continue;
      onProgress(r.backend, done++, steps);
      try {
        await tf.setBackend(r.backend);
        const t0 = performance.now();
        await run();
        r.ms = Math.min(r.ms ?? Infinity, performance.now() - t0);
      } catch (e) {
        runs.delete(r.backend);
        r.ms = undefined;
        r.error = (e as Error).message || String(e);
      }
    }
  }
  onProgress(list[list.length - 1]!, steps, steps);
  const working = results.filter((r) => r.ms !== undefined).sort((a, b) => a.ms! - b.ms!);
  if (working.length === 0) throw new Error(`no compute backend initialised: ${results.map((r) => `${r.backend}: ${r.error}`).join('; ')}`);
  const wasm = working.find((r) => r.backend === 'wasm');
  const eligible = working.filter((r) => !r.fallbackAdapter || !wasm || r.ms! * SOFTWARE_ADAPTER_MARGIN < wasm.ms!);
  const chosen = eligible[0] ?? working[0]!;
  await tf.setBackend(chosen.backend);
  const timings = working.map((r) => `${BACKEND_WORDS[r.backend] ?? r.backend} ${r.ms!.toFixed(0)} ms${r.fallbackAdapter ? ' on a software imitation of a graphics card' : ''}`).join(', ');
  const why = override
    ? `${override} was asked for (?backend=${override})`
    : working.length === 1
      ? `${chosen.backend} is the only backend that initialised`
      : chosen === working[0]
        ? `${chosen.backend}: the fastest way to train on this device, in a short test of each (a step shaped like a transformer block's: ${timings})`
        : `${chosen.backend}: ${working[0]!.backend} timed faster, but here it runs on a software imitation of a graphics card (no GPU in use), which trains slower than this short test shows; it is used only when ${SOFTWARE_ADAPTER_MARGIN}× faster than WASM (${timings})`;
  return { results, chosen: chosen.backend, why };
}

/** Each backend as a contributor would recognise it. */
const BACKEND_WORDS: Record<string, string> = { wasm: 'the CPU (WASM)', webgl: 'the graphics card through WebGL', webgpu: 'the graphics card through WebGPU' };
