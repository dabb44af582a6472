import { describe, expect, it } from 'vitest';
import { LiveSeries, sane, DASHBOARD_BOUNDS, type DashboardPoint } from './dashboard';

const p = (id: number, value: number): DashboardPoint => ({ id, value, at: new Date(1_800_000_000_000 + id).toISOString(), round: 1 });

describe('dashboard values', () => {
  it('shows a number only when it is finite and within its bounds', () => {
    expect(sane(3.2, DASHBOARD_BOUNDS.loss)).toBe(3.2);
    for (const bad of [NaN, Infinity, -Infinity, -0.1, 101, '3', null, undefined, { valueOf: () => 3 }]) expect(sane(bad, DASHBOARD_BOUNDS.loss)).toBeUndefined();
    expect(sane(2e7, DASHBOARD_BOUNDS.tokensPerSec)).toBeUndefined();
  });

  it('a live series keeps points in order, once each, drops insane ones, and asks to backfill across a gap', () => {
    const s = new LiveSeries();
    expect(s.append([p(1, 5), p(3, 4.9), p(3, 4.9), p(2, 9), p(4, NaN), p(5, -1), p(6, 1e9), p(7, 4.8)])).toBe(3);
    expect(s.points.map((x) => x.id)).toEqual([1, 3, 7]);
    expect(s.lastId).toBe(7);
    // An update that follows what the series holds is applied (points it already has are skipped)…
    expect(s.apply(7, [p(8, 4.7), p(9, Infinity)])).toBe('applied');
    expect(s.points.map((x) => x.id)).toEqual([1, 3, 7, 8]);
    expect(s.apply(5, [p(7, 4.8), p(10, 4.6)])).toBe('applied');
    expect(s.points.map((x) => x.id)).toEqual([1, 3, 7, 8, 10]);
    // …one that follows points it never saw (a reconnect after a restart) is a gap: backfill, then apply.
    expect(s.apply(20, [p(21, 4.5)])).toBe('gap');
    expect(s.points.length).toBe(5);
    s.append([p(12, 4.55), p(15, 4.52)], 20);
    expect(s.lastId).toBe(20);
    expect(s.apply(20, [p(21, 4.5)])).toBe('applied');
    expect(s.points.map((x) => x.id)).toEqual([1, 3, 7, 8, 10, 12, 15, 21]);
  });
});
