import { sha256 } from '@noble/hashes/sha256';
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

/**
 * The training windows a microbatch id is assigned: each row's start is read
 * from SHA-256(run's data seed ‖ activation id ‖ row), so anyone holding the
 * dataset (the last stage, the validator's audits) can check that stage 0
 * trained on the run's data and not on text of its own choosing. A miner
 * still draws its ids at random: it could grind ids for windows it prefers,
 * but every one it sends is run data, and grinding costs a forward per try.
 */
export function assignedWindows(tokens: Uint16Array, batch: number, time: number, dataSeed: number, activationId: Uint8Array): TokenBatch {
  const span = tokens.length - time - 1;
  if (span < 1) throw new RangeError('not enough tokens for one window');
  const starts = Array.from({ length: batch }, (_, row) => {
    const input = new Uint8Array(8 + activationId.length);
    const view = new DataView(input.buffer);
    view.setUint32(0, dataSeed >>> 0, true);
    input.set(activationId, 4);
    view.setUint32(4 + activationId.length, row, true);
    const digest = sha256(input);
    // 48 bits of the digest, reduced: the bias is below 2^-28 for any split under 2^20 windows' worth of tokens.
    const word = new DataView(digest.buffer, digest.byteOffset, 8);
    return Number((BigInt(word.getUint32(0, true)) * 65536n + BigInt(word.getUint16(4, true))) % BigInt(span));
  });
  return windows(tokens, starts, time);
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
