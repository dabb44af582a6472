/**
 * The price of being distributed: tokens per CPU-second of a swarm (3 stages
 * × 2 miners, each a separate process on this machine) against the
 * single-process local trainer on the same model, layout and microbatch.
 *
 *   npm run bench:swarm                  (90 s measured after a 30 s warm-up)
 *   npm run bench:swarm -- --seconds 30
 *   npm run bench:swarm -- --preset small (the default run's layout: b = 8, int8)
 *
 * Preset: `tiny` by default (documented reduction: `small` runs ~260 tokens/s per core
 * here, too slow for a swarm of six processes on two cores to say much of speed; its
 * bytes per token, which do not depend on speed, it measures).
 * CPU time is read from /proc for every miner process (user + system). What each
 * miner moved, by kind (traffic.ts), is read from its heartbeats at the start and end
 * of the measured window: bytes per token it trained, all kinds sent and received.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { BatchSampler, LocalTrainer, PRESETS } from '@train-at-home/model';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { join } from 'node:path';
import { buildApp } from '../server/src/app';
import { defaultRunConfig } from '../server/src/run-config';
import { finish, machine } from './lib';
import { bytesPerToken, printBytesPerToken, readTraffic } from './traffic';

const { values } = parseArgs({ options: { seconds: { type: 'string', default: '90' }, warmup: { type: 'string', default: '30' }, preset: { type: 'string', default: 'tiny' } } });
const measureSeconds = Number(values.seconds);
const warmupSeconds = Number(values.warmup);
const preset = values.preset as 'tiny' | 'small';
if (preset !== 'tiny' && preset !== 'small') throw new Error(`--preset tiny or small, not ${preset}`);
const run = defaultRunConfig({ name: 'bench', preset, ...(preset === 'tiny' ? { bottleneck: 32, int8: true } : {}), training: { batchSize: 16, peakLr: preset === 'tiny' ? 0.006 : 0.003, warmupSteps: 10, totalSteps: 100_000 } });
const layout = { stages: run.stages, bottleneck: run.bottleneck, int8: run.int8, ...(run.codec ? { codec: run.codec } : {}) };
const batchSize = run.training.batchSize;
const config = PRESETS[preset];
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
const app = await buildApp({ run });
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

const stageOf = async (): Promise<Map<string, number>> => new Map((await app.coordinator.stageMap()).flatMap(({ stage, miners }) => miners.map((m) => [m.id, stage] as [string, number])));
const cpuStart = miners.map((m) => cpuSeconds(m.child.pid!));
const [lossesStart, bytesStart, relayStart, trafficStart] = [await losses(), await sentBytes(), app.coordinator.relayed.frameBytes, readTraffic(app.coordinator.live.miners)];
await new Promise((r) => setTimeout(r, measureSeconds * 1000));
const cpuEnd = miners.map((m) => cpuSeconds(m.child.pid!));
const [lossesEnd, bytesEnd, relayEnd, trafficEnd, stages] = [await losses(), await sentBytes(), app.coordinator.relayed.frameBytes, readTraffic(app.coordinator.live.miners), await stageOf()];
const traffic = bytesPerToken(trafficEnd, trafficStart, stages);
printBytesPerToken(traffic);

for (const m of miners) m.child.kill('SIGTERM');
await Promise.all(miners.map((m) => new Promise((r) => m.child.once('exit', r))));
const perMiner = miners.map((m) => JSON.parse(m.output.split('\n').find((l) => l.startsWith('{"minerStats"')) ?? '{"minerStats":{}}').minerStats);
await app.close();

const swarmTokens = (lossesEnd - lossesStart) * tokensPerMicrobatch;
const swarmCpuSeconds = cpuEnd.reduce((a, c, i) => a + c - cpuStart[i]!, 0);
const swarmTokensPerCpuSecond = swarmTokens / swarmCpuSeconds;
const efficiency = swarmTokensPerCpuSecond / localTokensPerCpuSecond;
// The receipts' payload bytes (each transfer once, activations and gradients) per token the swarm trained.
const boundaryBytesPerToken = swarmTokens > 0 ? (bytesEnd - bytesStart) / swarmTokens : 0;
const computeShare = perMiner.map((s: { stage: number; computeMs: number; wallMs: number }) => ({ stage: s.stage, compute: +(s.computeMs / s.wallMs).toFixed(3), waiting: +(1 - s.computeMs / s.wallMs).toFixed(3) }));
console.log(`swarm: ${swarmTokens} tokens in ${measureSeconds} s, ${swarmCpuSeconds.toFixed(1)} CPU-s, ${swarmTokensPerCpuSecond.toFixed(0)} tokens per CPU-second`);
console.log(`efficiency ${(efficiency * 100).toFixed(1)}%, ${boundaryBytesPerToken.toFixed(1)} boundary payload bytes per token (receipts), relayed ${relayEnd - relayStart} bytes`);
computeShare.forEach((c) => console.log(`  miner on stage ${c.stage}: computing ${(c.compute * 100).toFixed(1)}%, waiting ${(c.waiting * 100).toFixed(1)}%`));

finish(preset === 'tiny' ? 'swarm' : 'swarm-small', {
  efficiency: +efficiency.toFixed(4),
  relayedBytes: relayEnd - relayStart,
  boundaryBytesPerToken: +boundaryBytesPerToken.toFixed(2),
  ...traffic,
  swarmTokensPerCpuSecond: Math.round(swarmTokensPerCpuSecond),
  singleProcessTokensPerCpuSecond: Math.round(localTokensPerCpuSecond),
  swarmTokensPerSecond: Math.round(swarmTokens / measureSeconds),
  minerTime: computeShare,
  budget: { preset, layout, batchSize, miners: '3 stages x 2', warmupSeconds, measureSeconds, note: `${preset === 'tiny' ? 'reduced preset: tiny; ' : ''}all processes on this machine` },
  machine: machine(backend),
});
process.exit(0);
