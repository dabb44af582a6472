/**
 * How owners combine the contributions to a partition: a run setting. CenteredClip's
 * radius is absolute (L2 per partition), or with `relative` a multiple of the median
 * distance of the partition's contributions from their coordinate-wise median: each
 * contribution measured against its stage peers', whatever the pseudo-gradients' scale.
 */
export type Reduction = { kind: 'mean' } | { kind: 'centered-clip'; radius: number; relative?: boolean; iterations?: number };

export interface Contribution {
  values: Float32Array;
  weight: number;
}

/**
 * Reduces one partition's contributions, given in a fixed order (every owner
 * uses the participants' sorted order), accumulating in float64 so two owners
 * with the same inputs produce the same bits. Returns the reduced values and
 * how many contributions CenteredClip clipped, and which (their positions in `contributions`).
 */
export function reduceContributions(contributions: Contribution[], reduction: Reduction): { values: Float32Array; clipped: number; clippedAt: number[] } {
  if (contributions.length === 0) throw new RangeError('no contributions to reduce');
  const n = contributions[0]!.values.length;
  // Work weights that are all zero (none of them verified yet) weigh everyone equally: 0/0 made every value NaN.
  const anyWork = contributions.some((c) => c.weight > 0);
  if (!anyWork) contributions = contributions.map((c) => ({ ...c, weight: 1 }));
  const totalWeight = contributions.reduce((s, c) => s + c.weight, 0);
  const mean = new Float64Array(n);
  for (const c of contributions) {
    const w = c.weight / totalWeight;
    for (let i = 0; i < n; i++) mean[i]! += w * c.values[i]!;
  }
  if (reduction.kind === 'mean') return { values: Float32Array.from(mean), clipped: 0, clippedAt: [] };
  // CenteredClip (Karimireddy et al.; BTARD): v ← v + Σ wᵢ·min(1, τ/‖xᵢ − v‖)·(xᵢ − v) / Σ wᵢ,
  // started from the coordinate-wise median so an outlier far away costs no iterations.
  const v = new Float64Array(n);
  const k = contributions.length;
  const column = new Float64Array(k);
  for (let i = 0; i < n; i++) {
    // An insertion sort of the k values (a handful of replicas): a stage's millions of coordinates each pay
    // a few comparisons, not a call to sort().
    for (let j = 0; j < k; j++) {
      const x = contributions[j]!.values[i]!;
      let m = j;
      while (m > 0 && column[m - 1]! > x) (column[m] = column[m - 1]!), m--;
      column[m] = x;
    }
    v[i] = middle(column);
  }
  const distance = (x: Float32Array): number => {
    let s = 0;
    for (let i = 0; i < n; i++) s += (x[i]! - v[i]!) ** 2;
    return Math.sqrt(s);
  };
  // Relative: τ = radius × the median distance from the coordinate-wise median. A minority of outliers cannot
  // move it; honest replicas, whose distances are alike, stay inside it (with two contributions both are at the
  // same distance, so neither is clipped: two cannot tell which is the outlier).
  const tau = reduction.relative ? reduction.radius * median(contributions.map((c) => distance(c.values))) : reduction.radius;
  for (let it = 0; it < (reduction.iterations ?? 20); it++) {
    const step = new Float64Array(n);
    for (const c of contributions) {
      const d = distance(c.values);
      const f = ((d > tau ? tau / d : 1) * c.weight) / totalWeight;
      for (let i = 0; i < n; i++) step[i]! += f * (c.values[i]! - v[i]!);
    }
    let moved = 0;
    for (let i = 0; i < n; i++) {
      v[i]! += step[i]!;
      moved += step[i]! ** 2;
    }
    if (Math.sqrt(moved) < 1e-9 * Math.max(1, tau)) break;
  }
  const clippedAt = contributions.flatMap((c, i) => (distance(c.values) > tau ? [i] : []));
  return { values: Float32Array.from(v), clipped: clippedAt.length, clippedAt };
}

function median(xs: number[]): number {
  return middle([...xs].sort((a, b) => a - b));
}

/** The median of values already sorted. */
function middle(sorted: ArrayLike<number>): number {
  const h = sorted.length >> 1;
  return sorted.length % 2 ? sorted[h]! : (sorted[h - 1]! + sorted[h]!) / 2;
}
