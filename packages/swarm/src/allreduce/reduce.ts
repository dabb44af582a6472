/** How owners combine the contributions to a partition: a run setting. */
export type Reduction = { kind: 'mean' } | { kind: 'centered-clip'; radius: number; iterations?: number };

export interface Contribution {
  values: Float32Array;
  weight: number;
}

/**
 * Reduces one partition's contributions, given in a fixed order (every owner
 * uses the participants' sorted order), accumulating in float64 so two owners
 * with the same inputs produce the same bits. Returns the reduced values and
 * how many contributions CenteredClip clipped.
 */
export function reduceContributions(contributions: Contribution[], reduction: Reduction): { values: Float32Array; clipped: number } {
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
  if (reduction.kind === 'mean') return { values: Float32Array.from(mean), clipped: 0 };
  // CenteredClip (Karimireddy et al.; BTARD): v ← v + Σ wᵢ·min(1, τ/‖xᵢ − v‖)·(xᵢ − v) / Σ wᵢ,
  // started from the coordinate-wise median so an outlier far away costs no iterations.
  const v = new Float64Array(n);
  const column = new Float64Array(contributions.length);
  for (let i = 0; i < n; i++) {
    contributions.forEach((c, j) => (column[j] = c.values[i]!));
    column.sort();
    const h = column.length >> 1;
    v[i] = column.length % 2 ? column[h]! : (column[h - 1]! + column[h]!) / 2;
  }
  const tau = reduction.radius;
  const distance = (x: Float32Array): number => {
    let s = 0;
    for (let i = 0; i < n; i++) s += (x[i]! - v[i]!) ** 2;
    return Math.sqrt(s);
  };
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
  const clipped = contributions.filter((c) => distance(c.values) > tau).length;
  return { values: Float32Array.from(v), clipped };
}
