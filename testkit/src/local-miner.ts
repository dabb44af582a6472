import wrtc from '@roamhq/wrtc';
import { DATA_DIR, loadDataset } from '@train-at-home/model/node';
import { generateIdentity } from '@train-at-home/protocol';
import { Miner, type MinerOptions } from '@train-at-home/swarm';
import { join } from 'node:path';

/** An in-process miner (the CLI's Miner) over real WebRTC, on the locally prepared data; options override. */
export function localMiner(coordinatorUrl: string, extra: Partial<MinerOptions> = {}): Miner {
  const identity = generateIdentity();
  const tag = identity.publicKey.slice(2, 10).toLowerCase();
  return new Miner({
    coordinatorUrl,
    identity,
    backend: 'wasm',
    tokensPerSec: 100,
    wrtc,
    tokens: { train: async (_v, dataset) => loadDataset(join(DATA_DIR, dataset)).train },
    // TAH_TEST_LOG=1 prints what each in-process miner logs (for debugging a test run).
    ...(process.env.TAH_TEST_LOG ? { log: (line: string) => console.log(`[miner ${tag}] ${new Date().toISOString()} ${line}`) } : {}),
    ...extra,
  });
}

