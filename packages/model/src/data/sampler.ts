import { mulberry32 } from '../rng';

/** A microbatch of token windows: inputs and their next-token targets, [B, T] row-major. */
export interface TokenBatch {
  batch: number;
  time: number;
  inputs: Int32Array;
  targets: Int32Array;
}

/** Random windows of T+1 tokens from a token array, reproducible from a seed. */
export class BatchSampler {
  private readonly random: () => number;
  constructor(
    private readonly tokens: Uint16Array,
    readonly batch: number,
    readonly time: number,
    seed: number,
  ) {
    if (tokens.length <= time + 1) throw new RangeError('not enough tokens for one window');
    this.random = mulberry32(seed);
  }

  next(): TokenBatch {
    const starts = Array.from({ length: this.batch }, () => Math.floor(this.random() * (this.tokens.length - this.time - 1)));
    return windows(this.tokens, starts, this.time);
  }
}

/** Evenly spaced windows over the held-out split: the same evaluation set every time. */
export function evaluationBatches(tokens: Uint16Array, batch: number, time: number, count: number): TokenBatch[] {
  const total = batch * count;
  const stride = Math.floor((tokens.length - time - 1) / total);
  if (stride < 1) throw new RangeError('held-out split too small for the evaluation set');
  return Array.from({ length: count }, (_, i) =>
    windows(tokens, Array.from({ length: batch }, (_, j) => (i * batch + j) * stride), time),
  );
}

function windows(tokens: Uint16Array, starts: number[], time: number): TokenBatch {
  const inputs = new Int32Array(starts.length * time);
  const targets = new Int32Array(starts.length * time);
  starts.forEach((s, b) => {
    for (let t = 0; t < time; t++) {
      inputs[b * time + t] = tokens[s + t]!;
      targets[b * time + t] = tokens[s + t + 1]!;
    }
  });
  return { batch: starts.length, time, inputs, targets };
}
