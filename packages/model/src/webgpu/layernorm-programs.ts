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

/** WGSL: the mean and rstd of this row of the norm's input (`x(c)`, default x[base + c]); `s` is its accumulator. */
export function rowStats(x = (c: string) => `x[base + ${c}]`): string {
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
 * WGSL, after the row's mean and rstd: the two row sums of the norm's dx,
 * Σ g·dy and Σ g·dy·x̂ (sumA, sumAX); then rowDx(x, c) is dx at column c:
 * dx = rstd · (a − mean(a) − x̂ · mean(a · x̂)) with a = g · dy, x̂ = (x − mean) · rstd.
 */
export function rowDxSums(x = (c: string) => `x[base + ${c}]`): string {
  return `
  var acc = 0.0;
  for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}u) { acc = acc + g[c] * dy[base + c]; }
  var sumA = 0.0;
  ${workgroupReduce('tahRow', 'acc', 'sumA', ROW_WORKGROUP)}
  acc = 0.0;
  for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}u) { acc = acc + g[c] * dy[base + c] * (${x('c')} - mean) * rstd; }
  var sumAX = 0.0;
  ${workgroupReduce('tahRow', 'acc', 'sumAX', ROW_WORKGROUP)}
  let n = f32(cols);`;
}

export function rowDx(x: (c: string) => string, c: string): string {
  return `rstd * (g[${c}] * dy[base + ${c}] - sumA / n - (${x(c)} - mean) * rstd * (sumAX / n))`;
}

/** A program of one workgroup of ROW_WORKGROUP threads per row (`row`, `cols` = u.cols, `base`; tahRow for reductions). */
export function rowProgram(rows: number, p: Pick<MultiProgram, 'kind' | 'key' | 'outputs' | 'inputs' | 'uniforms'>, body: string): MultiProgram {
  return {
    ...p,
    threads: ROW_WORKGROUP,
    workgroups: rows,
    prelude: `var<workgroup> tahRow : array<f32, ${ROW_WORKGROUP}>;`,
    body: `
  let row = wg;
  let cols = u.cols;
  let base = row * cols;${body}`,
  };
}

/**
 * y = (x − mean) · rstd · g + b per row of x [rows, cols], and each row's
 * mean and rstd [rows, 2] for the backward (two outputs, ./multi-program.ts):
 * the gradient needs no launch of its own to recompute them.
 */
export function layerNormProgram(rows: number, cols: number): MultiProgram {
  const outputs = [
    { name: 'y', shape: [rows, cols] },
    { name: 'stats', shape: [rows, 2] },
  ];
  return rowProgram(
    rows,
    { kind: 'tah_layer_norm', key: 'tah_layer_norm', outputs, inputs: ['x', 'g', 'b'], uniforms: [{ name: 'cols', type: 'u32', value: cols }] },
    `${rowStats()}
  for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}u) {
    y[base + c] = (x[base + c] - mean) * rstd * g[c] + b[c];
  }
  if (lid == 0u) {
    stats[row * 2u] = mean;
    stats[row * 2u + 1u] = rstd;
  }`,
  );
}

/** The norm's dx per row of x [rows, cols], its mean and rstd from the forward's stats. */
export function layerNormGradXProgram(rows: number, cols: number): MultiProgram {
  const x = (c: string) => `x[base + ${c}]`;
  return rowProgram(
    rows,
    { kind: 'tah_layer_norm_dx', key: 'tah_layer_norm_dx', outputs: [{ name: 'dx', shape: [rows, cols] }], inputs: ['x', 'g', 'dy', 'stats'], uniforms: [{ name: 'cols', type: 'u32', value: cols }] },
    `
  let mean = stats[row * 2u];
  let rstd = stats[row * 2u + 1u];${rowDxSums(x)}
  for (var c = lid; c < cols; c = c + ${ROW_WORKGROUP}u) { dx[base + c] = ${rowDx(x, 'c')}; }`,
  );
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
