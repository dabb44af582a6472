import * as tf from '@tensorflow/tfjs';
import { requireWebGPUBackend } from './codec-gpu';

/**
 * Programs with several outputs, recorded into tfjs-backend-webgpu's own
 * command encoder and compute pass.
 *
 * tfjs runs one output per program, so a kernel that naturally produces two
 * things (AdamW's new weights and both moments; attention's output and each
 * row's log-sum-exp; a layer norm gradient's dg and db) took one launch per
 * output, each recomputing what the others had. Here the WGSL is ours whole:
 * outputs are bound read-write at bindings 0..k−1, inputs read-only after
 * them, then one uniform struct; buffers come from tfjs's pool (the outputs
 * are tfjs tensors like any other), the launch joins tfjs's current compute
 * pass, and the submit follows tfjs's batching (WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE),
 * so ordering with tfjs's own programs is the queue's order.
 *
 * WebGPU guarantees 8 storage buffers per shader stage: outputs + inputs ≤ 8.
 */
export interface MultiProgram {
  /** The kernel's family (bench:webgpu-dispatch counts by it), `tah_` first. */
  kind: string;
  /** Pipeline cache key: kind and every constant baked into the code. */
  key: string;
  outputs: Array<{ name: string; shape: number[] }>;
  /** Names of the inputs, in the order the tensors are passed. */
  inputs: string[];
  /** Scalar uniforms (`u.<name>`), after the workgroup count `u.workgroups`. */
  uniforms?: Array<{ name: string; type: 'i32' | 'u32' | 'f32'; value: number }>;
  /** Threads per workgroup (1-D). */
  threads: number;
  /** Workgroups; more than 65,535 are folded into y (the body sees the linear `wg`). */
  workgroups: number;
  /** Module-scope WGSL (workgroup arrays, helper functions). */
  prelude?: string;
  /** The body of main: `wg` (this workgroup's linear index, < u.workgroups) and `lid` (its thread) are u32. */
  body: string;
}

const MAX_STORAGE_BUFFERS = 8;
const MAX_WORKGROUPS_X = 65535;

/** What of the backend this relies on (tfjs-backend-webgpu 4.22's WebGPUBackend). */
interface Backend {
  device: GPUDevice;
  makeTensorInfo(shape: number[], dtype: 'float32'): tf.TensorInfo;
  uploadToGPU(dataId: object): void;
  tensorToBinding(t: tf.TensorInfo): GPUBindingResource;
  makeUniforms(u: Array<{ type: string; data: number[] }>): GPUBufferBinding;
  commandQueueOwnedIds: WeakSet<object> | Set<object>;
  ensureCommandEncoderReady(): void;
  commandEncoder: GPUCommandEncoder;
  computePassEncoder: GPUComputePassEncoder | null;
  dispatchCountInPass: number;
  endComputePassEncoder(): void;
  submitQueue(): void;
}

const pipelines = new WeakMap<GPUDevice, Map<string, GPUComputePipeline>>();

/** The WGSL of a program: bindings, uniform struct, prelude, main. */
export function multiProgramCode(p: MultiProgram): string {
  const k = p.outputs.length;
  const uniforms = [{ name: 'workgroups', type: 'u32' }, ...(p.uniforms ?? [])];
  // Padded to whole 16-byte rows, as tfjs's makeUniforms lays them out.
  while (uniforms.length % 4 !== 0) uniforms.push({ name: `pad${uniforms.length}`, type: 'u32' });
  return `
struct TahUniforms { ${uniforms.map((u) => `${u.name} : ${u.type},`).join(' ')} }
${p.outputs.map((o, i) => `@group(0) @binding(${i}) var<storage, read_write> ${o.name} : array<f32>;`).join('\n')}
${p.inputs.map((n, i) => `@group(0) @binding(${k + i}) var<storage, read> ${n} : array<f32>;`).join('\n')}
@group(0) @binding(${k + p.inputs.length}) var<uniform> u : TahUniforms;
${p.prelude ?? ''}
@compute @workgroup_size(${p.threads})
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(num_workgroups) nwg : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let wg = wid.x + wid.y * nwg.x;
  if (wg >= u.workgroups) { return; }
  ${p.body}
}
`;
}

