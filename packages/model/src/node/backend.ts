import '@tensorflow/tfjs';
import '@tensorflow/tfjs-backend-wasm';
import { selectBackend, type BackendName } from '../backend';

/** Node adapter: WASM (tfjs-node cannot install here), falling back to the pure-JS CPU backend. */
export async function initNodeBackend(preferred: BackendName = 'wasm'): Promise<BackendName> {
  return selectBackend(preferred === 'cpu' ? ['cpu'] : ['wasm', 'cpu']);
}
