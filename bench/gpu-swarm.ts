/**
 * A 3-stage swarm of Node miners trains the `gpu` preset (d = 768, 12 layers,
 * context 256, 4096-token vocabulary) on one machine's GPU (WebGPU through
 * Dawn), until the held-out loss of the assembled checkpoints is below the
 * bigram baseline or the time limit passes.
 *
 *   npm run bench:gpu-swarm                                        (gpu preset, WebGPU, 480 s)
 *   npm run bench:gpu-swarm -- --preset tiny --backend wasm --seconds 120   (the same on CPU, tiny)
 *
 * The coordinator runs here (buildApp, embedded in-memory PGlite, 127.0.0.1);
 * the miners are child processes (apps/miner/src/main.ts --count 3), one per
 * stage, no replicas: each stage "merges" alone every --merge-every verified
 * microbatches, and its miner uploads the stage's weights as that round's
 * checkpoint. Held-out loss is the validator's (a process of its own) on the
 * latest checkpoint of every stage; on WebGPU the validator evaluates on the
 * GPU too (TAH_VALIDATOR_BACKEND), since the `gpu` preset does not fit WASM's
 * heap. Spot checks are off (spotCheckRate 0): this measures training only.
 *
 * Prints a progress line per evaluation (elapsed s, tokens trained, held-out
 * loss) and last one JSON line, also $TAH_RESULTS_DIR/gpu-swarm.json (default
 * bench/results/). Bundled for the GPU machine by scripts/device-swarm-bundle.sh:
 * there, miner.mjs and validator.mjs next to this file are run as they are.
 */
