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
 * These kernels do the same arithmetic in 1 launch per tensor and 1 per
 * SUM_INPUTS tensors:
 *
 * - SumSquaresProgram: Σ g² of up to SUM_INPUTS gradients, SUM_PARTIALS
 *   partial sums each, every workgroup busy, all gradients into one output
 *   that one Sum adds.
 * - clipProgram: the norm and the clip factor from those partial sums.
 * - adamwProgram: the new weights and both moments in one launch per tensor
 *   (three outputs, ./multi-program.ts), the gradient scaled by the clip
 *   factor on the way in.
 *
 * The arithmetic follows optim.ts operation for operation, in float32 with
 * the same float32 constants (adamwReference in ./optim-gpu.ts is that
 * composite written out in JS, and equals the WASM backend's result bit for
 * bit); a GPU may contract a·b + c into one fused multiply-add and its sqrt
 * need not be correctly rounded, so the kernels agree within a stated
 * relative tolerance, which optimizerKernelCheck measures on the device.
 */
import type { WebGPUProgram } from '@tensorflow/tfjs-backend-webgpu';
import { type MultiProgram, workgroupReduce } from './multi-program';

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

/** The AdamW constants (float32 each), uniforms of adamwProgram in this order. */
export const ADAMW_CONSTANTS = ['beta1', 'oneMinusBeta1', 'beta2', 'oneMinusBeta2', 'c1', 'c2', 'epsilon', 'lr', 'decayFactor'] as const;

const ADAMW_THREADS = 64;

/**
 * One launch per parameter tensor: the new weights p', first moment m' and
 * second moment v' (three outputs), from p, m, v, g and the clip scale:
 *
 *   ĝ = g · scale;  m' = β1·m + (1−β1)·ĝ;  v' = β2·v + (1−β2)·ĝ²;
 *   p' = p·(1 − lr·wd) − lr · (m'/c1) / (√(v'/c2) + ε)
 *
 * (decayFactor is 1 for tensors without decay). 3 outputs and 5 inputs: all 8
 * storage buffers WebGPU guarantees a shader stage.
 */
export function adamwProgram(shape: number[], k: Record<(typeof ADAMW_CONSTANTS)[number], number>): MultiProgram {
  const n = shape.reduce((a, b) => a * b, 1);
  return {
    kind: 'tah_adamw',
    key: 'tah_adamw',
    outputs: [
      { name: 'pOut', shape },
      { name: 'mOut', shape },
      { name: 'vOut', shape },
    ],
    inputs: ['p', 'm', 'v', 'g', 'scale'],
    uniforms: [{ name: 'n', type: 'u32', value: n }, ...ADAMW_CONSTANTS.map((name) => ({ name, type: 'f32' as const, value: k[name] }))],
    threads: ADAMW_THREADS,
    workgroups: Math.ceil(n / ADAMW_THREADS),
    body: `
  let i = wg * ${ADAMW_THREADS}u + lid;
  if (i >= u.n) { return; }
  let gc = g[i] * scale[0];
  let mNew = m[i] * u.beta1 + gc * u.oneMinusBeta1;
  let vNew = v[i] * u.beta2 + (gc * gc) * u.oneMinusBeta2;
  let mHat = mNew / u.c1;
  let denom = sqrt(vNew / u.c2) + u.epsilon;
  let update = mHat / denom;
  let decayed = p[i] * u.decayFactor;
  pOut[i] = decayed - update * u.lr;
  mOut[i] = mNew;
  vOut[i] = vNew;`,
  };
}

const CLIP_THREADS = 256;

/**
 * The gradients' global norm and the clip factor from SumSquaresProgram's
 * partial sums, in one launch of one workgroup (tfjs: a Sum, a Sqrt, a
 * Maximum and a Div): norm = √Σ partials, scale = maxNorm / max(norm, maxNorm).
 */
export function clipProgram(partials: number, maxNorm: number): MultiProgram {
  return {
    kind: 'tah_clip',
    key: 'tah_clip',
    outputs: [
      { name: 'norm', shape: [] },
      { name: 'scale', shape: [1] },
    ],
    inputs: ['partials'],
    uniforms: [
      { name: 'n', type: 'u32', value: partials },
      { name: 'maxNorm', type: 'f32', value: maxNorm },
    ],
    threads: CLIP_THREADS,
    workgroups: 1,
    prelude: `var<workgroup> tahSum : array<f32, ${CLIP_THREADS}>;`,
    body: `
  var s = 0.0;
  for (var i = lid; i < u.n; i = i + ${CLIP_THREADS}u) { s = s + partials[i]; }
  var total = 0.0;
  ${workgroupReduce('tahSum', 's', 'total', CLIP_THREADS)}
  if (lid == 0u) {
    let n = sqrt(total);
    norm[0] = n;
    scale[0] = u.maxNorm / max(n, u.maxNorm);
  }`,
  };
}
