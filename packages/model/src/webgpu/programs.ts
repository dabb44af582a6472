/**
 * WGSL kernels for the boundary codec's int8 path (see ../codec.ts), written
 * as tfjs-backend-webgpu programs: each class is one shader, run through
 * `(tf.backend() as WebGPUBackend).runWebGPUProgram(program, inputs, dtype)`.
 *
 * ## Packed layout (QuantizeRowsProgram's output, DequantizeRowsProgram's input)
 *
 * An int32 tensor of shape [rows, W] with W = 1 + ceil(cols / 4) (see
 * {@link packedRowWords}). Row r holds:
 *
 *   word 0        the row's scale as float32 bits. The scale is a bfloat16,
 *                 so the low 16 bits are 0 and `bits >>> 16` is exactly the
 *                 bf16 the frame stores. 0 for a row of zeros. 0x7f800000
 *                 (+Infinity) flags a row holding ±Infinity, which
 *                 encodeBoundary rejects with CodecError NON_FINITE; such a
 *                 row's values are all 0.
 *   words 1..W-1  the row's int8 values, four to a word, little-endian:
 *                 column c sits in word 1 + floor(c / 4), bits 8·(c % 4) ..
 *                 8·(c % 4) + 7, two's complement, in [-127, 127]. Bytes
 *                 past the last column are 0.
 *
 * Reading the words back as bytes (little-endian, as every WebGPU host is)
 * gives each row's values as `cols` contiguous bytes at byte offset
 * 4·(r·W + 1): the frame's value block is a per-row copy. The read-back is
 * rows·(4 + 4·ceil(cols/4)) bytes against rows·cols·4 for float32.
 *
 * ## Exactness (tolerance 0)
 *
 * Both kernels do the arithmetic in integers on the float32 bit patterns
 * (`bitcast`), never in GPU float math, so they reproduce codec.ts bit for
 * bit, subnormals included (GPUs may flush float subnormals; integer ops do
 * not):
 *
 * - max|x| is an integer max over the sign-cleared bit patterns (monotone in
 *   magnitude). A NaN counts as infinite: its row's scale is non-finite and
 *   the frame is refused, as codec.ts refuses it (NON_FINITE).
 * - scale: codec.ts computes max/127 in float64, rounds it to float32
 *   (nearest-even, subnormals included), then rounds up to bfloat16. Float64
 *   division rounded to float32 equals the correctly rounded float32
 *   quotient (53 ≥ 2·24 + 2), which the kernel gets by integer long division
 *   of the 24-bit significand by 127; then the same bf16 round-up.
 * - values: codec.ts rounds x·(1/s) in float64 with Math.round (ties toward
 *   +∞) and clamps to ±127. Off a tie, |x/s| lies at least 2^-24 (relative)
 *   from any half-integer while the float64 error is ~2^-52, so the result
 *   is the exact rounding of x/s, which the kernel gets by integer division.
 *   At an exact tie |x/s| = n/2 the float64 product x·(1/s) can land just
 *   below or above n/2, so the outcome depends on (n, the odd part of the
 *   scale's 8-bit significand); {@link tieTableWGSL} derives that table once
 *   by running the very same float64 expression in JS and bakes it into the
 *   shader (25 of the 128 odd significands deviate from "ties toward +∞").
 * - dequantization: v·s has at most 7 + 8 significant bits, so it is exact in
 *   float32 (subnormal results included); the kernel assembles those bits
 *   directly, with IEEE signs (a -0 scale gives ±0 like float64 does).
 *
 * So the GPU frame equals encodeBoundary(..., 'int8') byte for byte and the
 * dequantized tensor equals dequantizeRows(...) bit for bit; codecKernelCheck
 * measures it rather than assuming it.
 */
import type { WebGPUProgram } from '@tensorflow/tfjs-backend-webgpu';

/** int32 words per packed row: one scale word, then ceil(cols / 4) words of four int8 values. */
export function packedRowWords(cols: number): number {
  return 1 + Math.ceil(cols / 4);
}

