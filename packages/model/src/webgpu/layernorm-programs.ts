import { FlatProgram } from './flat-program';
import { type MultiProgram, workgroupReduce } from './multi-program';

/**
 * Layer norm as WGSL programs (issue 24's fused hot paths). tfjs composes a
 * layer norm (layers.ts: moments, subtract, rsqrt, two multiplies, add) from
 * ~9 launches and its gradient from ~25; these make it 1 forward (y and
 * each row's mean and rstd, kept for the backward) and 2 backward (dx; dg
 * and db together).
 *
 * x is [rows, cols] (rows = batch × time), g and b are [cols]. A row is
 * reduced by one workgroup of ROW_WORKGROUP threads: a strided loop, then a
 * tree in workgroup memory; the mean and the variance in two passes, as
 * tf.moments computes them (mean of the squared deviations), so the
 * arithmetic is the same formula, summed in another order.
 */
export const ROW_WORKGROUP = 64;
/** LN_EPS of layers.ts. */
export const LAYER_NORM_EPS = 1e-5;

/** WGSL: the sum over a row of `expr` (in terms of the column c) into `into`, every thread of the workgroup taking part. */
function rowSum(array: string, expr: string, into: string): string {
  const wg = ROW_WORKGROUP;
  return `
    {
      var s = 0.0;
      if (inRange) {
        for (var c = lid; c < cols; c = c + ${wg}) { s = s + (${expr}); }
      }
      ${array}[lid] = s;
      workgroupBarrier();
      for (var k = ${wg / 2}u; k > 0u; k = k >> 1u) {
        if (u32(lid) < k) { ${array}[lid] = ${array}[lid] + ${array}[lid + i32(k)]; }
        workgroupBarrier();
      }
      ${into} = ${array}[0];
      workgroupBarrier();
    }`;
}

/** The head of a one-workgroup-per-row program over x [rows, cols]: lid, row, cols, inRange, base. */
function rowHead(): string {
  return `
    let lid = index % ${ROW_WORKGROUP};
    let row = index / ${ROW_WORKGROUP};
    let rows = uniforms.xShape.x;
    let cols = uniforms.xShape.y;
    let inRange = row < rows;
    let base = row * cols;`;
}

abstract class RowProgram extends FlatProgram {
  /** One workgroup of ROW_WORKGROUP threads per row of x. */
  constructor(rows: number, outCols: number) {
    super([rows, outCols], rows, ROW_WORKGROUP, false);
  }

  /** The body of main(index), for the row index / ROW_WORKGROUP (workgroup memory: tahRow). */
  abstract body(): string;

  getUserCode(): string {
    return `
  var<workgroup> tahRow : array<f32, ${ROW_WORKGROUP}>;
  fn main(index : i32) {
    ${this.body()}
  }
`;
  }
}

/** WGSL (multi-program body): the mean and rstd of row `row` of x [rows, cols], one workgroup of ROW_WORKGROUP threads. */
export function multiRowStats(x = (c: string) => `x[base + ${c}]`): string {
  return `
  var total = 0.0;
  var s = 0.0;
  for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}u) { s = s + ${x('c')}; }
  ${workgroupReduce('tahRow', 's', 'total', ROW_WORKGROUP)}
  let mean = total / f32(cols);
  var squares = 0.0;
  s = 0.0;
  for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}u) { s = s + (${x('c')} - mean) * (${x('c')} - mean); }
  ${workgroupReduce('tahRow', 's', 'squares', ROW_WORKGROUP)}
  let rstd = inverseSqrt(squares / f32(cols) + ${LAYER_NORM_EPS.toExponential()});`;
}

/**
 * y = (x − mean) · rstd · g + b per row of x [rows, cols], and each row's
 * mean and rstd [rows, 2] for the backward (two outputs, ./multi-program.ts):
 * the gradient needs no launch of its own to recompute them.
 */
export function layerNormProgram(rows: number, cols: number): MultiProgram {
  return {
    kind: 'tah_layer_norm',
    key: 'tah_layer_norm',
    outputs: [
      { name: 'y', shape: [rows, cols] },
      { name: 'stats', shape: [rows, 2] },
    ],
    inputs: ['x', 'g', 'b'],
    uniforms: [{ name: 'cols', type: 'u32', value: cols }],
    threads: ROW_WORKGROUP,
    workgroups: rows,
    prelude: `var<workgroup> tahRow : array<f32, ${ROW_WORKGROUP}>;`,
    body: `
  let row = wg;
  let cols = u.cols;
  let base = row * cols;
  ${multiRowStats()}
  for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}u) {
    y[base + c] = (x[base + c] - mean) * rstd * g[c] + b[c];
  }
  if (lid == 0u) {
    stats[row * 2u] = mean;
    stats[row * 2u + 1u] = rstd;
  }`,
  };
}

/**
 * dx = rstd · (a − mean(a) − x̂ · mean(a · x̂)) with a = g · dy and
 * x̂ = (x − mean) · rstd, per row; mean and rstd from LayerNormStatsProgram.
 */
export class LayerNormGradXProgram extends RowProgram {
  shaderKey = 'tah_layer_norm_dx';
  variableNames = ['x', 'g', 'dy', 'stats'];

  body(): string {
    return `
    ${rowHead()}
    var mean = 0.0;
    var rstd = 0.0;
    if (inRange) {
      mean = stats[row * 2];
      rstd = stats[row * 2 + 1];
    }
    var sumA = 0.0;
    ${rowSum('tahRow', 'g[c] * dy[base + c]', 'sumA')}
    var sumAX = 0.0;
    ${rowSum('tahRow', 'g[c] * dy[base + c] * (x[base + c] - mean) * rstd', 'sumAX')}
    if (!inRange) { return; }
    let n = f32(cols);
    for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}) {
      let xhat = (x[base + c] - mean) * rstd;
      result[base + c] = rstd * (g[c] * dy[base + c] - sumA / n - xhat * (sumAX / n));
    }`;
  }
}

/**
 * dg = Σ_rows dy · x̂ and db = Σ_rows dy (two outputs): one thread per column,
 * down the rows. With `xCols`, the norm's input is the sum pad(x) + a (the
 * fused residual add, ./add-layernorm.ts), computed here as it was forward.
 */
export function layerNormGradGBProgram(rows: number, cols: number, xCols?: number): MultiProgram {
  const threads = 64;
  const added = xCols !== undefined;
  const input = added ? `(select(0.0, x[r * u.xCols + c], c < u.xCols) + a[r * u.cols + c])` : 'x[r * u.cols + c]';
  return {
    kind: 'tah_layer_norm_dgdb',
    key: added ? 'tah_layer_norm_dgdb_add' : 'tah_layer_norm_dgdb',
    outputs: [
      { name: 'dg', shape: [cols] },
      { name: 'db', shape: [cols] },
    ],
    inputs: added ? ['x', 'a', 'dy', 'stats'] : ['x', 'dy', 'stats'],
    uniforms: [
      { name: 'rows', type: 'u32', value: rows },
      { name: 'cols', type: 'u32', value: cols },
      { name: 'xCols', type: 'u32', value: xCols ?? cols },
    ],
    threads,
    workgroups: Math.ceil(cols / threads),
    body: `
  let c = wg * ${threads}u + lid;
  if (c >= u.cols) { return; }
  var sg = 0.0;
  var sb = 0.0;
  for (var r = 0u; r < u.rows; r = r + 1u) {
    let d = dy[r * u.cols + c];
    sg = sg + d * (${input} - stats[r * 2u]) * stats[r * 2u + 1u];
    sb = sb + d;
  }
  dg[c] = sg;
  db[c] = sb;`,
  };
}
