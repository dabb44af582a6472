import * as tf from '@tensorflow/tfjs';
import { mmAddComposite, mmComposite, mmTransposedComposite, setFusedLayerOp } from '../layers';
import { mulberry32 } from '../rng';
import { requireWebGPUBackend } from './codec-gpu';
import { checkFusedOp, foldChecks, type FusedKernelCheck } from './fused-check';

/**
 * The model's matmuls on WebGPU with no transpose launched. The composite
 * (layers.ts, mmComposite) transposes explicitly in its gradient, because
 * WASM's transposed matmul is slow; tfjs-backend-webgpu's matMulPacked reads a
 * transposed operand in place, so here tfjs's own matMul and its own gradient
 * (dA = dY · bᵀ, dB = aᵀ · dY as transposed operands) are used as they are,
 * and attention's q · kᵀ is one matmul with b transposed. On a `small` middle
 * stage that is 34 transpose launches fewer per step (bench:webgpu-dispatch).
 */
export const matMulGPU = (a: tf.Tensor, b: tf.Tensor): tf.Tensor => tf.matMul(a, b);
export const matMulTransposedGPU = (a: tf.Tensor, b: tf.Tensor): tf.Tensor => tf.matMul(a, b, false, true);
/** c + a · b with c added in the matmul's epilogue (tfjs's fused matMul, c as a bias of the product's shape): the bottleneck's lane. */
export const matMulAddGPU = (a: tf.Tensor2D, b: tf.Tensor2D, c: tf.Tensor2D): tf.Tensor2D => tf.reshape(tf.fused.matMul({ a, b, bias: tf.reshape(c, [1, ...c.shape]) }), c.shape) as tf.Tensor2D;

/**
 * Each form (a · b, a · bᵀ, c + a · b) against their composites on the same backend, forward and
 * backward (tf.grads), on seeded random shapes with odd sizes, 2-D and
 * batched over two leading axes as attention's heads are. TOLERANCE 1e-5 of
 * each output's largest magnitude: the same products summed in the same tile
 * order (measured 0 on SwiftShader); a wrong operand or index is O(1) off.
 */
export async function matMulKernelCheck(): Promise<{ matMul: FusedKernelCheck; matMulTransposed: FusedKernelCheck; matMulAdd: FusedKernelCheck }> {
  requireWebGPUBackend();
  const random = mulberry32(26);
  const tensor = (shape: number[]): tf.Tensor => tf.tensor(Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, () => random() * 2 - 1), shape);
  const shapes = [
    [[7, 33], [33, 5]],
    [[130, 64], [64, 257]],
    [[2, 3, 17, 9], [2, 3, 9, 17]],
  ] as const;
  const plain = shapes.map(([a, b]) => ({ inputs: [tensor([...a]), tensor([...b])], dy: tensor([...a.slice(0, -1), b[b.length - 1]!]) }));
  // a · bᵀ: b is given as [.., n, k].
  const transposed = shapes.map(([a, b]) => {
    const bt = [...b.slice(0, -2), b[b.length - 1]!, b[b.length - 2]!];
    return { inputs: [tensor([...a]), tensor(bt)], dy: tensor([...a.slice(0, -1), bt[bt.length - 2]!]) };
  });
  // c + a · b: c of the product's shape.
  const added = shapes.slice(0, 2).map(([a, b]) => {
    const out = [a[0], b[1]];
    return { inputs: [tensor([...a]), tensor([...b]), tensor(out)], dy: tensor(out) };
  });
  return {
    matMulAdd: await checkFusedOp('matmul plus a residual', matMulAddGPU as (...xs: tf.Tensor[]) => tf.Tensor, mmAddComposite as (...xs: tf.Tensor[]) => tf.Tensor, added, 1e-5),
    matMul: await checkFusedOp('matmul', matMulGPU, mmComposite, plain, 1e-5),
    matMulTransposed: await checkFusedOp('matmul by a transpose', matMulTransposedGPU, mmTransposedComposite, transposed, 1e-5),
  };
}

/** Runs matMulKernelCheck and makes mm, mmTransposed and mmAdd use tfjs's transposed-operand matmuls on WebGPU where each check holds. */
export async function useTransposedMatMul(): Promise<FusedKernelCheck> {
  const check = await matMulKernelCheck();
  setFusedLayerOp('matMul', 'webgpu', check.matMul.ok ? matMulGPU : undefined);
  setFusedLayerOp('matMulTransposed', 'webgpu', check.matMulTransposed.ok ? matMulTransposedGPU : undefined);
  setFusedLayerOp('matMulAdd', 'webgpu', check.matMulAdd.ok ? matMulAddGPU : undefined);
  // One line for the page: the worst of the three.
  return foldChecks([check.matMul, check.matMulTransposed, check.matMulAdd]);
}
