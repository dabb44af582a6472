/**
 * Several in-process miners in one child process, for tests that need more
 * miners than one process can run beside the coordinator. Started by
 * MinerSwarm (swarm.ts) with fork(); over IPC it reports each
 * miner's id and stage once all registered, takes cheat assignments (see
 * cheats.ts; a miner cheats from that moment on), and answers stats.
 */
import type { Misbehaviour } from '@train-at-home/swarm';
import { initNodeBackend } from '@train-at-home/model/node';
import { cryptoReady } from '@train-at-home/protocol';
import { localMiner } from './local-miner';
import { CHEATS, type CheatName } from './cheats';

const { url, count, preferDirectPeers } = JSON.parse(process.env.TAH_SWARM ?? '{}') as { url: string; count: number; preferDirectPeers?: boolean };
await initNodeBackend();
await cryptoReady();
const behaviours = Array.from({ length: count }, () => ({}) as Misbehaviour);
// TAH_SWARM_LOG=<regex>: the miners' log lines that match it, on stderr (to find why a test's miner did what it did).
const wanted = process.env.TAH_SWARM_LOG ? new RegExp(process.env.TAH_SWARM_LOG) : undefined;
const miners = behaviours.map((misbehave, i) => localMiner(url, { misbehave, ...(preferDirectPeers === false ? { preferDirectPeers } : {}), log: (line) => void (wanted?.test(line) && console.error(`[miner ${i}] ${line}`)) }));
await Promise.all(miners.map((m) => m.start()));
process.send!({ ready: miners.map((m) => ({ minerId: m.registration!.minerId, stage: m.registration!.stage })) });

process.on('message', (m: { assign?: Record<string, CheatName>; stats?: boolean }) => {
  if (m.assign) {
    miners.forEach((miner, i) => {
      const cheat = m.assign![miner.registration!.minerId];
      if (cheat) Object.assign(behaviours[i]!, CHEATS[cheat].make());
    });
    process.send!({ assigned: true });
  }
  if (m.stats) {
    process.send!({ stats: miners.map((x) => ({ minerId: x.registration?.minerId, microbatches: x.stats?.microbatches ?? 0, computeMs: x.stats?.computeMs ?? 0, merges: x.merges.length, flagged: x.status.flagged, paths: [...(x.paths() ?? [])] })) });
  }
});
const stop = (): void => {
  miners.forEach((m) => m.stop());
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('disconnect', stop);
