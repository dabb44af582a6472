import '@tensorflow/tfjs';
import '@tensorflow/tfjs-backend-wasm';
import { selectBackend, type BackendName } from '../backend';
import { installWasmBatchMatMul } from '../wasm/batch-matmul';

// Batched products on the project's kernel, as in every tab (wasm/batch-matmul.ts): miners and validator agree bit for bit.
installWasmBatchMatMul();

/** WebGPU in Node could not start; `reason` says why (no adapter, no driver), and the caller falls back. */
export class NodeWebGPUUnavailable extends Error {
  override name = 'NodeWebGPUUnavailable';
}

/**
 * navigator.gpu in Node, from Dawn (the npm package `webgpu`, whose prebuilt
 * dawn.node ships in the package), then tfjs's WebGPU backend registered and
 * selected: the same backend and WGSL codec kernels as a tab. Resolves with
 * the adapter's description; throws NodeWebGPUUnavailable naming why not
 * (on a machine without a GPU and Vulkan driver Dawn finds no adapter).
 */
export async function initNodeWebGPU(): Promise<{ adapter: string }> {
  let gpu: GPU;
  try {
    const { create, globals } = (await import('webgpu')) as unknown as { create: (flags: string[]) => GPU; globals: Record<string, unknown> };
    Object.assign(globalThis, globals);
    // Dawn toggles for experiments, space-separated (e.g. TAH_DAWN_FLAGS='enable-dawn-features=skip_validation').
    gpu = create((process.env.TAH_DAWN_FLAGS ?? '').split(/\s+/).filter(Boolean));
  } catch (e) {
    throw new NodeWebGPUUnavailable(`Dawn (the webgpu package) did not load: ${(e as Error).message}`);
  }
  const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!adapter) throw new NodeWebGPUUnavailable('Dawn found no WebGPU adapter (no GPU, or no Vulkan driver for it)');
  // tfjs-backend-webgpu asks navigator.gpu when it initialises; Node 20 has no navigator.
  const nav = ((globalThis as { navigator?: object }).navigator ??= {}) as { gpu?: GPU };
  if (!nav.gpu) Object.defineProperty(nav, 'gpu', { value: gpu, configurable: true });
  await import('@tensorflow/tfjs-backend-webgpu');
  const info = (adapter as GPUAdapter & { info?: { description?: string; vendor?: string; architecture?: string } }).info;
  return { adapter: [info?.vendor, info?.architecture, info?.description].filter(Boolean).join(' ') || 'unnamed adapter' };
}

/**
 * Node adapter: WASM (tfjs-node cannot install here), falling back to the
 * pure-JS CPU backend; with `webgpu` asked for, WebGPU through Dawn first,
 * and when it cannot start, WASM as a tab falls back, with the reason told
 * to `log`.
 */
export async function initNodeBackend(preferred: BackendName = 'wasm', log: (line: string) => void = () => {}): Promise<BackendName> {
  if (preferred === 'webgpu') {
    try {
      const { adapter } = await initNodeWebGPU();
      const chosen = await selectBackend(['webgpu']);
      // Fewer submits, as the tab and the miner run (webgpu/steady-state.ts: one gpu stage trains 20% faster).
      if (chosen === 'webgpu') {
        const { SUBMIT_EVERY_DISPATCHES } = await import('../webgpu/steady-state');
        (await import('@tensorflow/tfjs')).env().set('WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE', SUBMIT_EVERY_DISPATCHES);
      }
      log(`backend webgpu on ${adapter}`);
      return chosen;
    } catch (e) {
      log(`webgpu unavailable, using wasm: ${(e as Error).message}`);
    }
  }
  return selectBackend(preferred === 'cpu' ? ['cpu'] : ['wasm', 'cpu']);
}
