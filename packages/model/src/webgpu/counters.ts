// tfjs's op enums, to name its element-wise programs (their shader keys carry the number).
import { BinaryOpType } from '@tensorflow/tfjs-backend-webgpu/dist/binary_op_util';
import { UnaryOpType } from '@tensorflow/tfjs-backend-webgpu/dist/unary_op_util';
import { requireWebGPUBackend } from './codec-gpu';
import { type MultiProgram, multiPrograms } from './multi-program';

/**
 * What bounds a WebGPU training step on a fast GPU is not arithmetic but
 * launches and allocations (docs/gpu.md). These are the counts of the calls
 * that cost the CPU, made by anything on the tfjs WebGPU backend's device:
 * tfjs's own programs, ours (codec, optimizer) and read-backs alike.
 */
export interface GpuCounts {
  /** Compute dispatches (dispatchWorkgroups and its indirect form): one per kernel launch. */
  dispatches: number;
  /** GPUDevice.createBuffer: new allocations (tfjs's pool reuses storage and uniform buffers, not read-back staging buffers). */
  buffersCreated: number;
  /** Bytes of those allocations. */
  bytesCreated: number;
  /** GPUQueue.submit calls. */
  submits: number;
  /** GPUQueue.writeBuffer calls (uniforms and uploads). */
  writes: number;
  /** GPUDevice.createBindGroup calls (one per dispatch in tfjs). */
  bindGroups: number;
  /** Compute passes begun. */
  passes: number;
}

export interface GpuCounter {
  /** The counts since installation or the last reset. */
  read(): GpuCounts;
  /** tfjs programs run since then, by kind (their shader key's family: `binary_Mul`, `matMulPacked`, `tah_adamw`...): what a fused program would replace. */
  kernels(): Record<string, number>;
  reset(): void;
  /** Puts the device's own methods back. */
  uninstall(): void;
}

const ZERO: GpuCounts = { dispatches: 0, buffersCreated: 0, bytesCreated: 0, submits: 0, writes: 0, bindGroups: 0, passes: 0 };

type Fn = (...args: never[]) => unknown;

/**
 * Counts the WebGPU calls made on the current tfjs WebGPU backend's device
 * from now on, by wrapping the device's, its queue's, and every command
 * encoder's and compute pass's methods on those objects themselves (not their
 * prototypes): the same code counts in a tab (Chromium's WebGPU) and in Node
 * (Dawn). Throws WebGPUBackendRequiredError on any other backend.
 */
export function countGpuWork(): GpuCounter {
  const backend = requireWebGPUBackend() as unknown as { device: GPUDevice; queue?: GPUQueue };
  const device = backend.device;
  const queue = backend.queue ?? device.queue;
  let counts: GpuCounts = { ...ZERO };
  let kernels: Record<string, number> = {};
  const restore: Array<() => void> = [];
  let installed = true;

  /** Replaces obj[name] with a counting wrapper on the object itself; `after` may wrap what it returns. */
  function wrap<T extends object>(obj: T, name: string, count: (args: unknown[]) => void, after?: (result: unknown) => void, keep = true): void {
    const own = Object.prototype.hasOwnProperty.call(obj, name);
    const original = (obj as Record<string, Fn>)[name]!;
    (obj as Record<string, unknown>)[name] = function (this: unknown, ...args: never[]) {
      if (installed) count(args);
      const result = original.apply(this, args);
      if (installed) after?.(result);
      return result;
    };
    if (keep) restore.push(() => (own ? ((obj as Record<string, unknown>)[name] = original) : delete (obj as Record<string, unknown>)[name]));
  }

  wrap(device, 'createBuffer', (args) => {
    counts.buffersCreated++;
    counts.bytesCreated += Number((args[0] as GPUBufferDescriptor | undefined)?.size ?? 0);
  });
  wrap(device, 'createBindGroup', () => counts.bindGroups++);
  wrap(backend, 'runWebGPUProgram', (args) => {
    const kind = kernelKind(String((args[0] as { shaderKey?: string } | undefined)?.shaderKey ?? 'unknown'));
    kernels[kind] = (kernels[kind] ?? 0) + 1;
  });
  // Our multi-output programs (./multi-program.ts) launch beside tfjs's, counted by kind the same way.
  wrap(multiPrograms, 'launch', (args) => {
    const kind = (args[0] as MultiProgram).kind;
    kernels[kind] = (kernels[kind] ?? 0) + 1;
  });
  wrap(queue, 'submit', () => counts.submits++);
  wrap(queue, 'writeBuffer', () => counts.writes++);
  // Encoders and passes are short-lived objects: wrap each as it is made (they need no restoring).
  const countPass = (pass: GPUComputePassEncoder): void => {
    wrap(pass, 'dispatchWorkgroups', () => counts.dispatches++, undefined, false);
    wrap(pass, 'dispatchWorkgroupsIndirect', () => counts.dispatches++, undefined, false);
  };
  const countEncoder = (encoder: GPUCommandEncoder): void => wrap(encoder, 'beginComputePass', () => counts.passes++, (pass) => countPass(pass as GPUComputePassEncoder), false);
  wrap(device, 'createCommandEncoder', () => {}, (encoder) => countEncoder(encoder as GPUCommandEncoder));
  // tfjs keeps its current command encoder and compute pass across calls: ones made before now are counted from now on.
  const current = backend as unknown as { commandEncoder?: GPUCommandEncoder | null; computePassEncoder?: GPUComputePassEncoder | null };
  if (current.commandEncoder) countEncoder(current.commandEncoder);
  if (current.computePassEncoder) countPass(current.computePassEncoder);

  return {
    read: () => ({ ...counts }),
    kernels: () => ({ ...kernels }),
    reset: () => {
      counts = { ...ZERO };
      kernels = {};
    },
    uninstall: () => {
      installed = false;
      for (const r of restore.reverse()) r();
    },
  };
}

/** A shader key's family: the op for tfjs's element-wise and reduce programs (`binary_MUL`), the first word for others, ours whole. */
function kernelKind(key: string): string {
  if (key.startsWith('tah_')) return key;
  const [kind, op] = key.split('_');
  if (kind === 'binary') return `binary_${(BinaryOpType as unknown as Record<string, string>)[op!] ?? op}`;
  if (kind === 'unary') return `unary_${(UnaryOpType as unknown as Record<string, string>)[op!] ?? op}`;
  if (kind === 'reduce') return `reduce_${op}`;
  return kind!;
}
