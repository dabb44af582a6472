import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex } from '@noble/hashes/utils';

/** The outer optimizer of a merge: a run setting (IOTA uses lr 0.7, momentum 0.9). */
export interface OuterSettings {
  lr: number;
  momentum: number;
}

export const IOTA_OUTER: OuterSettings = { lr: 0.7, momentum: 0.9 };

/**
 * DiLoCo's outer step, on a stage's flat parameter vector. Every replica keeps
 * the stage's last merged weights (the anchor) and the outer momentum; after H
 * inner steps its pseudo-gradient is anchor − current. The replicas all-reduce
 * the pseudo-gradients (weighted by work) and each applies the same Nesterov
 * step to the same anchor, so all end with identical weights.
 *
 * Replicas whose (anchor, momentum) differ (a late joiner that loaded a
 * checkpoint) cannot share a pseudo-gradient; such a round averages the
 * weights themselves instead and restarts the momentum: see `stateId`.
 */
export class OuterOptimizer {
  momentum: Float32Array;

  constructor(
    public anchor: Float32Array,
    momentum?: Float32Array,
  ) {
    this.momentum = momentum ?? new Float32Array(anchor.length);
  }

  /** Names (anchor, momentum): replicas with the same id can merge pseudo-gradients. */
  stateId(): string {
    const h = sha256.create();
    h.update(new Uint8Array(this.anchor.buffer, this.anchor.byteOffset, this.anchor.byteLength));
    h.update(new Uint8Array(this.momentum.buffer, this.momentum.byteOffset, this.momentum.byteLength));
    return bytesToHex(h.digest());
  }

  pseudoGradient(current: Float32Array): Float32Array {
    const d = new Float32Array(current.length);
    for (let i = 0; i < d.length; i++) d[i] = this.anchor[i]! - current[i]!;
    return d;
  }

  /** Applies the averaged pseudo-gradient: m ← μm + Δ; θ ← anchor − lr(Δ + μm). Returns θ, the new anchor. */
  step(delta: Float32Array, s: OuterSettings): Float32Array {
    const next = new Float32Array(delta.length);
    for (let i = 0; i < delta.length; i++) {
      const m = s.momentum * this.momentum[i]! + delta[i]!;
      this.momentum[i] = m;
      next[i] = this.anchor[i]! - s.lr * (delta[i]! + s.momentum * m);
    }
    this.anchor = next;
    return Float32Array.from(next);
  }

  /** A round that averaged weights: they become the anchor, and the momentum starts again. */
  reset(weights: Float32Array): void {
    this.anchor = Float32Array.from(weights);
    this.momentum = new Float32Array(weights.length);
  }
}