/** Threads per workgroup of the quantize kernel; one workgroup quantizes one row. */
const QUANTIZE_WORKGROUP = 64;

let tieTable: string | undefined;

/**
 * WGSL for `tahTieAway(n, m, negative) -> bool`: at an exact tie |x/s| = n/2
 * (n odd, ≤ 255), whether codec.ts's `Math.round(x * (1 / s))` rounds the
 * magnitude up (away from zero). m is the odd part of the scale's 8-bit
 * significand; powers of two scale out of float64 products exactly, so
 * (n, m) decides it. Derived here, once, by evaluating that expression.
 */
export function tieTableWGSL(): string {
  if (tieTable !== undefined) return tieTable;
  const cases: string[] = [];
  for (let m = 1; m <= 255; m += 2) {
    const inv = 1 / m;
    const mask = [0, 0, 0, 0];
    let deviant: { pos: boolean; neg: boolean } | undefined;
    for (let n = 1; n <= 255; n += 2) {
      const x = (n * m) / 2; // exact in float32 (< 2^16), |x / m| = n / 2
      const pos = Math.round(x * inv) === (n + 1) / 2;
      const neg = Math.round(-x * inv) === -(n + 1) / 2;
      if (pos && !neg) continue; // the exact-arithmetic outcome: ties toward +∞
      if (deviant && (deviant.pos !== pos || deviant.neg !== neg)) {
        throw new Error(`tie table: significand ${m} deviates both ways`);
      }
      deviant = { pos, neg };
      const k = (n - 1) / 2;
      mask[k >> 5]! |= 1 << (k & 31);
    }
    if (!deviant) continue;
    const words = mask.map((w) => `${w >>> 0}u`).join(', ');
    cases.push(`      case ${m}u: { mask = vec4<u32>(${words}); devPos = ${deviant.pos}; devNeg = ${deviant.neg}; }`);
  }
  tieTable = `
  fn tahTieAway(n : u32, m : u32, negative : bool) -> bool {
    var mask = vec4<u32>(0u);
    var devPos = true;
    var devNeg = false;
    switch m {
${cases.join('\n')}
      default: {}
    }
    let k = min((n - 1u) >> 1u, 127u);
    if (((mask[k >> 5u] >> (k & 31u)) & 1u) != 0u) {
      return select(devPos, devNeg, negative);
    }
    return !negative;
  }`;
  return tieTable;
}

/** Shared WGSL: decoding a bf16-valued scale into significand · 2^exponent. */
const SCALE_PARTS_WGSL = `
  // A bfloat16-valued float32 (sign ignored) as ms · 2^es, ms an integer ≤ 255.
  fn tahScaleSig(sBits : u32) -> u32 {
    let e = (sBits >> 23u) & 0xffu;
    let f = (sBits >> 16u) & 0x7fu;
    return select(f | 0x80u, f, e == 0u);
  }
  fn tahScaleExp(sBits : u32) -> i32 {
    let e = (sBits >> 23u) & 0xffu;
    return select(i32(e) - 134, -133, e == 0u);
  }
`;

/**
 * x: float32 [rows, cols] → int32 [rows, packedRowWords(cols)] in the packed
 * layout described at the top of this file. One workgroup of 64 threads per
 * row: a strided max over the row, a tree reduction in workgroup memory,
 * then each thread packs every 64th word.
 */
export class QuantizeRowsProgram implements WebGPUProgram {
  outputShape: number[];
  shaderKey = 'tah_quantize_rows_int8';
  dispatchLayout: { x: number[] } = { x: [0] };
  dispatch: [number, number, number];
  variableNames = ['x'];
  workgroupSize: [number, number, number] = [QUANTIZE_WORKGROUP, 1, 1];
  /** No program-defined uniforms: rows, cols and W come from tfjs's own xShape / outShape uniforms. */
  uniforms?: string;

  constructor(rows: number, cols: number) {
    this.outputShape = [rows, packedRowWords(cols)];
    // One workgroup per row; the backend folds x > 65535 into y/z and
    // getGlobalIndex() linearises it again.
    this.dispatch = [rows, 1, 1];
  }

