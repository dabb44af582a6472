import * as tf from '@tensorflow/tfjs';
import type { WebGPUProgram } from '@tensorflow/tfjs-backend-webgpu';
import { requireWebGPUBackend } from './codec-gpu';

/**
 * What the fused programs (layer norm, GELU) share: a flat dispatch layout,
 * so tfjs calls `main(index)` with the global invocation index, over
 * `workgroups` workgroups of `size` threads. `bounded` programs get tfjs's
 * `uniforms.size` (the output's element count) to stop threads past the end.
 */
export abstract class FlatProgram implements WebGPUProgram {
  outputShape: number[];
  abstract shaderKey: string;
  abstract variableNames: string[];
  dispatchLayout: { x: number[] } = { x: [0] };
  dispatch: [number, number, number];
  workgroupSize: [number, number, number];
  size?: boolean;

  constructor(outputShape: number[], workgroups: number, threads: number, bounded: boolean) {
    this.outputShape = outputShape;
    // The backend folds more than 65535 workgroups into y/z; getGlobalIndex linearises them again.
    this.dispatch = [workgroups, 1, 1];
    this.workgroupSize = [threads, 1, 1];
    if (bounded) this.size = true;
  }

  abstract getUserCode(): string;
}

/** One element per thread, 64 to a workgroup, over an output of n elements. */
export abstract class ElementwiseProgram extends FlatProgram {
  constructor(n: number) {
    super([n], Math.ceil(n / 64), 64, true);
  }
}

/** Runs a program on the WebGPU backend and gives its output as a tensor of `shape` (default: the program's). */
export function runProgram(program: WebGPUProgram, inputs: tf.Tensor[], shape?: number[]): tf.Tensor {
  const backend = requireWebGPUBackend();
  const out = tf.engine().makeTensorFromTensorInfo(backend.runWebGPUProgram(program, inputs, 'float32'));
  if (!shape) return out;
  const reshaped = tf.reshape(out, shape);
  out.dispose();
  return reshaped;
}
