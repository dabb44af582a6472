/**
 * WGSL kernels for the optimizer step on WebGPU, as tfjs-backend-webgpu
 * programs (one class per shader, like ./programs.ts).
 *
 * Why: measured on an H100 through Dawn (bench/results/gpu.json), a
 * training step is bound by kernel launches, not arithmetic. The composite
 * optimizer (clip by global norm, then AdamW) launches about 18 small
 * kernels per parameter tensor: ~530 for a `gpu` stage, 400 ms of a ~1 s
 * step, of which the GPU worked ~57 ms; and tfjs reduces a whole tensor to
 * a scalar in one workgroup, so each `Sum` of the gradient norm ran ~1.4 ms.
 * These kernels do the same arithmetic in 4 launches per tensor:
 *
 * - SumSquaresProgram: Σ g² of up to SUM_INPUTS gradients, SUM_PARTIALS
 *   partial sums each, every workgroup busy, all gradients into one output
 *   that one Sum adds.
 * - AdamWMomentProgram, AdamWVarianceProgram, AdamWWeightProgram: the new
 *   first moment, second moment and weights, each from what it needs of
 *   (p, m, v, g, scale),
 *   the gradient scaled by the clip factor on the way in. tfjs runs one output
 *   per program, so each recomputes the little it needs of the others.
 *
 * The arithmetic follows optim.ts operation for operation, in float32 with
 * the same float32 constants (adamwReference in ./optim-gpu.ts is that
 * composite written out in JS, and equals the WASM backend's result bit for
 * bit); a GPU may contract a·b + c into one fused multiply-add and its sqrt
 * need not be correctly rounded, so the kernels agree within a stated
 * relative tolerance, which optimizerKernelCheck measures on the device.
 */
import type { WebGPUProgram } from '@tensorflow/tfjs-backend-webgpu';

/** Partial sums per gradient tensor from SumSquaresProgram (one per workgroup). */
export const SUM_PARTIALS = 128;
const SUM_WORKGROUP = 256;

/** Gradients one SumSquaresProgram reads: WebGPU guarantees 8 storage buffers per shader stage, one is the output. */
export const SUM_INPUTS = 7;

/**
 * Up to SUM_INPUTS gradients (float32, flattened) → SUM_PARTIALS partial
 * sums of g² each, written in order at `offset` of a shared output of
 * `total` floats: workgroup w of gradient j sums g_j[i]² over its threads'
 * indices, grid-stride. The optimizer runs one launch per SUM_INPUTS
 * gradients into one output, so a stage's norm is one Sum of that output (no
 * AddN of ~30 inputs, which exceeds WebGPU's 8 storage buffers per stage).
 * Each partial sums the same elements in the same order whatever else the
 * launch reads.
 */
export class SumSquaresProgram implements WebGPUProgram {
  outputShape: number[];
  shaderKey: string;
  dispatchLayout: { x: number[] } = { x: [0] };
  dispatch: [number, number, number];
  variableNames: string[];
  workgroupSize: [number, number, number] = [SUM_WORKGROUP, 1, 1];
  uniforms = 'offset : i32,';

  constructor(
    total: number,
    private readonly inputs = 1,
  ) {
    if (!Number.isInteger(inputs) || inputs < 1 || inputs > SUM_INPUTS) throw new RangeError(`SumSquaresProgram reads 1 to ${SUM_INPUTS} gradients, not ${inputs}`);
    this.outputShape = [total];
    this.variableNames = Array.from({ length: inputs }, (_, j) => `g${j}`);
    this.dispatch = [SUM_PARTIALS * inputs, 1, 1];
    this.shaderKey = `tah_sum_squares_${inputs}`;
  }

  getUserCode(): string {
    const wg = SUM_WORKGROUP;
    const sums = this.variableNames
      .map(
        (g, j) => `
    if (which == ${j}) {
      for (var i = group * ${wg} + lid; i < uniforms.${g}Shape; i = i + ${SUM_PARTIALS * wg}) {
        let x = ${g}[i];
        s = s + x * x;
      }
    }`,
      )
      .join('');
    return `
  var<workgroup> tahPartial : array<f32, ${wg}>;

  fn main(index : i32) {
    let lid = index % ${wg};
    let which = index / ${wg * SUM_PARTIALS};
    let group = (index / ${wg}) % ${SUM_PARTIALS};
    var s = 0.0;${sums}
    tahPartial[lid] = s;
    workgroupBarrier();
    for (var k = ${wg / 2}u; k > 0u; k = k >> 1u) {
      if (u32(lid) < k) {
        tahPartial[lid] = tahPartial[lid] + tahPartial[lid + i32(k)];
      }
      workgroupBarrier();
    }
    if (lid == 0) { result[uniforms.offset + which * ${SUM_PARTIALS} + group] = tahPartial[0]; }
  }
`;
  }
}

