/**
 * A coordinator in the lab's public namespace (scripts/nat-lab.sh), for server/src/nat.test.ts:
 * listens on TAH_NAT_COORDINATOR's host, with its network settings; over IPC it answers its relayed
 * byte counts and takes new network settings (a rotated TURN secret).
 */
import { buildApp } from '../app';
import { testDatabase } from '../db/test-database';
import type { NetworkSettings } from '../network';

const { host, network } = JSON.parse(process.env.TAH_NAT_COORDINATOR ?? '{}') as { host: string; network: Partial<NetworkSettings> };
const app = await buildApp({ database: await testDatabase(), run: { name: 'nat', preset: 'tiny', stages: 2, bottleneck: 32 }, network });
const url = await app.fastify.listen({ port: 0, host });
process.send!({ ready: url });
process.on('message', (m: { relayed?: true; network?: Partial<NetworkSettings> }) => {
  if (m.relayed) process.send!({ relayed: { ...app.coordinator.relayed } });
  if (m.network) {
    app.coordinator.setNetwork({ ...app.coordinator.network, ...m.network });
    process.send!({ network: true });
  }
});
process.on('disconnect', () => void app.close().finally(() => process.exit(0)));
