/**
 * A spot check: the validator replays one microbatch through a miner's stage
 * (same weights, same input) and compares the miner's output with its own.
 * Float kernels differ between backends (WebGPU, WebGL, WASM) and the wire
 * may be int8, so the two never match bit for bit; the comparison returns
 * scale-free numbers that a threshold can be put on:
 *
 * - cosine: direction. An honest stage on another backend stays near 1.
 * - normRatio = ‖actual‖ / ‖reference‖: a stage that scales its output
 *   (or sends zeros) keeps the cosine but not the norm.
 * - relError = ‖actual − reference‖ / ‖reference‖: both at once.
 * - deltaCosine = cos(actual − input, reference − input), when the input is
 *   given and has the output's shape: the residual stream makes a stage's
 *   output close to its input, so a lazy stage that forwards its input
 *   unchanged still scores a high cosine; what the stage added does not.
 *
 * Zero vectors never produce NaN:
 * - cosine is 0 when either vector is 0 (no direction to agree on);
 * - normRatio is 0 when actual is 0; when reference is 0 and actual is not
 *   it is Infinity (the only case), and 0/0 is 0;
 * - relError is 0 when both are 0, Infinity when only reference is 0.
 * A non-finite value in the miner's output is the worst output there is:
 * cosine 0 and both ratios Infinity (and deltaCosine 0). A non-finite value
 * in the reference or input is the validator's own bug, and throws.
 */

import { IncentivesError } from './errors';

export interface OutputComparison {
  cosine: number;
  /** ||actual|| / ||reference|| */
  normRatio: number;
  /** ||actual - reference|| / ||reference|| */
  relError: number;
  /** cosine of (actual - input) and (reference - input), when an input of the same shape is given: catches a stage that forwards its input unchanged */
  deltaCosine?: number;
}

export function compareOutputs(actual: Float32Array, reference: Float32Array, input?: Float32Array): OutputComparison {
  if (actual.length !== reference.length) {
    throw new IncentivesError('LENGTH_MISMATCH', `actual has ${actual.length} values, reference ${reference.length}`);
  }
  if (input !== undefined && input.length !== reference.length) {
    throw new IncentivesError('LENGTH_MISMATCH', `input has ${input.length} values, reference ${reference.length}`);
  }
  assertFinite(reference, 'reference');
  if (input !== undefined) assertFinite(input, 'input');
  if (!allFinite(actual)) {
    const worst: OutputComparison = { cosine: 0, normRatio: Infinity, relError: Infinity };
    return input === undefined ? worst : { ...worst, deltaCosine: 0 };
  }

  // Float64 sums: float32 accumulation over millions of values loses digits.
  let dotAr = 0;
  let normA2 = 0;
  let normR2 = 0;
  let diff2 = 0;
  for (let i = 0; i < reference.length; i++) {
    const a = actual[i]!;
    const r = reference[i]!;
    dotAr += a * r;
    normA2 += a * a;
    normR2 += r * r;
    diff2 += (a - r) * (a - r);
  }
  const normA = Math.sqrt(normA2);
  const normR = Math.sqrt(normR2);
  const result: OutputComparison = {
    cosine: cosineOf(dotAr, normA, normR),
    normRatio: normA === 0 ? 0 : normR === 0 ? Infinity : normA / normR,
    relError: diff2 === 0 ? 0 : normR === 0 ? Infinity : Math.sqrt(diff2) / normR,
  };
  if (input !== undefined) {
    let dotD = 0;
    let normDa2 = 0;
    let normDr2 = 0;
    for (let i = 0; i < reference.length; i++) {
      const x = input[i]!;
      const da = actual[i]! - x;
      const dr = reference[i]! - x;
      dotD += da * dr;
      normDa2 += da * da;
      normDr2 += dr * dr;
    }
    result.deltaCosine = cosineOf(dotD, Math.sqrt(normDa2), Math.sqrt(normDr2));
  }
  return result;
}

/** Clamped: round-off can push |cos| a hair above 1 for parallel vectors. */
function cosineOf(dotProduct: number, normA: number, normB: number): number {
  if (normA === 0 || normB === 0) return 0;
  return Math.min(1, Math.max(-1, dotProduct / (normA * normB)));
}

function allFinite(values: Float32Array): boolean {
  for (let i = 0; i < values.length; i++) if (!Number.isFinite(values[i]!)) return false;
  return true;
}

function assertFinite(values: Float32Array, name: string): void {
  if (!allFinite(values)) throw new IncentivesError('NON_FINITE', `${name} holds a non-finite value`);
}
