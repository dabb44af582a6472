import * as tf from '@tensorflow/tfjs';
import { requireWebGPUBackend } from './codec-gpu';

/**
 * Dispatches recorded per command buffer before tfjs submits it (its default
 * is 15). Each submit costs the CPU (through Dawn on an H100: 29% of a step;
 * every 128, one gpu stage trained 20% faster, bench/results/gpu.json); a
 * read-back submits whatever is pending anyway. Node's WebGPU backend
 * (node/backend.ts) sets it too.
 */
export const SUBMIT_EVERY_DISPATCHES = 128;

/**
 * The steady state of a training step on WebGPU, for the tab, the Node miner
 * and bench:gpu alike: no buffer created per step (useWriteBufferUploads) and
 * command buffers submitted every SUBMIT_EVERY_DISPATCHES dispatches.
 * bench:webgpu-dispatch counts both.
 */
export function useSteadyStateWebGPU(): void {
  useWriteBufferUploads();
  tf.env().set('WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE', SUBMIT_EVERY_DISPATCHES);
}

/**
 * Uploads without a new buffer each time.
 *
 * tfjs-backend-webgpu (4.22) uploads a tensor made from JS values by taking a
 * storage buffer from its pool and, when the pool had one (unmapped), creating
 * a mapped staging buffer for the values, copying it over in the command
 * encoder and destroying it after the submit: one createBuffer per upload,
 * every step (a `small` middle stage: 67 per microbatch, bench:webgpu-dispatch).
 * `queue.writeBuffer` into the pooled buffer needs no staging buffer of ours
 * (the implementation stages the bytes itself, without an allocation the
 * page makes).
 *
 * Ordering: a write on the queue lands before every command submitted after
 * it. A pooled buffer is free only once no recorded, unsubmitted command uses
 * it (tfjs defers releasing the buffers of tensors its pending encoder uses,
 * `commandQueueOwnedIds`), and with this path no upload records a copy into a
 * buffer, so nothing pending can overwrite the values afterwards. A buffer the
 * pool did not have is created mapped and filled directly, as tfjs does.
 */
interface TensorData {
  values: ArrayLike<number> | null;
  dtype: string;
  shape: number[];
  resource: unknown;
}
interface Backend {
  tensorMap: { get(dataId: object): TensorData | undefined };
  bufferManager: { acquireBuffer(size: number, usage: number, mappedAtCreation?: boolean): GPUBuffer };
  queue: GPUQueue;
  uploadToGPU(dataId: object): void;
  __tahWriteBufferUploads?: boolean;
}

/** Installs the write-buffer upload on the current WebGPU backend (once per backend instance). */
export function useWriteBufferUploads(): void {
  const backend = requireWebGPUBackend() as unknown as Backend;
  if (backend.__tahWriteBufferUploads) return;
  const original = backend.uploadToGPU.bind(backend);
  // The usage tfjs gives every tensor's storage buffer.
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
  backend.uploadToGPU = (dataId: object): void => {
    const data = backend.tensorMap.get(dataId);
    if (!data || data.resource != null || data.values == null || !(data.dtype === 'float32' || data.dtype === 'int32' || data.dtype === 'bool')) return original(dataId);
    const count = data.shape.reduce((a, b) => a * b, 1);
    if (count === 0) return original(dataId);
    const values = data.dtype === 'float32' ? asType(data.values, Float32Array) : asType(data.values, Int32Array);
    const buffer = backend.bufferManager.acquireBuffer(count * 4, usage, true);
    if (buffer.mapState === 'unmapped') {
      backend.queue.writeBuffer(buffer, 0, values as Float32Array<ArrayBuffer> | Int32Array<ArrayBuffer>, 0, count);
    } else {
      (data.dtype === 'float32' ? new Float32Array(buffer.getMappedRange()) : new Int32Array(buffer.getMappedRange())).set(values);
      buffer.unmap();
    }
    // As tfjs does: once uploaded, the values are not kept on the CPU.
    data.values = null;
    data.resource = buffer;
  };
  backend.__tahWriteBufferUploads = true;
}

function asType<T extends Float32Array | Int32Array>(values: ArrayLike<number>, Ctor: { new (v: ArrayLike<number>): T; prototype: T }): T {
  return values instanceof Ctor ? values : new Ctor(values);
}
