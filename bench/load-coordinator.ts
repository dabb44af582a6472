/**
 * The coordinator bench/load.ts measures, in a process of its own (the
 * generator's miners do not share its event loop): the `tiny` run of 3 stages
 * on the embedded database (TAH_LOAD_DATA_DIR) or a PostgreSQL server
 * (TAH_LOAD_DATABASE_URL; with TAH_LOAD_REDIS_URL, one of a run's processes in scale-out mode), with the connection cap, per-IP request limit and registrations per
 * address raised (every simulated miner comes from 127.0.0.1) and the validator's
 * spot checks and audits off (simulated miners carry no model to replay: the
 * validator's cost is bench:audit's). Over IPC: { url } once listening, then
 * { rssMb, maxStallMs, cpuMs, queuedMax } whenever asked (the event loop's longest delay since the last ask; the process's CPU time so far;
 * the most registrations that waited their turn at once since the last ask).
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { buildApp } from '../server/src/app';

const app = await buildApp({
  run: { name: 'load', preset: 'tiny', stages: 3, bottleneck: 32, incentives: { spotCheckRate: 0, auditRate: 0 } },
  database: process.env.TAH_LOAD_DATABASE_URL ? { url: process.env.TAH_LOAD_DATABASE_URL } : { dataDir: process.env.TAH_LOAD_DATA_DIR! },
  // Scale-out mode (two processes): the run's other process shares the database and this Redis.
  ...(process.env.TAH_LOAD_REDIS_URL ? { redisUrl: process.env.TAH_LOAD_REDIS_URL } : {}),
  http: { maxConnectionsPerIp: 1_000_000, requestsPerIpPerMinute: 10_000_000 },
  socketRates: { 'register-per-address': { max: 10_000_000, perMs: 60_000 } },
});
const url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
process.send!({ url });
// The longest the event loop was held at once, between two asks (each step's).
const delay = monitorEventLoopDelay({ resolution: 20 });
delay.enable();
process.on('message', (m: { rss?: boolean; stop?: boolean }) => {
  if (m.rss) {
    const cpu = process.cpuUsage();
    process.send!({ rssMb: process.memoryUsage().rss / 2 ** 20, maxStallMs: delay.max / 1e6, cpuMs: (cpu.user + cpu.system) / 1000, queuedMax: app.coordinator.admission.takeLongest() });
    delay.reset();
  }
  if (m.stop) void app.close().then(() => process.exit(0));
});