import { spawn } from 'node:child_process';
import { createWriteStream, existsSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { PRESETS, type PresetName } from '@train-at-home/model';
import { buildApp } from '../server/src/app';
import { finish, machine, RESULTS_DIR } from './lib';

const { values } = parseArgs({
  options: {
    preset: { type: 'string', default: 'gpu' },
    backend: { type: 'string', default: 'webgpu' },
    /** The validator's backend; default: webgpu when the miners use it, else wasm. */
    'validator-backend': { type: 'string' },
    seconds: { type: 'string', default: '480' },
    batch: { type: 'string', default: '16' },
    lr: { type: 'string' },
    warmup: { type: 'string' },
    bottleneck: { type: 'string' },
    'merge-every': { type: 'string', default: '20' },
    // Microbatches stage 0 keeps in the pipeline: with one, each of 3 stages idles while the other two
    // work (the first H100 run's miners computed 25-29% of the time); one per stage keeps all busy.
    'in-flight': { type: 'string', default: '3' },
    /** Seconds between held-out evaluations (each waits for a newer checkpoint of every stage). */
    'eval-every': { type: 'string', default: '20' },
  },
});
const preset = values.preset as PresetName;
if (!(preset in PRESETS)) throw new Error(`--preset is one of ${Object.keys(PRESETS).join(', ')}`);
if (!['webgpu', 'wasm', 'cpu'].includes(values.backend!)) throw new Error('--backend is webgpu, wasm or cpu');
const config = PRESETS[preset];
const tiny = preset === 'tiny';
const seconds = Number(values.seconds);
const batchSize = Number(values.batch);
// Per preset: tiny's CI settings (replicas.test.ts), else GPT-2 small's learning rate.
const peakLr = Number(values.lr ?? (tiny ? 0.006 : 6e-4));
const warmupSteps = Number(values.warmup ?? (tiny ? 20 : 50));
const bottleneck = Number(values.bottleneck ?? (tiny ? config.dModel : 192));
const mergeEvery = Number(values['merge-every']);
const evalEveryMs = Number(values['eval-every']) * 1000;
const validatorBackend = values['validator-backend'] ?? (values.backend === 'webgpu' ? 'webgpu' : 'wasm');
const tokensPerMicrobatch = batchSize * config.contextLength;

// Bundled (scripts/device-swarm-bundle.sh): the miner and validator are .mjs files next to this one, run
// with no loader. From the repository: the TypeScript entries through tsx.
const here = dirname(fileURLToPath(import.meta.url));
const bundled = import.meta.url.endsWith('.mjs') && existsSync(join(here, 'miner.mjs'));
const minerArgs = bundled ? [join(here, 'miner.mjs')] : ['--import', 'tsx', fileURLToPath(new URL('../apps/miner/src/main.ts', import.meta.url))];
if (bundled) {
  process.env.TAH_VALIDATOR_ENTRY ??= join(here, 'validator.mjs');
  // The carried shards are used as they are: the corpus packages that prepared them are not carried.
  process.env.TAH_DATA_PREPARED ??= '1';
}
process.env.TAH_VALIDATOR_BACKEND = validatorBackend;

const run = {
  name: 'gpu-swarm',
  preset,
  stages: 3,
  bottleneck,
  int8: true,
  training: { batchSize, peakLr, warmupSteps, totalSteps: 1_000_000 },
  // One miner per stage: a merge round of one participant just names the stage's weights, and its miner
  // uploads them as the round's checkpoint (phases.ts, swarm/merge.ts): one every `mergeEvery` microbatches.
  // readyMs: a gpu stage's merge-ready reads back and hashes ~300 MB and builds two contributions' roots, seconds on
  // the device's CPU (the H200 run's every answer came after the default 5 s); the phase ends once all have answered.
  merge: { every: mergeEvery, maxTrainingMs: 120_000, readyMs: 60_000 },
  incentives: { spotCheckRate: 0 },
};
const app = await buildApp({ run });
app.validator.evaluateEveryMs = Infinity; // evaluated below, on this benchmark's schedule only
await app.fastify.listen({ port: 0, host: '127.0.0.1' });
const port = (app.fastify.server.address() as { port: number }).port;
const t0 = performance.now();
const elapsed = (): number => (performance.now() - t0) / 1000;
const say = (line: string): void => console.log(`gpu-swarm ${elapsed().toFixed(0).padStart(4)} s: ${line}`);
say(`coordinator on 127.0.0.1:${port}: ${preset} (d ${config.dModel}, ${config.nLayer} layers, ctx ${config.contextLength}, vocab ${config.vocabSize}), 3 stages, bottleneck ${bottleneck} int8, batch ${batchSize}, lr ${peakLr}, warmup ${warmupSteps}, merge every ${mergeEvery}; miners on ${values.backend}, validator on ${validatorBackend}${bundled ? ' (bundled)' : ''}`);

// The miners: one parent process that starts one child per miner. Their full log goes to a file; the
// lines that say what runs where, and anything that went wrong, are echoed.
mkdirSync(RESULTS_DIR, { recursive: true });
const minerLog = createWriteStream(join(RESULTS_DIR, 'gpu-swarm-miners.log'));
const miners = spawn(
  process.execPath,
  [...minerArgs, '--coordinator', `http://127.0.0.1:${port}`, '--count', '3', '--backend', values.backend!, '--in-flight', values['in-flight']!],
  { stdio: ['ignore', 'pipe', 'pipe'] },
);
let minerOutput = '';
const IMPORTANT = /backend|webgpu|WGSL|unavailable|refused|not sent|failed|error|cannot|abort/i;
for (const stream of [miners.stdout!, miners.stderr!]) {
  let partial = '';
  stream.on('data', (c: Buffer) => {
    const text = c.toString();
    minerLog.write(text);
    minerOutput += text;
    if (minerOutput.length > 1_000_000) minerOutput = minerOutput.slice(-200_000);
    const lines = (partial + text).split('\n');
    partial = lines.pop()!;
    for (const l of lines) if (IMPORTANT.test(l) && !l.startsWith('{"minerStats"')) console.log(`  ${l.slice(0, 300)}`);
  });
}
let minersExited = false;
miners.once('exit', (code, signal) => {
  minersExited = true;
  say(`miners exited (${signal ?? code})`);
});

const scalar = async (sql: string): Promise<number> => Number(Object.values((await app.db.query<Record<string, unknown>>(sql))[0] ?? {})[0] ?? 0);
const microbatches = (): Promise<number> => scalar(`SELECT count(*)::int FROM metrics WHERE name = 'train_loss'`);
const recentTrainLoss = (): Promise<number> => scalar(`SELECT avg(value)::float8 FROM (SELECT value FROM metrics WHERE name = 'train_loss' ORDER BY created_at DESC LIMIT 20) t`);
/** The oldest of the stages' latest checkpoint rounds (0 while a stage has none). */
const checkpointRound = (): Promise<number> =>
  scalar(`SELECT CASE WHEN count(*) = 3 THEN min(r) ELSE 0 END::int FROM (SELECT max(epoch) AS r FROM checkpoints GROUP BY stage) t`);

// Wait for a miner on every stage.
for (;;) {
  const stages = (await app.fastify.inject({ method: 'GET', url: '/api/stages' })).json().stages.map((s: { miners: unknown[] }) => s.miners.length);
  if (stages.every((n: number) => n >= 1)) break;
  if (minersExited || elapsed() > 180) throw new Error(`the miners did not fill the stages (${JSON.stringify(stages)})`);
  await new Promise((r) => setTimeout(r, 1000));
}
say('a miner on every stage');

interface Point { seconds: number; tokens: number; heldOutLoss: number; trainLoss: number; rounds: number[]; evalSeconds: number }
const curve: Point[] = [];
let bigramLoss = NaN;
let firstTokenAt: number | undefined;
let evaluatedRound = 0;
let lastEvalAt = 0;
let lastProgressAt = 0;
let below: Point | undefined;
for (;;) {
  await new Promise((r) => setTimeout(r, 1000));
  const done = elapsed() >= seconds || minersExited;
  const n = await microbatches();
  if (n > 0) firstTokenAt ??= elapsed();
  const round = await checkpointRound();
  if (round > evaluatedRound && (done || performance.now() - lastEvalAt >= evalEveryMs)) {
    const at = { seconds: elapsed(), tokens: n * tokensPerMicrobatch, trainLoss: await recentTrainLoss() };
    lastEvalAt = performance.now();
    try {
      const r = await app.validator.evaluate();
      if (r) {
        evaluatedRound = Math.min(...r.rounds);
        bigramLoss = r.bigramLoss;
        const point: Point = { ...at, heldOutLoss: r.heldOutLoss, rounds: r.rounds, evalSeconds: (performance.now() - lastEvalAt) / 1000 };
        curve.push(point);
        say(`${point.tokens} tokens trained, held-out ${r.heldOutLoss.toFixed(3)} (bigram ${r.bigramLoss.toFixed(3)}), train ${at.trainLoss.toFixed(3)}, checkpoints of rounds ${JSON.stringify(r.rounds)}, evaluated in ${point.evalSeconds.toFixed(1)} s`);
        if (r.heldOutLoss < r.bigramLoss) below = point;
        // Deleted checkpoints' space is reused, not grown into (PGlite keeps its files in memory).
        await app.db.query('VACUUM checkpoints');
      }
    } catch (e) {
      say(`evaluation failed: ${(e as Error).message}`);
    }
  } else if (performance.now() - lastProgressAt >= 10_000) {
    lastProgressAt = performance.now();
    say(`${n * tokensPerMicrobatch} tokens trained (${n} microbatches), train ${n ? (await recentTrainLoss()).toFixed(3) : '-'}, checkpoints of round ${round}`);
  }
  if (below || done) break;
}

miners.kill('SIGTERM');
await Promise.race([new Promise((r) => (minersExited ? r(null) : miners.once('exit', r))), new Promise((r) => setTimeout(r, 15_000))]);
if (!minersExited) miners.kill('SIGKILL');
const tokens = (await microbatches()) * tokensPerMicrobatch;
const totalSeconds = elapsed();
const perMiner = minerOutput
  .split('\n')
  .filter((l) => l.startsWith('{"minerStats"'))
  .map((l) => JSON.parse(l).minerStats as { stage: number; microbatches: number; computeMs: number; wallMs: number });
const backendLines = [...new Set(minerOutput.split('\n').filter((l) => /backend webgpu on|webgpu unavailable/.test(l)).map((l) => l.replace(/^\[miner[^\]]*\] /, '')))];
// What the miners ran on: webgpu only where every miner said so (where Dawn finds no adapter they fall back to WASM).
const onGpu = minerOutput.split('\n').filter((l) => /backend webgpu on/.test(l)).length;
const backend = values.backend === 'webgpu' ? (onGpu >= 3 ? 'webgpu' : onGpu === 0 ? 'wasm' : `webgpu on ${onGpu} of 3 miners`) : values.backend!;
await app.close();

