import * as tf from '@tensorflow/tfjs';
import { geluComposite, setFusedLayerOp } from '../layers';
import { mulberry32 } from '../rng';
import { requireWebGPUBackend } from './codec-gpu';
import { ElementwiseProgram, runProgram } from './flat-program';
import { checkFusedOp, type FusedKernelCheck } from './fused-check';

/**
 * erf(a) as tfjs-backend-webgpu computes it (Abramowitz and Stegun 7.1.26,
 * tfjs's own constants), so the fused forward differs from the composite's
 * only by the order of the multiplies around it.
 */
const ERF_WGSL = `
  fn tahErf(a : f32) -> f32 {
    let t = 1.0 / (1.0 + ${tf.backend_util.ERF_P} * abs(a));
    return sign(a) * (1.0 - (((((${tf.backend_util.ERF_A5} * t + ${tf.backend_util.ERF_A4}) * t) + ${tf.backend_util.ERF_A3}) * t + ${tf.backend_util.ERF_A2}) * t + ${tf.backend_util.ERF_A1}) * t * exp(-a * a));
  }`;

/** One thread per element of x: `body` computes result[index] from v = x[index], with tahErf at hand. */
abstract class GeluFamilyProgram extends ElementwiseProgram {
  /** WGSL computing result[index] from v = x[index]. */
  abstract body(): string;

  getUserCode(): string {
    return `
  ${ERF_WGSL}
  fn main(index : i32) {
    if (index < uniforms.size) {
      let v = x[index];
      ${this.body()}
    }
  }
`;
  }
}

/** y = 0.5 · x · (1 + erf(x / √2)), one thread per element. */
export class GeluProgram extends GeluFamilyProgram {
  shaderKey = 'tah_gelu';
  variableNames = ['x'];

  body(): string {
    return `result[index] = v * 0.5 * (tahErf(v * ${Math.SQRT1_2}) + 1.0);`;
  }
}

/** dx = dy · (0.5 · (1 + erf(x / √2)) + x · exp(−x² / 2) / √(2π)): GELU's exact derivative (erf′ as tfjs takes it, 2/√π · e^(−u²)). */
export class GeluGradProgram extends GeluFamilyProgram {
  shaderKey = 'tah_gelu_grad';
  variableNames = ['x', 'dy'];

  body(): string {
    return `
      let u = v * ${Math.SQRT1_2};
      let cdf = 0.5 * (tahErf(u) + 1.0);
      result[index] = dy[index] * (cdf + v * 0.5 * ${2 / Math.sqrt(Math.PI)} * exp(-u * u) * ${Math.SQRT1_2});`;
  }
}

/** GELU in WGSL: 1 launch forward and 1 backward, instead of 5 and ~9. */
const fusedGeluOp = tf.customGrad(((x: tf.Tensor, save: tf.GradSaveFunc) => {
  save([x]);
  return {
    value: runProgram(new GeluProgram(x.size), [x], x.shape),
    gradFunc: (dy: tf.Tensor | tf.Tensor[], [sx]: tf.Tensor[]) => runProgram(new GeluGradProgram(sx!.size), [sx!, dy as tf.Tensor], sx!.shape),
  };
}) as unknown as Parameters<typeof tf.customGrad>[0]) as unknown as (x: tf.Tensor) => tf.Tensor;

export const fusedGeluGPU = (x: tf.Tensor): tf.Tensor => fusedGeluOp(x);

/**
 * The fused GELU against the composite (geluComposite: tfjs's mul, erf, add
 * on the same backend), forward and backward, on seeded random sizes that are
 * no multiple of the workgroup, values over the range activations take.
 * TOLERANCE 1e-5 of each output's largest magnitude: the same erf
 * approximation in another order of multiplies is a few float32 ulps off.
 */
export async function geluKernelCheck(): Promise<FusedKernelCheck> {
  requireWebGPUBackend();
  const random = mulberry32(25);
  const values = (n: number, scale: number): Float32Array => Float32Array.from({ length: n }, () => (random() * 2 - 1) * scale);
  const cases = ([[7, 33], [130, 1024], [1, 1]] as const).map(([rows, cols]) => ({ inputs: [tf.tensor2d(values(rows * cols, 6), [rows, cols])], dy: tf.tensor2d(values(rows * cols, 1), [rows, cols]) }));
  return checkFusedOp('gelu', fusedGeluOp, geluComposite, cases, 1e-5);
}

/** Runs geluKernelCheck and, when it holds, makes gelu use the fused kernels on WebGPU. */
export async function useFusedGelu(): Promise<FusedKernelCheck> {
  const check = await geluKernelCheck();
  setFusedLayerOp('gelu', 'webgpu', check.ok ? fusedGeluGPU : undefined);
  return check;
}
