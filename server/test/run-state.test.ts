import { describe, expect, it } from 'vitest';
import { RunStore } from '../src/run-state';

const log = { warn: () => {}, info: () => {} };

describe('the run-state layer (RunStore)', () => {
  it("in its single-process form holds the embedded database, counts in this process's memory, and runs the singleton jobs from the start", async () => {
    const store = await RunStore.open({}, log);
    try {
      expect(store.scaledOut).toBe(false);
      expect(store.db.kind).toBe('pglite');
      expect(await store.db.query<{ n: number }>('SELECT count(*)::int AS n FROM runs')).toEqual([{ n: 0 }]);
      expect(store.httpRateLimits('r')).toEqual({});
      expect(store.socketRateLimits('r')).toBeUndefined();
      expect(store.socketAdapter('r')).toBeUndefined();
      const lease = store.jobLease(1, log);
      lease.start();
      expect(lease.held).toBe(true);
      await lease.close();
      expect(lease.held).toBe(false);
    } finally {
      await store.close();
    }
  });

  it('refuses scale-out mode without a PostgreSQL server, and an unreachable Redis, by name', async () => {
    await expect(RunStore.open({ redisUrl: 'redis://127.0.0.1:9' }, log)).rejects.toThrow(/scale-out mode \(REDIS_URL\) needs a PostgreSQL server \(DATABASE_URL\)/);
    // Nothing listens on port 9 of loopback: Redis is refused before the database is opened.
    await expect(RunStore.open({ redisUrl: 'redis://127.0.0.1:9', database: { url: 'postgres://127.0.0.1:9/none' } }, log)).rejects.toThrow(/could not reach Redis at REDIS_URL/);
  });
});
