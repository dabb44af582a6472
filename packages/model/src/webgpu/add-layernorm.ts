import * as tf from '@tensorflow/tfjs';
import { addLayerNormComposite, setFusedLayerOp, type AddNormed } from '../layers';
import { mulberry32 } from '../rng';
import { requireWebGPUBackend } from './codec-gpu';
import { checkFusedOp, foldChecks, type FusedKernelCheck } from './fused-check';
import { ROW_WORKGROUP, layerNormGradGBProgram, rowDx, rowDxSums, rowProgram, rowStats } from './layernorm-programs';
import { type MultiProgram, multiPrograms } from './multi-program';

/**
 * A residual add and the layer norm that reads its sum (layers.ts,
 * addLayerNorm) as one registered tfjs kernel with two outputs: forward one
 * launch, backward two, where tfjs ran an add, the norm, a pad for a narrow x
 * and a slice for a lane forward, and backward the norm's gradient plus an add
 * accumulating the gradient of the sum (it feeds the norm and the next
 * residual add) and a slice for a narrow x. With every residual add of a
 * block taken so, the stream's gradient is accumulated inside the kernels and
 * tfjs launches no add for it.
 *
 * Forward (one workgroup of ROW_WORKGROUP threads per row): s = pad(x) + a,
 * its mean and rstd, and either [s, norm(s)] or, with a lane, [norm(s), the
 * first `lane` columns of s]. Backward: the same row statistics again, and
 * ds = (the gradient arriving for s, or for the lane, zero-extended) + the
 * norm's dx, written once for a and, narrowed, for x; then dg and db
 * (layerNormGradGBProgram).
 */
const KERNEL = 'TahAddLayerNorm';

interface Dims {
  rows: number;
  cols: number;
  xCols: number;
  /** 0: no lane (outputs s and the norm); else the lane's width (outputs the norm and the lane). */
  lane: number;
}

/** WGSL: s[c] of this row, from x (zero past its width) and a. */
const SUM = (c: string) => `(select(0.0, x[row * u.xCols + ${c}], ${c} < u.xCols) + a[base + ${c}])`;

function uniforms(d: Dims, extra: Array<{ name: string; value: number }> = []): MultiProgram['uniforms'] {
  return [
    { name: 'cols', type: 'u32', value: d.cols },
    { name: 'xCols', type: 'u32', value: d.xCols },
    { name: 'lane', type: 'u32', value: d.lane },
    ...extra.map((e) => ({ ...e, type: 'u32' as const })),
  ];
}

export function addLayerNormProgram(d: Dims): MultiProgram {
  const outputs = d.lane
    ? [
        { name: 'normed', shape: [d.rows, d.cols] },
        { name: 'laneOut', shape: [d.rows, d.lane] },
      ]
    : [
        { name: 'sum', shape: [d.rows, d.cols] },
        { name: 'normed', shape: [d.rows, d.cols] },
      ];
  return rowProgram(
    d.rows,
    { kind: 'tah_add_layer_norm', key: d.lane ? 'tah_add_layer_norm_lane' : 'tah_add_layer_norm', outputs, inputs: ['x', 'a', 'g', 'b'], uniforms: uniforms(d) },
    `${rowStats(SUM)}
  for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}u) {
    let v = ${SUM('c')};
    normed[base + c] = (v - mean) * rstd * g[c] + b[c];
    ${d.lane ? 'if (c < u.lane) { laneOut[row * u.lane + c] = v; }' : 'sum[base + c] = v;'}
  }`,
  );
}

/** dsum [rows, cols], the rows' mean and rstd [rows, 2] and, for a narrow x, dx [rows, xCols]. */
export function addLayerNormGradProgram(d: Dims, resCols: number): MultiProgram {
  const narrow = d.xCols < d.cols;
  return rowProgram(
    d.rows,
    {
      kind: 'tah_add_layer_norm_grad',
      key: `tah_add_layer_norm_grad${narrow ? '_narrow' : ''}`,
      outputs: [{ name: 'dsum', shape: [d.rows, d.cols] }, { name: 'stats', shape: [d.rows, 2] }, ...(narrow ? [{ name: 'dx', shape: [d.rows, d.xCols] }] : [])],
      inputs: ['x', 'a', 'g', 'dy', 'dres'],
      uniforms: uniforms(d, [{ name: 'resCols', value: resCols }]),
    },
    `${rowStats(SUM)}${rowDxSums(SUM)}
  for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}u) {
    let v = select(0.0, dres[row * u.resCols + c], c < u.resCols) + ${rowDx(SUM, 'c')};
    dsum[base + c] = v;
    ${narrow ? 'if (c < u.xCols) { dx[row * u.xCols + c] = v; }' : ''}
  }
  if (lid == 0u) {
    stats[row * 2u] = mean;
    stats[row * 2u + 1u] = rstd;
  }`,
  );
}

function dims(x: tf.TensorInfo, a: tf.TensorInfo, lane: number): Dims {
  return { rows: a.shape[0]!, cols: a.shape[1]!, xCols: x.shape[1]!, lane };
}

let registered = false;