function pipelineFor(device: GPUDevice, p: MultiProgram): GPUComputePipeline {
  let cache = pipelines.get(device);
  if (!cache) pipelines.set(device, (cache = new Map()));
  let pipeline = cache.get(p.key);
  if (!pipeline) {
    const k = p.outputs.length;
    const layout = device.createBindGroupLayout({
      entries: [
        ...p.outputs.map((_, i) => ({ binding: i, visibility: GPUShaderStage.COMPUTE, buffer: { type: 'storage' as const } })),
        ...p.inputs.map((_, i) => ({ binding: k + i, visibility: GPUShaderStage.COMPUTE, buffer: { type: 'read-only-storage' as const } })),
        { binding: k + p.inputs.length, visibility: GPUShaderStage.COMPUTE, buffer: { type: 'uniform' as const } },
      ],
    });
    pipeline = device.createComputePipeline({
      label: p.kind,
      layout: device.createPipelineLayout({ bindGroupLayouts: [layout] }),
      compute: { module: device.createShaderModule({ code: multiProgramCode(p), label: p.kind }), entryPoint: 'main' },
    });
    cache.set(p.key, pipeline);
  }
  return pipeline;
}

/**
 * The launcher, an object so that bench:webgpu-dispatch's counter
 * (./counters.ts) can count launches by kind as it does tfjs's.
 */
export const multiPrograms = {
  /** Runs p on tensors; its outputs as tensors the caller owns. */
  run(p: MultiProgram, inputs: tf.Tensor[]): tf.Tensor[] {
    return multiPrograms.launch(p, inputs).map((t) => tf.engine().makeTensorFromTensorInfo(t));
  },

  /** Runs p on tensor infos (a registered kernel's inputs); its outputs as infos, for the engine to track. */
  launch(p: MultiProgram, inputs: tf.TensorInfo[]): tf.TensorInfo[] {
    if (p.outputs.length + inputs.length > MAX_STORAGE_BUFFERS) throw new RangeError(`${p.kind}: ${p.outputs.length} outputs and ${inputs.length} inputs exceed WebGPU's ${MAX_STORAGE_BUFFERS} storage buffers per stage`);
    if (inputs.length !== p.inputs.length) throw new RangeError(`${p.kind} reads ${p.inputs.length} inputs, got ${inputs.length}`);
    for (const t of inputs) if (t.dtype !== 'float32') throw new TypeError(`${p.kind} reads float32 inputs, got ${t.dtype}`);
    const backend = requireWebGPUBackend() as unknown as Backend;
    const device = backend.device;
    const outputs = p.outputs.map((o) => backend.makeTensorInfo(o.shape, 'float32'));
    for (const t of outputs) backend.uploadToGPU(t.dataId);
    for (const t of inputs) backend.uploadToGPU(t.dataId);
    const pipeline = pipelineFor(device, p);
    const uniforms = [{ type: 'uint32', data: [p.workgroups] }, ...(p.uniforms ?? []).map((x) => ({ type: x.type === 'f32' ? 'float32' : x.type === 'i32' ? 'int32' : 'uint32', data: [x.value] }))];
    while (uniforms.length % 4 !== 0) uniforms.push({ type: 'uint32', data: [0] });
    const bindings = [...outputs.map((t) => backend.tensorToBinding(t)), ...inputs.map((t) => backend.tensorToBinding(t)), backend.makeUniforms(uniforms)];
    // As tfjs records its own launches: no buffer these use goes back to the pool before the submit.
    for (const t of [...inputs, ...outputs]) backend.commandQueueOwnedIds.add(t.dataId);
    const bindGroup = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries: bindings.map((resource, binding) => ({ binding, resource })) });
    backend.ensureCommandEncoderReady();
    if (!backend.computePassEncoder) backend.computePassEncoder = backend.commandEncoder.beginComputePass({});
    const x = Math.min(p.workgroups, MAX_WORKGROUPS_X);
    backend.computePassEncoder.setPipeline(pipeline);
    backend.computePassEncoder.setBindGroup(0, bindGroup);
    backend.computePassEncoder.dispatchWorkgroups(x, Math.ceil(p.workgroups / x), 1);
    backend.dispatchCountInPass++;
    if (Number(tf.env().get('WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE')) <= backend.dispatchCountInPass) {
      backend.endComputePassEncoder();
      backend.submitQueue();
    }
    return outputs;
  },
};

/** WGSL: a tree sum (or max) over a workgroup of `threads` threads of each thread's `value` in workgroup array `array`, into `into` (every thread). */
export function workgroupReduce(array: string, value: string, into: string, threads: number, op: 'sum' | 'max' = 'sum'): string {
  const combine = op === 'sum' ? (a: string, b: string) => `${a} + ${b}` : (a: string, b: string) => `max(${a}, ${b})`;
  return `
  ${array}[lid] = ${value};
  workgroupBarrier();
  for (var k = ${threads / 2}u; k > 0u; k = k >> 1u) {
    if (lid < k) { ${array}[lid] = ${combine(`${array}[lid]`, `${array}[lid + k]`)}; }
    workgroupBarrier();
  }
  ${into} = ${array}[0];
  workgroupBarrier();`;
}
