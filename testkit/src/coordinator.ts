import { initNodeBackend } from '@train-at-home/model/node';
import { buildApp, type App } from '@train-at-home/server/app';
import { testDatabase } from './database';
import type { RunOverrides } from '@train-at-home/server/run-config';

/** A coordinator on the test database (PGlite, or PostgreSQL when configured) listening on a free loopback port, for in-process miners. */
export async function listeningCoordinator(run: RunOverrides): Promise<{ app: App; url: string }> {
  await initNodeBackend();
  // TAH_TEST_LOG=1 turns the coordinator's log on (for debugging a test run).
  const app = await buildApp({ database: await testDatabase(), run, logger: Boolean(process.env.TAH_TEST_LOG) });
  return { app, url: await app.fastify.listen({ port: 0, host: '127.0.0.1' }) };
}