/** Registers the kernel on the WebGPU backend and its gradient (once). */
function register(): void {
  if (registered) return;
  tf.registerKernel({
    kernelName: KERNEL,
    backendName: 'webgpu',
    kernelFunc: ({ inputs, attrs }) => {
      const { x, a, g, b } = inputs as Record<'x' | 'a' | 'g' | 'b', tf.TensorInfo>;
      return multiPrograms.launch(addLayerNormProgram(dims(x, a, Number((attrs as { lane?: number }).lane ?? 0))), [x, a, g, b]);
    },
  });
  tf.registerGradient({
    kernelName: KERNEL,
    inputsToSave: ['x', 'a', 'g'],
    gradFunc: (dy, saved, attrs) => {
      const [x, a, g] = saved as [tf.Tensor2D, tf.Tensor2D, tf.Tensor];
      const d = dims(x!, a!, Number((attrs as { lane?: number }).lane ?? 0));
      // Outputs [s, normed], or [normed, lane].
      const [d0, d1] = dy as tf.Tensor[];
      const [dres, dnormed] = d.lane ? [d1!, d0!] : [d0!, d1!];
      const [dsum, stats, dxNarrow] = multiPrograms.run(addLayerNormGradProgram(d, dres.shape[1]!), [x!, a!, g!, dnormed, dres]);
      const [dg, db] = multiPrograms.run(layerNormGradGBProgram(d.rows, d.cols, d.xCols), [x!, a!, dnormed, stats!]);
      stats!.dispose();
      return { x: () => dxNarrow ?? tf.clone(dsum!), a: () => dsum!, g: () => dg!, b: () => db! };
    },
  });
  registered = true;
}

export function fusedAddLayerNormGPU(x: tf.Tensor2D, a: tf.Tensor2D, g: tf.Tensor, b: tf.Tensor, lane?: number): AddNormed {
  if (x.shape[1] > a.shape[1] || (lane !== undefined && (lane < 1 || lane > a.shape[1]))) throw new RangeError(`addLayerNorm: x [${x.shape}] wider than a [${a.shape}], or a lane of ${lane}`);
  register();
  const [o0, o1] = tf.engine().runKernel(KERNEL, { x, a, g, b }, { lane: lane ?? 0 }) as tf.Tensor2D[];
  return lane ? { normed: o0!, lane: o1! } : { sum: o0!, normed: o1! };
}

/**
 * The fused add and norm against the composite (addLayerNormComposite, tfjs's
 * own ops), forward and backward (dx, da, dg, db), both outputs compared (the
 * check's function concatenates them), on seeded random shapes: odd widths
 * either side of the 64-thread row workgroup, an x as wide as a and a narrow
 * one (the bottleneck's lane returning), with and without a lane taken.
 * TOLERANCE 1e-4 of each output's largest magnitude, as the layer norm's.
 */
export async function addLayerNormKernelCheck(): Promise<FusedKernelCheck> {
  requireWebGPUBackend();
  const random = mulberry32(30);
  const values = (n: number, scale: number, offset = 0): Float32Array => Float32Array.from({ length: n }, () => offset + (random() * 2 - 1) * scale);
  const shapes: Array<{ rows: number; cols: number; xCols: number; lane?: number }> = [
    { rows: 7, cols: 33, xCols: 33 },
    { rows: 130, cols: 256, xCols: 256, lane: 8 },
    { rows: 5, cols: 63, xCols: 8 },
    { rows: 64, cols: 129, xCols: 4, lane: 5 },
  ];
  const results: FusedKernelCheck[] = [];
  for (const s of shapes) {
    const inputs = [tf.tensor2d(values(s.rows * s.xCols, 2, 0.3), [s.rows, s.xCols]), tf.tensor2d(values(s.rows * s.cols, 2, 0.2), [s.rows, s.cols]), tf.tensor1d(values(s.cols, 1, 1)), tf.tensor1d(values(s.cols, 0.5))];
    const width = s.cols + (s.lane ?? s.cols);
    const dy = tf.tensor2d(values(s.rows * width, 1), [s.rows, width]);
    const both = (r: AddNormed) => tf.concat(s.lane ? [r.normed, r.lane!] : [r.sum!, r.normed], 1);
    const f = (x: tf.Tensor, a: tf.Tensor, g: tf.Tensor, b: tf.Tensor) => both(fusedAddLayerNormGPU(x as tf.Tensor2D, a as tf.Tensor2D, g, b, s.lane));
    const c = (x: tf.Tensor, a: tf.Tensor, g: tf.Tensor, b: tf.Tensor) => both(addLayerNormComposite(x as tf.Tensor2D, a as tf.Tensor2D, g, b, s.lane));
    results.push(await checkFusedOp(`add and layer norm${s.xCols < s.cols ? ` (x ${s.xCols} wide)` : ''}${s.lane ? `, lane ${s.lane}` : ''}`, f as (...xs: tf.Tensor[]) => tf.Tensor, c as (...xs: tf.Tensor[]) => tf.Tensor, [{ inputs, dy }], 1e-4));
  }
  return foldChecks(results);
}

/** Runs addLayerNormKernelCheck and, when it holds, makes addLayerNorm use the fused kernel on WebGPU. */
export async function useFusedAddLayerNorm(): Promise<FusedKernelCheck> {
  const check = await addLayerNormKernelCheck();
  setFusedLayerOp('addLayerNorm', 'webgpu', check.ok ? fusedAddLayerNormGPU : undefined);
  return check;
}
