/**
 * The price of being distributed: tokens per CPU-second of a swarm (3 stages
 * × 2 miners, each a separate process on this machine) against the
 * single-process local trainer on the same model, layout and microbatch.
 *
 *   npm run bench:swarm                  (90 s measured after a 30 s warm-up)
 *   npm run bench:swarm -- --seconds 30
 *
 * Preset: `tiny` (documented reduction: `small` runs ~260 tokens/s per core
 * here, too slow for a swarm of six processes on two cores to say much).
 * CPU time is read from /proc for every miner process (user + system).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { BatchSampler, LocalTrainer, PRESETS } from '@train-at-home/model';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { join } from 'node:path';
import { buildApp } from '../server/src/app';
import { finish, machine } from './lib';

const { values } = parseArgs({ options: { seconds: { type: 'string', default: '90' }, warmup: { type: 'string', default: '30' } } });
const measureSeconds = Number(values.seconds);
const warmupSeconds = Number(values.warmup);
const layout = { stages: 3, bottleneck: 32, int8: true };
const batchSize = 16;
const config = PRESETS.tiny;
const tokensPerMicrobatch = batchSize * config.contextLength;
const CLOCK_TICKS = 100; // USER_HZ on Linux

function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS; // utime, stime
}

// 1. Single process: the same stages, all in this process.
const backend = await initNodeBackend();
prepareData({ outDir: DATA_DIR, vocabSize: config.vocabSize });
const data = loadDataset(join(DATA_DIR, datasetName(config.vocabSize)));
const local = new LocalTrainer({ config, layout, seed: 1, peakLr: 0.006, warmupSteps: 10, totalSteps: 1000 });
const sampler = new BatchSampler(data.train, batchSize, config.contextLength, 3);
for (let i = 0; i < 3; i++) local.trainStep(sampler.next());
const cpu0 = process.cpuUsage();
const wall0 = performance.now();
let localSteps = 0;
while (performance.now() - wall0 < Math.min(measureSeconds, 30) * 1000) {
  local.trainStep(sampler.next());
  localSteps++;
}
const localCpu = process.cpuUsage(cpu0);
const localCpuSeconds = (localCpu.user + localCpu.system) / 1e6;
const localTokensPerCpuSecond = (localSteps * tokensPerMicrobatch) / localCpuSeconds;
local.dispose();
console.log(`single process: ${localSteps} steps, ${localTokensPerCpuSecond.toFixed(0)} tokens per CPU-second`);

// 2. The swarm: a coordinator here, six miner processes.
const app = await buildApp({ run: { name: 'bench', preset: 'tiny', ...layout, training: { batchSize, peakLr: 0.006, warmupSteps: 10, totalSteps: 100_000 } } });
await app.fastify.listen({ port: 0, host: '127.0.0.1' });
const port = (app.fastify.server.address() as { port: number }).port;
const cli = fileURLToPath(new URL('../apps/miner/src/main.ts', import.meta.url));
const miners: Array<{ child: ChildProcess; output: string }> = [];
for (let i = 0; i < 6; i++) {
  const child = spawn(process.execPath, ['--import', 'tsx', cli, '--coordinator', `http://127.0.0.1:${port}`], { stdio: ['ignore', 'pipe', 'inherit'] });
  const m = { child, output: '' };
  child.stdout!.on('data', (c: Buffer) => (m.output += c.toString()));
  miners.push(m);
  await new Promise((r) => setTimeout(r, 1500));
}
const losses = (): Promise<number> =>
  app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE name = 'train_loss'`).then((r) => r[0]!.n);
const sentBytes = (): Promise<number> =>
  app.db.query<{ b: number }>(`SELECT coalesce(sum(bytes), 0)::float8 AS b FROM receipts WHERE reporter = from_miner`).then((r) => r[0]!.b);
await new Promise((r) => setTimeout(r, warmupSeconds * 1000));

const cpuStart = miners.map((m) => cpuSeconds(m.child.pid!));
const [lossesStart, bytesStart, relayStart] = [await losses(), await sentBytes(), app.coordinator.relayed.frameBytes];
await new Promise((r) => setTimeout(r, measureSeconds * 1000));
const cpuEnd = miners.map((m) => cpuSeconds(m.child.pid!));
const [lossesEnd, bytesEnd, relayEnd] = [await losses(), await sentBytes(), app.coordinator.relayed.frameBytes];

for (const m of miners) m.child.kill('SIGTERM');
await Promise.all(miners.map((m) => new Promise((r) => m.child.once('exit', r))));
const perMiner = miners.map((m) => JSON.parse(m.output.split('\n').find((l) => l.startsWith('{"minerStats"')) ?? '{"minerStats":{}}').minerStats);
await app.close();

const swarmTokens = (lossesEnd - lossesStart) * tokensPerMicrobatch;
const swarmCpuSeconds = cpuEnd.reduce((a, c, i) => a + c - cpuStart[i]!, 0);
const swarmTokensPerCpuSecond = swarmTokens / swarmCpuSeconds;
const efficiency = swarmTokensPerCpuSecond / localTokensPerCpuSecond;
const wireBytesPerToken = swarmTokens > 0 ? (bytesEnd - bytesStart) / swarmTokens : 0;
const computeShare = perMiner.map((s: { stage: number; computeMs: number; wallMs: number }) => ({ stage: s.stage, compute: +(s.computeMs / s.wallMs).toFixed(3), waiting: +(1 - s.computeMs / s.wallMs).toFixed(3) }));
console.log(`swarm: ${swarmTokens} tokens in ${measureSeconds} s, ${swarmCpuSeconds.toFixed(1)} CPU-s, ${swarmTokensPerCpuSecond.toFixed(0)} tokens per CPU-second`);
console.log(`efficiency ${(efficiency * 100).toFixed(1)}%, ${wireBytesPerToken.toFixed(1)} wire bytes per token, relayed ${relayEnd - relayStart} bytes`);
computeShare.forEach((c) => console.log(`  miner on stage ${c.stage}: computing ${(c.compute * 100).toFixed(1)}%, waiting ${(c.waiting * 100).toFixed(1)}%`));

finish('swarm', {
  efficiency: +efficiency.toFixed(4),
  relayedBytes: relayEnd - relayStart,
  wireBytesPerToken: +wireBytesPerToken.toFixed(2),
  swarmTokensPerCpuSecond: Math.round(swarmTokensPerCpuSecond),
  singleProcessTokensPerCpuSecond: Math.round(localTokensPerCpuSecond),
  swarmTokensPerSecond: Math.round(swarmTokens / measureSeconds),
  minerTime: computeShare,
  budget: { preset: 'tiny', layout, batchSize, miners: '3 stages x 2', warmupSeconds, measureSeconds, note: 'reduced preset: tiny; all processes on this machine' },
  machine: machine(backend),
});
process.exit(0);
