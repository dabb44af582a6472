/**
 * A coordinator in the lab's public namespace (scripts/nat-lab.sh), for server/test/nat.test.ts:
 * listens on TAH_NAT_COORDINATOR's host, with its network settings (and the web app, for tabs: e2e/nat.test.ts);
 * over IPC it answers its relayed byte counts, its connected miners, the activations each pair carried, each stage's merge round and its CPU time (bench/paths.ts), and takes new network settings (a rotated TURN secret).
 * Its run: `tiny` in 2 stages merging every 4 microbatches, no audits (the test is about paths).
 */
import { DATA_DIR, initNodeBackend } from '@train-at-home/model/node';
import { buildApp } from '@train-at-home/server/app';
import type { NetworkSettings } from '@train-at-home/server/network';

const { host, network, webRoot } = JSON.parse(process.env.TAH_NAT_COORDINATOR ?? '{}') as { host: string; network: Partial<NetworkSettings>; webRoot?: string };
await initNodeBackend(); // the validator's held-out evaluations and audits
const app = await buildApp({
  // Embedded PGlite, in memory: the lab's public namespace cannot reach a PostgreSQL server on the host's loopback
  // (scripts/test-postgres.sh), and the paths between homes are what this run is about.
  database: {},
  dataRoot: DATA_DIR,
  ...(webRoot ? { webRoot } : {}),
  run: { name: 'nat', preset: 'tiny', stages: 2, bottleneck: 32, merge: { every: 4, maxTrainingMs: 30_000 }, incentives: { auditRate: 0 } },
  network,
});
const url = await app.fastify.listen({ port: 0, host });
process.send!({ ready: url });
process.on('message', (m: { relayed?: true; network?: Partial<NetworkSettings>; rounds?: true; cpu?: true; miners?: true; activations?: true }) => {
  // Activations the receivers confirmed, per (sender, receiver): which pipeline pairs carried the microbatches.
  if (m.activations) {
    void app.db
      .query<{ from_miner: string; to_miner: string; n: number }>(`SELECT from_miner, to_miner, count(*)::int AS n FROM receipts WHERE run_id = $1 AND direction = 'activation' AND reporter = to_miner GROUP BY 1, 2`, [app.coordinator.runId])
      .then((rows) => process.send!({ activations: rows.map((r) => [r.from_miner, r.to_miner, r.n]) }));
  }
  if (m.relayed) process.send!({ relayed: { ...app.coordinator.relayed } });
  if (m.miners) process.send!({ miners: [...app.coordinator.sockets.keys()] });
  if (m.cpu) process.send!({ cpu: process.cpuUsage() });
  if (m.rounds) process.send!({ rounds: app.coordinator.phases.status().map((s) => s.round) });
  if (m.network) {
    app.coordinator.setNetwork({ ...app.coordinator.network, ...m.network });
    process.send!({ network: true });
  }
});
process.on('disconnect', () => void app.close().finally(() => process.exit(0)));
