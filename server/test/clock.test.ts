import { describe, expect, it } from 'vitest';
import { arrivalTime } from '../src/clock';

describe('arrival times', () => {
  it('strictly increase, even many in one millisecond, and are never later than the wall clock read after them', () => {
    let previous = '';
    for (let i = 0; i < 20_000; i++) {
      const at = arrivalTime();
      const after = Date.now();
      // Text compares as time (fixed width, UTC): each later than the one before.
      expect(at > previous, `${at} after ${previous}`).toBe(true);
      expect(at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
      expect(new Date(at).getTime()).toBeLessThanOrEqual(after);
      previous = at;
    }
  });
});
