import * as tf from '@tensorflow/tfjs';
import { layerNormComposite, setFusedLayerOp } from '../layers';
import { mulberry32 } from '../rng';
import { requireWebGPUBackend } from './codec-gpu';
import { checkFusedOp, type FusedKernelCheck } from './fused-check';
import { layerNormGradGBProgram, layerNormGradXProgram, layerNormProgram } from './layernorm-programs';
import { multiPrograms } from './multi-program';

/** Layer norm in WGSL (./layernorm-programs.ts): 1 launch forward (which keeps each row's mean and rstd), 2 backward, instead of ~9 and ~25. */
const fusedLayerNormOp = tf.customGrad(((x: tf.Tensor2D, g: tf.Tensor1D, b: tf.Tensor1D, save: tf.GradSaveFunc) => {
  const [rows, cols] = x.shape;
  const [y, stats] = multiPrograms.run(layerNormProgram(rows, cols), [x, g, b]);
  save([x, g, stats!]);
  stats!.dispose();
  return {
    value: y!,
    gradFunc: (dy: tf.Tensor | tf.Tensor[], [sx, sg, sstats]: tf.Tensor[]) => [
      ...multiPrograms.run(layerNormGradXProgram(rows, cols), [sx!, sg!, dy as tf.Tensor, sstats!]),
      ...multiPrograms.run(layerNormGradGBProgram(rows, cols), [sx!, dy as tf.Tensor, sstats!]),
    ],
  };
}) as unknown as Parameters<typeof tf.customGrad>[0]) as unknown as (x: tf.Tensor2D, g: tf.Tensor, b: tf.Tensor) => tf.Tensor2D;

export const fusedLayerNormGPU = (x: tf.Tensor2D, g: tf.Tensor, b: tf.Tensor): tf.Tensor2D => fusedLayerNormOp(x, g, b);

/**
 * The fused layer norm against the composite (layerNormComposite, tfjs's own
 * ops on the same backend), forward and backward (dx, dg, db), on seeded
 * random shapes with odd sizes, widths either side of the 64-thread row
 * workgroup. TOLERANCE 1e-4 of each output's largest magnitude: the two sum a
 * row or a column in a different order (~1e-6 apart on SwiftShader), and a
 * wrong formula, index or reduction is O(1) off.
 */
export async function layerNormKernelCheck(): Promise<FusedKernelCheck> {
  requireWebGPUBackend();
  const random = mulberry32(24);
  const values = (n: number, scale: number, offset = 0): Float32Array => Float32Array.from({ length: n }, () => offset + (random() * 2 - 1) * scale);
  const cases = ([[7, 33], [130, 256], [5, 63], [64, 129]] as const).map(([rows, cols]) => ({
    inputs: [tf.tensor2d(values(rows * cols, 3, 0.5), [rows, cols]), tf.tensor1d(values(cols, 1, 1)), tf.tensor1d(values(cols, 0.5))],
    dy: tf.tensor2d(values(rows * cols, 1), [rows, cols]),
  }));
  const f = (x: tf.Tensor, g: tf.Tensor, b: tf.Tensor) => fusedLayerNormOp(x as tf.Tensor2D, g, b);
  const c = (x: tf.Tensor, g: tf.Tensor, b: tf.Tensor) => layerNormComposite(x as tf.Tensor2D, g, b);
  return checkFusedOp('layer norm', f as (...xs: tf.Tensor[]) => tf.Tensor, c as (...xs: tf.Tensor[]) => tf.Tensor, cases, 1e-4);
}

/** Runs layerNormKernelCheck and, when it holds, makes layerNorm use the fused kernels on WebGPU. */
export async function useFusedLayerNorm(): Promise<FusedKernelCheck> {
  const check = await layerNormKernelCheck();
  setFusedLayerOp('layerNorm', 'webgpu', check.ok ? fusedLayerNormGPU : undefined);
  return check;
}