/** The uniforms every AdamW program takes, in this order (float32 each). */
export const ADAMW_UNIFORMS = 'beta1 : f32, oneMinusBeta1 : f32, beta2 : f32, oneMinusBeta2 : f32, c1 : f32, c2 : f32, epsilon : f32, lr : f32, decayFactor : f32,';

/**
 * WGSL shared by the AdamW programs: the clipped gradient and the new moments,
 * as optim.ts computes them. A program binds only the inputs its shader reads
 * (tfjs builds the bind group layout from the shader, and an unread binding
 * would be missing from it), so each includes the functions it needs.
 */
const GRAD_WGSL = `
  fn tahGrad(i : i32) -> f32 { return g[i] * scale[0]; }`;
const MOMENT_WGSL = `
  fn tahMoment(i : i32) -> f32 {
    let a = m[i] * uniforms.beta1;
    let b = tahGrad(i) * uniforms.oneMinusBeta1;
    return a + b;
  }`;
const VARIANCE_WGSL = `
  fn tahVariance(i : i32) -> f32 {
    let gc = tahGrad(i);
    let a = v[i] * uniforms.beta2;
    let b = (gc * gc) * uniforms.oneMinusBeta2;
    return a + b;
  }`;

abstract class AdamWProgramBase implements WebGPUProgram {
  outputShape: number[];
  abstract shaderKey: string;
  dispatchLayout: { x: number[] } = { x: [0] };
  dispatch: [number, number, number];
  abstract variableNames: string[];
  workgroupSize: [number, number, number] = [64, 1, 1];
  size = true;
  uniforms = ADAMW_UNIFORMS;

  constructor(n: number) {
    this.outputShape = [n];
    this.dispatch = [Math.ceil(n / this.workgroupSize[0]), 1, 1];
  }

  protected abstract body(): string;
  protected abstract functions(): string;

  getUserCode(): string {
    return `
  ${this.functions()}
  fn main(index : i32) {
    if (index < uniforms.size) {
      ${this.body()}
    }
  }
`;
  }
}

/** m' = β1·m + (1−β1)·ĝ, with ĝ = g · clip scale. */
export class AdamWMomentProgram extends AdamWProgramBase {
  shaderKey = 'tah_adamw_moment';
  variableNames = ['m', 'g', 'scale'];
  protected functions(): string {
    return GRAD_WGSL + MOMENT_WGSL;
  }
  protected body(): string {
    return 'result[index] = tahMoment(index);';
  }
}

/** v' = β2·v + (1−β2)·ĝ². */
export class AdamWVarianceProgram extends AdamWProgramBase {
  shaderKey = 'tah_adamw_variance';
  variableNames = ['v', 'g', 'scale'];
  protected functions(): string {
    return GRAD_WGSL + VARIANCE_WGSL;
  }
  protected body(): string {
    return 'result[index] = tahVariance(index);';
  }
}

/** p' = p·(1 − lr·wd) − lr · (m'/c1) / (√(v'/c2) + ε); decayFactor is 1 for tensors without decay. */
export class AdamWWeightProgram extends AdamWProgramBase {
  shaderKey = 'tah_adamw_weight';
  variableNames = ['p', 'm', 'v', 'g', 'scale'];
  protected functions(): string {
    return GRAD_WGSL + MOMENT_WGSL + VARIANCE_WGSL;
  }
  protected body(): string {
    return `let mHat = tahMoment(index) / uniforms.c1;
      let denom = sqrt(tahVariance(index) / uniforms.c2) + uniforms.epsilon;
      let update = mHat / denom;
      let decayed = p[index] * uniforms.decayFactor;
      result[index] = decayed - update * uniforms.lr;`;
  }
}
