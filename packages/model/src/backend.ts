import * as tf from '@tensorflow/tfjs';

export type BackendName = 'webgpu' | 'webgl' | 'wasm' | 'cpu';

/**
 * Selects the first backend in `preference` that registers and initialises.
 * The adapters (the browser's probe, node/backend.ts) import the backend
 * packages; this function only chooses among what was registered.
 */
export async function selectBackend(preference: BackendName[]): Promise<BackendName> {
  for (const name of preference) {
    if (!tf.findBackendFactory(name)) continue;
    try {
      if (await tf.setBackend(name)) {
        await tf.ready();
        return name;
      }
    } catch {
      // try the next one
    }
  }
  throw new Error(`no TensorFlow.js backend among ${preference.join(', ')} initialised`);
}
