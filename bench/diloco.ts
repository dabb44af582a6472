/**
 * npm run bench:diloco — what data parallelism with merges costs in quality.
 *
 * The swarm: 3 stages × 2 replicas of `tiny` (six miner processes over WebRTC
 * on loopback, a coordinator with PGlite in this process), every stage-0
 * replica feeding exactly K microbatches, merging every 10 verified
 * microbatches (the run's default merge: butterfly all-reduce, fp16, plain
 * averaging). It ends when every microbatch has trained and every stage's last
 * merge is done; the coordinator's validator evaluates the merged checkpoints
 * after every merge round and at the end.
 *
 * The baselines: the same token budget with no data parallelism, in one
 * process through the same stages and codec (the local trainer, which the
 * single-replica swarm matches step for step):
 *   - `noDp`: one model, the same microbatch size, 2K steps;
 *   - `noDpLargeBatch`: one model, twice the microbatch, K steps.
 * Each trains on its own cosine schedule over its own steps, like the swarm.
 *
 *   npm run bench:diloco                        (K = 150 microbatches per replica)
 *   npm run bench:diloco -- --microbatches 60   (a smaller budget, stated in the output)
 *   npm run bench:diloco -- --precision topk32  (another merge precision: bench/results/diloco-topk32.json)
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { BatchSampler, LocalTrainer, PRESETS, evaluationBatches } from '@train-at-home/model';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { buildApp } from '../server/src/app';
import { finish, machine } from './lib';
import { bytesPerToken, printBytesPerToken, readTraffic } from './traffic';

const { values } = parseArgs({ options: { microbatches: { type: 'string', default: '150' }, precision: { type: 'string', default: 'fp16' } } });
const K = Number(values.microbatches);
const PRECISIONS = ['fp32', 'fp16', 'int8', 'topk8', 'topk32'] as const;
const precision = values.precision as (typeof PRECISIONS)[number];
if (!PRECISIONS.includes(precision)) throw new Error(`--precision must be one of ${PRECISIONS.join(', ')}`);
const preset = 'tiny';
const config = PRESETS[preset];
// As the replicas test: full boundary width (b = d), int8.
const layout = { stages: 3, bottleneck: config.dModel, int8: true };
const training = { batchSize: 32, peakLr: 0.006, warmupSteps: 20 };
const merge = { every: 10, maxTrainingMs: 30_000, precision };
const seed = 1;

const backend = await initNodeBackend();
prepareData({ outDir: DATA_DIR, vocabSize: config.vocabSize });
const data = loadDataset(join(DATA_DIR, datasetName(config.vocabSize)));

// 1. The swarm.
const app = await buildApp({ run: { name: 'diloco', preset, seed, ...layout, training: { ...training, totalSteps: K }, merge } });
await app.fastify.listen({ port: 0, host: '127.0.0.1' });
const port = (app.fastify.server.address() as { port: number }).port;
const cli = fileURLToPath(new URL('../apps/miner/src/main.ts', import.meta.url));
const started = Date.now();
const miners: ChildProcess = spawn(process.execPath, ['--import', 'tsx', cli, '--coordinator', `http://127.0.0.1:${port}`, '--count', '6', '--microbatches', String(K)], {
  stdio: ['ignore', 'ignore', 'inherit'],
});
const get = async <T>(url: string): Promise<T> => (await app.fastify.inject({ method: 'GET', url })).json() as T;
const reports = async (): Promise<number> => (await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE name = 'train_loss'`))[0]!.n;
const roundsStarted = async (): Promise<number> => (await get<{ rounds: unknown[] }>('/api/merges')).rounds.length;

const byRound: Array<{ round: number; heldOut: number }> = [];
const sample = async (): Promise<void> => {
  const r = await app.validator.evaluate();
  if (r && new Set(r.rounds).size === 1 && r.rounds[0]! > (byRound.at(-1)?.round ?? 0)) {
    byRound.push({ round: r.rounds[0]!, heldOut: +r.heldOutLoss.toFixed(4) });
    console.log(`merged round ${r.rounds[0]}: held-out ${r.heldOutLoss.toFixed(4)} (${Math.round((Date.now() - started) / 1000)} s, ${await reports()} microbatches)`);
  }
};
// Train until every microbatch is in (or nothing moves for 3 minutes)…
let lastProgress = Date.now();
for (let n = 0; n < 2 * K && Date.now() - lastProgress < 180_000; ) {
  await new Promise((r) => setTimeout(r, 5_000));
  await sample();
  const now = await reports();
  if (now > n) [n, lastProgress] = [now, Date.now()];
}
// …then until no merge has started for longer than a training phase can last (a stage with leftover work merges by then).
let quietSince = Date.now();
for (let rounds = await roundsStarted(); Date.now() - quietSince < merge.maxTrainingMs + 15_000; ) {
  await new Promise((r) => setTimeout(r, 2_000));
  await sample();
  const now = await roundsStarted();
  if (now !== rounds) [rounds, quietSince] = [now, Date.now()];
}
const final = (await app.validator.evaluate())!;
const microbatches = await reports();
const mergeLog = await get<{ rounds: Array<{ stage: number; participants: string[] | null; mode: string | null; endedAt: string | null }>; events: unknown[] }>('/api/merges');
const swarmSeconds = Math.round((Date.now() - started) / 1000);
// What each miner moved per token it trained, over the whole run, by kind (its last heartbeat's counters).
const traffic = bytesPerToken(readTraffic(app.coordinator.live.miners), undefined, new Map((await app.coordinator.stageMap()).flatMap(({ stage, miners }) => miners.map((m) => [m.id, stage] as [string, number]))));
printBytesPerToken(traffic);
miners.kill('SIGTERM');
await new Promise((r) => (miners.exitCode === null ? miners.once('exit', r) : r(null)));
await app.close();
console.log(`swarm: ${microbatches} microbatches (${2 * K} fed), held-out ${final.heldOutLoss.toFixed(4)} at rounds ${JSON.stringify(final.rounds)}, ${swarmSeconds} s`);

// 2. The same tokens with no data parallelism (the validator's held-out batches).
const heldOutBatches = evaluationBatches(data.heldOut, 32, config.contextLength, 8);
function noDp(batchSize: number, steps: number): number {
  const trainer = new LocalTrainer({ config, layout, seed, peakLr: training.peakLr, warmupSteps: training.warmupSteps, totalSteps: steps });
  const sampler = new BatchSampler(data.train, batchSize, config.contextLength, 7);
  for (let i = 0; i < steps; i++) trainer.trainStep(sampler.next());
  const loss = trainer.evaluate(heldOutBatches);
  trainer.dispose();
  console.log(`no data parallelism: ${steps} steps of ${batchSize}, held-out ${loss.toFixed(4)}`);
  return loss;
}
const tokens = microbatches * training.batchSize * config.contextLength;
const sameBatch = noDp(training.batchSize, microbatches);
const largeBatch = noDp(2 * training.batchSize, Math.round(microbatches / 2));

const improving = byRound.every((r, i) => i === 0 || r.heldOut < byRound[i - 1]!.heldOut);
finish(precision === 'fp16' ? 'diloco' : `diloco-${precision}`, {
  heldOutDiloco: +final.heldOutLoss.toFixed(4),
  heldOutNoDp: +sameBatch.toFixed(4),
  heldOutNoDpLargeBatch: +largeBatch.toFixed(4),
  // Within 5% means a ratio of at most 1.05.
  ratioToNoDp: +(final.heldOutLoss / sameBatch).toFixed(4),
  ratioToNoDpLargeBatch: +(final.heldOutLoss / largeBatch).toFixed(4),
  improvingEveryMerge: improving,
  heldOutByRound: byRound,
  bigram: +final.bigramLoss.toFixed(4),
  tokens,
  totalBytesPerToken: traffic.totalBytesPerToken,
  activationBytesPerToken: traffic.activationBytesPerToken,
  mergeBytesPerToken: traffic.mergeBytesPerToken,
  traffic: traffic.perMinerBytesPerToken,
  swarm: {
    replicas: 2,
    stages: 3,
    microbatchesPerReplica: K,
    microbatchesTrained: microbatches,
    finalRounds: final.rounds,
    outerRounds: mergeLog.rounds.filter((r) => r.endedAt && r.mode === 'outer' && r.participants?.length === 2).length,
    mergeEvents: mergeLog.events.length,
    seconds: swarmSeconds,
  },
  budget: { preset, layout, ...training, merge, note: `K = ${K} microbatches per stage-0 replica; each run's cosine schedule spans its own steps` },
  machine: machine(backend),
});
process.exit(0);
