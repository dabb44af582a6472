import { initNodeBackend } from '@train-at-home/model/node';
import { buildApp, type App } from '@train-at-home/server/app';
import { testDatabase } from './database';
import type { RunOverrides } from '@train-at-home/server/run-config';

/**
 * A run's incentives with no round drawn for an audit and no microbatch sampled for a spot check, for the files that
 * ask whether the swarm trains, merges, churns or restarts, not whether the validator catches anyone (adversarial,
 * detectors, audit-deadline, liar, centered-clip, e2e): with the defaults, every round of each new replica is replayed
 * (unprovenAuditRate 1) on the same two cores the swarm trains on. replicas.test took 484 s with them in a fresh-clone
 * CI run, 324 s without.
 */
export const NO_CHECKS = { auditRate: 0, unprovenAuditRate: 0, spotCheckRate: 0 } as const;

/** A coordinator on the test database (PGlite, or PostgreSQL when configured) listening on a free loopback port, for in-process miners. */
export async function listeningCoordinator(run: RunOverrides): Promise<{ app: App; url: string }> {
  await initNodeBackend();
  // TAH_TEST_LOG=1 turns the coordinator's log on (for debugging a test run).
  const app = await buildApp({ database: await testDatabase(), run, logger: Boolean(process.env.TAH_TEST_LOG) });
  return { app, url: await app.fastify.listen({ port: 0, host: '127.0.0.1' }) };
}