const last = curve.at(-1);
const trainingSeconds = totalSeconds - (firstTokenAt ?? totalSeconds);
finish('gpu-swarm', {
  heldOutLoss: last ? +last.heldOutLoss.toFixed(4) : null,
  bigramLoss: Number.isFinite(bigramLoss) ? +bigramLoss.toFixed(4) : null,
  belowBigram: !!below,
  /** Seconds from the coordinator's start to the first held-out loss below the bigram baseline (or to the end). */
  seconds: +(below?.seconds ?? totalSeconds).toFixed(1),
  tokens: below?.tokens ?? tokens,
  tokensPerSec: trainingSeconds > 0 ? Math.round(tokens / trainingSeconds) : 0,
  totalSeconds: +totalSeconds.toFixed(1),
  trainingSeconds: +trainingSeconds.toFixed(1),
  totalTokens: tokens,
  backend,
  requestedBackend: values.backend,
  /** Asked of the validator (TAH_VALIDATOR_BACKEND); it falls back to WASM as the miners do, saying so on stderr. */
  validatorBackend,
  adapter: backendLines,
  preset,
  stages: 3,
  bottleneck,
  batchSize,
  peakLr,
  warmupSteps,
  mergeEvery,
  inFlight: Number(values['in-flight']),
  curve: curve.map((p) => ({ seconds: +p.seconds.toFixed(1), tokens: p.tokens, heldOutLoss: +p.heldOutLoss.toFixed(4), trainLoss: +p.trainLoss.toFixed(4), rounds: p.rounds, evalSeconds: +p.evalSeconds.toFixed(1) })),
  minerTime: perMiner.map((s) => ({ stage: s.stage, microbatches: s.microbatches, computing: s.wallMs ? +(s.computeMs / s.wallMs).toFixed(3) : 0 })),
  machine: machine(backend),
});
process.exit(0);
