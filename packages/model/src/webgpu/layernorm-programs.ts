import { ElementwiseProgram, FlatProgram } from './flat-program';

/**
 * Layer norm as WGSL programs (issue 24's fused hot paths). tfjs composes a
 * layer norm (layers.ts: moments, subtract, rsqrt, two multiplies, add) from
 * ~9 launches and its gradient from ~25; these make it 1 forward and 4
 * backward (stats, dx, dg, and tfjs's own column sum for db).
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

/** rowHead, then the mean and rstd of x's row. */
function rowStats(): string {
  return `${rowHead()}
    var total = 0.0;
    ${rowSum('tahRow', 'x[base + c]', 'total')}
    let mean = total / f32(cols);
    var squares = 0.0;
    ${rowSum('tahRow', '(x[base + c] - mean) * (x[base + c] - mean)', 'squares')}
    let rstd = inverseSqrt(squares / f32(cols) + ${LAYER_NORM_EPS.toExponential()});`;
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

/** y = (x − mean) · rstd · g + b, per row of x [rows, cols]. */
export class LayerNormProgram extends RowProgram {
  shaderKey = 'tah_layer_norm';
  variableNames = ['x', 'g', 'b'];

  body(): string {
    return `
    ${rowStats()}
    if (!inRange) { return; }
    for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}) {
      result[base + c] = (x[base + c] - mean) * rstd * g[c] + b[c];
    }`;
  }
}

/** Each row's mean and rstd: [rows, 2]. */
export class LayerNormStatsProgram extends RowProgram {
  shaderKey = 'tah_layer_norm_stats';
  variableNames = ['x'];

  constructor(rows: number) {
    super(rows, 2);
  }

  body(): string {
    return `
    ${rowStats()}
    if (inRange && lid == 0) {
      result[row * 2] = mean;
      result[row * 2 + 1] = rstd;
    }`;
  }
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

/** dg = Σ_rows dy · x̂: one thread per column, down the rows. */
export class LayerNormGradGProgram extends ElementwiseProgram {
  shaderKey = 'tah_layer_norm_dg';
  variableNames = ['x', 'dy', 'stats'];

  getUserCode(): string {
    return `
  fn main(index : i32) {
    if (index < uniforms.size) {
      let rows = uniforms.xShape.x;
      let cols = uniforms.xShape.y;
      var s = 0.0;
      for (var r = 0; r < rows; r = r + 1) {
        s = s + dy[r * cols + index] * (x[r * cols + index] - stats[r * 2]) * stats[r * 2 + 1];
      }
      result[index] = s;
    }
  }
`;
  }
}