  getUserCode(): string {
    const wg = QUANTIZE_WORKGROUP;
    return `
  const TAH_INF_BITS = 0x7f800000u;
  var<workgroup> tahRowMax : array<u32, ${wg}>;

  ${SCALE_PARTS_WGSL}
  ${tieTableWGSL()}

  // |x| as bits, monotone in magnitude; NaN counts as infinite, so its row's scale is
  // non-finite and the frame is refused (NON_FINITE), as codec.ts refuses it.
  fn tahAbsBits(i : i32) -> u32 {
    let a = bitcast<u32>(x[i]) & 0x7fffffffu;
    return min(a, TAH_INF_BITS);
  }

  // float32 bits of bf16RoundUp(RN32(max / 127)), max given by its bits.
  fn tahScaleBits(maxBits : u32) -> u32 {
    if (maxBits == 0u) { return 0u; }
    if (maxBits >= TAH_INF_BITS) { return TAH_INF_BITS; }
    // max = m · 2^e with m normalised into [2^23, 2^24).
    let ex = maxBits >> 23u;
    var m = select((maxBits & 0x7fffffu) | 0x800000u, maxBits, ex == 0u);
    var e = select(i32(ex) - 150, -149, ex == 0u);
    let sh = countLeadingZeros(m) - 8u;
    m = m << sh;
    e = e - i32(sh);
    // (m << k) / 127 has 24 bits for k = 7, or k = 6 when m ≥ 2^24 · 127/128.
    let k = select(7u, 6u, m >= 16646144u);
    let biased = e - i32(k) + 150;
    var bits : u32;
    if (biased >= 1) {
      let num = m << k;
      var q = num / 127u;
      if (2u * (num % 127u) > 127u) { q = q + 1u; } // nearest; 127 is odd, so never a tie
      bits = (u32(biased) << 23u) + (q - 0x800000u);  // q = 2^24 carries into the exponent
    } else {
      // Subnormal quotient: round max/127 / 2^-149 to an integer, ties to even.
      let t = e + 149;
      var num = m;
      var den = 127u;
      if (t >= 0) { num = m << u32(t); } else { den = 127u << u32(-t); }
      var q = num / den;
      let r2 = 2u * (num % den);
      if (r2 > den || (r2 == den && (q & 1u) == 1u)) { q = q + 1u; }
      bits = q;
    }
    if ((bits & 0xffffu) != 0u) { bits = ((bits >> 16u) + 1u) << 16u; }
    return bits;
  }

  // clamp(Math.round(x * (1 / s)), -127, 127) from the bits of x and of s.
  fn tahQuantize(xBits : u32, sBits : u32) -> i32 {
    if (sBits == 0u || sBits >= TAH_INF_BITS) { return 0; }
    let a = xBits & 0x7fffffffu;
    if (a == 0u || a > TAH_INF_BITS) { return 0; } // zero; NaN rounds to NaN, stored as 0
    let negative = (xBits >> 31u) != 0u;
    let ex = a >> 23u;
    let mx = select((a & 0x7fffffu) | 0x800000u, a, ex == 0u);
    let exx = select(i32(ex) - 150, -149, ex == 0u);
    let ms = tahScaleSig(sBits);
    // 2|x|/s = num / den exactly.
    let d = exx - tahScaleExp(sBits) + 1;
    var num = mx;
    var den = ms;
    if (d >= 0) {
      if (u32(d) > countLeadingZeros(mx)) { return select(127, -127, negative); } // |x/s| ≥ 128, never from a row's own scale
      num = mx << u32(d);
    } else {
      if (d < -24) { return 0; } // 2|x|/s < 1
      den = ms << u32(-d);
    }
    let q2 = num / den;
    var mag = q2 >> 1u;
    if ((q2 & 1u) == 1u) {
      if (num % den != 0u) {
        mag = mag + 1u;
      } else if (tahTieAway(q2, ms >> countTrailingZeros(ms), negative)) {
        mag = mag + 1u;
      }
    }
    mag = min(mag, 127u);
    return select(i32(mag), -i32(mag), negative);
  }

  ${mainHeader()} {
    let lid = index % ${wg};
    let row = index / ${wg};
    let rows = uniforms.xShape.x;
    let cols = uniforms.xShape.y;
    let words = uniforms.outShape.y;
    let inRange = row < rows;
    let base = row * cols;

    var m = 0u;
    if (inRange) {
      for (var c = lid; c < cols; c = c + ${wg}) {
        m = max(m, tahAbsBits(base + c));
      }
    }
    tahRowMax[lid] = m;
    workgroupBarrier();
    for (var s = ${wg / 2}u; s > 0u; s = s >> 1u) {
      if (u32(lid) < s) {
        tahRowMax[lid] = max(tahRowMax[lid], tahRowMax[lid + i32(s)]);
      }
      workgroupBarrier();
    }
    let sBits = tahScaleBits(tahRowMax[0]);
    if (!inRange) { return; }

    let dst = row * words;
    if (lid == 0) { result[dst] = bitcast<i32>(sBits); }
    for (var w = lid; w < words - 1; w = w + ${wg}) {
      var packed = 0u;
      for (var k = 0; k < 4; k = k + 1) {
        let c = w * 4 + k;
        if (c < cols) {
          let q = tahQuantize(bitcast<u32>(x[base + c]), sBits);
          packed = packed | ((bitcast<u32>(q) & 0xffu) << (8u * u32(k)));
        }
      }
      result[dst + 1 + w] = bitcast<i32>(packed);
    }
  }
`;
  }
}

