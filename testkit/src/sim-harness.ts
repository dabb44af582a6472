import { buildApp, type App, type AppOptions } from '@train-at-home/server/app';
import { testDatabase } from './database';
import type { SimMiner } from './sim-miners';

/**
 * A test's coordinator (`tiny`, on the test database, listening on a free
 * loopback port) and its simulated miners, all closed after each test
 * (the test says so: `afterEach(() => h.close())`).
 * Simulated miners send no heartbeats unless told: silence is 10 minutes.
 */
export function simHarness() {
  const h = {
    app: undefined as App | undefined,
    miners: [] as SimMiner[],
    async start(name: string, stages = 3, options: Omit<AppOptions, 'database'> = {}): Promise<string> {
      h.app = await buildApp({ silentMs: 600_000, ...options, run: { preset: 'tiny', bottleneck: 32, ...options.run, name, stages }, database: await testDatabase() });
      return h.app.fastify.listen({ port: 0, host: '127.0.0.1' });
    },
    /** Closes the miners, then the coordinator. */
    async close(): Promise<void> {
      h.miners.splice(0).forEach((m) => m.close());
      await h.app?.close();
      h.app = undefined;
    },
  };
  return h;
}