/**
 * codes: int32 [rows, packedRowWords(cols)] in the packed layout → float32
 * [rows, cols], value · scale exactly (no rounding: ≤ 15 significant bits).
 * One thread per output element. Scales are taken as finite (the decoder
 * checks the frame first); a flagged (Infinity) row decodes to zeros.
 */
export class DequantizeRowsProgram implements WebGPUProgram {
  outputShape: number[];
  shaderKey = 'tah_dequantize_rows_int8';
  dispatchLayout: { x: number[] } = { x: [0, 1] };
  dispatch: [number, number, number];
  variableNames = ['codes'];
  workgroupSize: [number, number, number] = [64, 1, 1];
  size = true;
  /** No program-defined uniforms: cols and W come from tfjs's outShape / codesShape uniforms. */
  uniforms?: string;

  constructor(rows: number, cols: number) {
    this.outputShape = [rows, cols];
    this.dispatch = [Math.ceil((rows * cols) / this.workgroupSize[0]), 1, 1];
  }

  getUserCode(): string {
    return `
  ${SCALE_PARTS_WGSL}

  // float32 bits of v · s, exact.
  fn tahDequantBits(v : i32, sBits : u32) -> u32 {
    let sgn = select(0u, 0x80000000u, v < 0) ^ (sBits & 0x80000000u);
    let p = u32(abs(v)) * tahScaleSig(sBits);
    if (p == 0u) { return sgn; }
    let es = tahScaleExp(sBits);
    let len = 32u - countLeadingZeros(p);
    let top = i32(len) - 1 + es; // exponent of the leading bit
    if (top > 127) { return sgn | 0x7f800000u; }
    if (top >= -126) {
      return sgn | (u32(top + 127) << 23u) | ((p << (24u - len)) & 0x7fffffu);
    }
    return sgn | (p << u32(es + 149)); // subnormal
  }

  ${mainHeader()} {
    if (index < uniforms.size) {
      let cols = uniforms.outShape.y;
      let words = uniforms.codesShape.y;
      let row = index / cols;
      let c = index - row * cols;
      let sBits = bitcast<u32>(codes[row * words]);
      let word = bitcast<u32>(codes[row * words + 1 + c / 4]);
      let v = bitcast<i32>(word << (24u - 8u * u32(c % 4))) >> 24u; // sign-extended byte
      result[index] = bitcast<f32>(tahDequantBits(v, sBits));
    }
  }
`;
  }
}

/** tfjs calls main(getGlobalIndex()) for flat dispatch layouts. */
function mainHeader(): string {
  return 'fn main(index : i32)';
}
