/**
 * npm run bench:rotation — what rotating pathways costs in held-out loss.
 *
 * Since `incentives.rotatePathways` (on by default), each replica's downstream
 * partner changes at every merge of its stage (partner = (rank + the stage's
 * merge round) mod n), so that the validator's CLASP attribution sees every
 * miner on several pathways. `rotatePathways: false` keeps one fixed pairing
 * (rank r feeds rank r). This runs the same swarm twice, identical but for
 * that setting, and compares the held-out loss of the merged checkpoints.
 *
 * Each run: 3 stages × 2 replicas of `tiny` (six miner processes over WebRTC
 * on loopback, as bench:diloco and the replicas test; a coordinator with
 * in-memory PGlite in this process), bottleneck 128 (int8), microbatch 32,
 * peak lr 0.006, 20 warmup steps, cosine over 200 steps, merging every 10
 * verified microbatches (the run's default merge otherwise). Every stage-0
 * replica feeds exactly N microbatches. Miner i of the six has data seed
 * 1000 + i (six single-miner processes: `--count 6` does not pass
 * `--data-seed` on) and registers i-th (each reaches the coordinator through
 * a gate of this process that opens in turn), so miners 0 and 3 hold stage 0
 * and draw the same batches in every run. A run ends once every microbatch has trained and every stage's
 * leftover work (fewer than 10 since its last merge) is merged too; the
 * merged checkpoints of every round are kept as they are uploaded and the
 * validator measures each round's held-out loss after the miners stopped.
 *
 *   npm run bench:rotation                        (N = 50 per stage-0 replica: 100 microbatches a run)
 *   npm run bench:rotation -- --microbatches 30   (a smaller budget, stated in the output)
 *   npm run bench:rotation -- --pairs 2           (both runs twice, alternating order: run-to-run noise)
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, connect, type AddressInfo, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { PRESETS } from '@train-at-home/model';
import { DATA_DIR, initNodeBackend, prepareData } from '@train-at-home/model/node';
import { buildApp, type App } from '../server/src/app';
import { finish, machine } from './lib';

const { values } = parseArgs({ options: { microbatches: { type: 'string', default: '50' }, pairs: { type: 'string', default: '1' } } });
const N = Number(values.microbatches);
const PAIRS = Number(values.pairs);
const preset = 'tiny';
const config = PRESETS[preset];
const layout = { stages: 3, bottleneck: 128, int8: true };
const training = { batchSize: 32, peakLr: 0.006, warmupSteps: 20, totalSteps: 200 };
const merge = { every: 10 };
const seed = 1;
const MINERS = 6;
const dataSeed = (i: number): number => 1000 + i;

const backend = await initNodeBackend();
prepareData({ outDir: DATA_DIR, vocabSize: config.vocabSize }); // once here, not raced by six miners
const cli = fileURLToPath(new URL('../apps/miner/src/main.ts', import.meta.url));

interface RunResult {
  rotate: boolean;
  heldOut: number;
  bigram: number;
  rounds: number[];
  /** Spawning the first miner → every merge over and stored (with the 5 s settle and the 8 s quiet check). */
  wallS: number;
  /** Of which until all six miners registered (stage 0 feeds as soon as stage 1 has a miner). */
  startS: number;
  microbatches: number;
  complete: boolean;
  outerRounds: number;
  mergeEvents: number;
  resubmitted: number;
  stage0Seeds: number[];
  heldOutByRound: Array<{ round: number; heldOut: number }>;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A TCP relay to the coordinator that holds its connections until released: it orders the miners' registrations. */
interface Gate {
  port: number;
  /** Whether the miner behind it has connected (it has booted). */
  knocked(): boolean;
  release(): void;
  close(): void;
}
async function openGate(target: number): Promise<Gate> {
  let released = false;
  const held: Socket[] = [];
  const open = new Set<Socket>();
  const relay = (c: Socket): void => {
    const upstream = connect(target, '127.0.0.1');
    open.add(c).add(upstream);
    c.pipe(upstream).on('error', () => c.destroy());
    upstream.pipe(c).on('error', () => upstream.destroy());
    c.on('error', () => upstream.destroy()).on('close', () => upstream.destroy());
    upstream.on('error', () => c.destroy()).on('close', () => c.destroy());
  };
  const server = createServer((c) => {
    if (released) return relay(c);
    c.pause();
    held.push(c);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as AddressInfo).port,
    knocked: () => held.length > 0 || released,
    release() {
      released = true;
      for (const c of held.splice(0)) relay(c);
    },
    close() {
      server.close();
      for (const c of [...held, ...open]) c.destroy();
    },
  };
}

async function swarmRun(rotate: boolean, label: string): Promise<RunResult> {
  const app: App = await buildApp({
    run: { name: `rotation-${label}`, preset, seed, ...layout, training, merge, incentives: { rotatePathways: rotate } },
  });
  await app.fastify.listen({ port: 0, host: '127.0.0.1' });
  const port = (app.fastify.server.address() as { port: number }).port;
  const runId = app.coordinator.runId;
  const tail: string[] = [];
  const stats: Array<{ seed: number; stage?: number; microbatches: number; resubmitted: number }> = [];
  const registered = async (): Promise<number> =>
    ((await app.fastify.inject({ method: 'GET', url: '/api/stages' })).json() as { stages: Array<{ miners: unknown[] }> }).stages.reduce((n, s) => n + s.miners.length, 0);
  const started = Date.now();
  const miners: ChildProcess[] = [];
  const gates: Gate[] = [];
  for (let i = 0; i < MINERS; i++) {
    const gate = await openGate(port);
    gates.push(gate);
    const child = spawn(process.execPath, ['--import', 'tsx', cli, '--coordinator', `http://127.0.0.1:${gate.port}`, '--count', '1', '--microbatches', String(N), '--data-seed', String(dataSeed(i))], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let buffered = '';
    child.stdout!.on('data', (c: Buffer) => {
      buffered += c.toString();
      const lines = buffered.split('\n');
      buffered = lines.pop()!;
      for (const line of lines) {
        if (line.startsWith('{"minerStats"')) stats.push({ seed: dataSeed(i), ...(JSON.parse(line) as { minerStats: { stage?: number; microbatches: number; resubmitted: number } }).minerStats });
        else if (tail.push(line) > 40) tail.shift();
      }
    });
    miners.push(child);
    await sleep(300); // as the CLI's --count
  }
  // The six boot side by side, each holding its connection at its gate; then they register in order, each
  // once the one before it has: the i-th newcomer gets stage i mod 3, so miners 0 and 3 (seeds 1000 and 1003)
  // hold stage 0 in every run, and the six register within a second or two. (Stage 0 feeds as soon as stage
  // 1 has a miner: started one by one, it fed stage 1 while stage 2 was still empty, and the lost microbatch
  // stalled that replica for its 30 s timeout.) A held connection is let go within 12 s, well before
  // socket.io's 20 s connect timeout.
  for (const giveUp = Date.now() + 12_000; Date.now() < giveUp && gates.some((g) => !g.knocked()); ) await sleep(100);
  for (const [i, gate] of gates.entries()) {
    gate.release();
    for (const giveUp = Date.now() + 120_000; (await registered()) < i + 1; ) {
      if (Date.now() > giveUp) throw new Error(`[${label}] miner ${i} did not register in 2 minutes`);
      await sleep(50);
    }
  }
  const startS = Math.round((Date.now() - started) / 1000);

  const reports = async (): Promise<number> => (await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE run_id = $1 AND name = 'train_loss'`, [runId]))[0]!.n;
  // Every stage's merged checkpoint of every round, copied as it is uploaded (the coordinator keeps only the last few).
  const kept = new Map<string, Uint8Array>();
  const keep = async (): Promise<void> => {
    const rows = await app.db.query<{ stage: number; epoch: number }>('SELECT stage, epoch FROM checkpoints WHERE run_id = $1 AND data IS NOT NULL', [runId]);
    for (const r of rows) {
      if (kept.has(`${r.stage}:${r.epoch}`)) continue;
      const [row] = await app.db.query<{ data: Uint8Array }>('SELECT data FROM checkpoints WHERE run_id = $1 AND stage = $2 AND epoch = $3', [runId, r.stage, r.epoch]);
      if (row) kept.set(`${r.stage}:${r.epoch}`, new Uint8Array(row.data));
    }
  };
  const status = (): Array<{ stage: number; round: number; phase: string }> => app.coordinator.phases.status();
  const log = (what: string): void => console.log(`[${label}] ${Math.round((Date.now() - started) / 1000)} s: ${what}`);

  // Train until every microbatch has a loss report (or nothing moves for 3 minutes)…
  let lastProgress = Date.now();
  let trained = 0;
  let lastRounds = '';
  while (trained < 2 * N && Date.now() - lastProgress < 180_000) {
    await sleep(2_000);
    await keep();
    const now = await reports();
    if (now > trained) [trained, lastProgress] = [now, Date.now()];
    const rounds = JSON.stringify(status().map((s) => s.round));
    if (rounds !== lastRounds) log(`${trained} microbatches, merge rounds ${(lastRounds = rounds)}`);
  }
  const complete = trained >= 2 * N;
  // …then merge what is left: a stage whose replicas have fewer than `every` microbatches since their last
  // merge would merge only after merge.maxTrainingMs (2 minutes); after the last gradients landed, its
  // limit drops to zero, so such a stage merges at the next tick (the same in both runs). The run ends
  // once no stage is merging, no round has started for 8 s and every stage's latest round has its checkpoint.
  await sleep(5_000);
  app.coordinator.run.merge.maxTrainingMs = 0;
  let quietSince = Date.now();
  let roundsNow = JSON.stringify(status().map((s) => s.round));
  for (const giveUp = Date.now() + 120_000; Date.now() < giveUp; ) {
    await sleep(1_000);
    await keep();
    const s = status();
    const now = JSON.stringify(s.map((x) => x.round));
    if (now !== roundsNow) [roundsNow, quietSince] = [now, Date.now()];
    const uploaded = s.every((x) => x.round === 0 || kept.has(`${x.stage}:${x.round}`));
    if (s.every((x) => x.phase === 'training') && uploaded && Date.now() - quietSince >= 8_000) break;
  }
  const wallS = Math.round((Date.now() - started) / 1000);
  log(`trained ${await reports()} microbatches; final merge rounds ${roundsNow}`);

  // Stop the miners (each prints its stats), then evaluate with the machine to ourselves.
  for (const m of miners) m.kill('SIGTERM');
  await Promise.all(miners.map((m) => new Promise((r) => (m.exitCode === null && m.signalCode === null ? m.once('exit', r) : r(null)))));
  for (const g of gates) g.close();
  if (!complete) console.error(`[${label}] incomplete: ${trained} of ${2 * N} microbatches; the miners' last lines:\n${tail.join('\n')}`);
  const final = await app.validator.evaluate();
  if (!final) throw new Error(`[${label}] a stage has no checkpoint`);
  const lastCommon = Math.min(...status().map((s) => s.round));
  const heldOutByRound: RunResult['heldOutByRound'] = [];
  for (let k = 1; k <= lastCommon; k++) {
    const blobs = Array.from({ length: layout.stages }, (_, s) => kept.get(`${s}:${k}`));
    if (blobs.some((b) => !b)) continue;
    const r = await app.validator.process.request<{ heldOutLoss: number }>({ kind: 'evaluate', blobs: blobs as Uint8Array[] });
    heldOutByRound.push({ round: k, heldOut: +r.heldOutLoss.toFixed(4) });
  }
  const merges = (await app.fastify.inject({ method: 'GET', url: '/api/merges' })).json() as {
    rounds: Array<{ participants: string[] | null; mode: string | null; endedAt: string | null }>;
    events: unknown[];
  };
  const microbatches = await reports();
  await app.close();
  const result: RunResult = {
    rotate,
    heldOut: +final.heldOutLoss.toFixed(4),
    bigram: +final.bigramLoss.toFixed(4),
    rounds: final.rounds,
    wallS,
    startS,
    microbatches,
    complete,
    outerRounds: merges.rounds.filter((r) => r.endedAt && r.mode === 'outer' && r.participants?.length === 2).length,
    mergeEvents: merges.events.length,
    resubmitted: stats.reduce((a, s) => a + (s.resubmitted ?? 0), 0),
    stage0Seeds: stats.filter((s) => s.stage === 0).map((s) => s.seed).sort(),
    heldOutByRound,
  };
  log(`held-out ${result.heldOut} at rounds ${JSON.stringify(result.rounds)} (${wallS} s of training)`);
  return result;
}

const began = Date.now();
const pairs: Array<{ rotate: RunResult; fixed: RunResult }> = [];
for (let p = 0; p < PAIRS; p++) {
  // Alternating order, so that a drift in the shared machine's load falls on both settings alike.
  const order = p % 2 === 0 ? [true, false] : [false, true];
  const got: Partial<Record<'rotate' | 'fixed', RunResult>> = {};
  for (const rotate of order) got[rotate ? 'rotate' : 'fixed'] = await swarmRun(rotate, `${rotate ? 'rotate' : 'fixed'}${PAIRS > 1 ? `-${p + 1}` : ''}`);
  pairs.push({ rotate: got.rotate!, fixed: got.fixed! });
}
const totalS = Math.round((Date.now() - began) / 1000);

// The tables.
const pad = (s: string | number, n: number): string => String(s).padStart(n);
console.log('');
console.log(`${N} microbatches per stage-0 replica (${2 * N} a run), tiny, 3 stages × 2 replicas, b = 128 int8, batch 32, merge every 10; ${backend}, ${machine(backend).cores} cores`);
console.log(`run        ${pad('held-out', 9)} ${pad('rounds', 10)} ${pad('trained', 8)} ${pad('outer', 6)} ${pad('events', 7)} ${pad('resent', 7)} ${pad('stage-0 seeds', 14)} ${pad('wall s', 7)} ${pad('start s', 8)}`);
for (const [p, pair] of pairs.entries()) {
  for (const r of [pair.rotate, pair.fixed]) {
    const name = `${r.rotate ? 'rotate' : 'fixed'}${PAIRS > 1 ? ` #${p + 1}` : ''}`;
    console.log(`${name.padEnd(10)} ${pad(r.heldOut.toFixed(4), 9)} ${pad(JSON.stringify(r.rounds), 10)} ${pad(r.microbatches, 8)} ${pad(r.outerRounds, 6)} ${pad(r.mergeEvents, 7)} ${pad(r.resubmitted, 7)} ${pad(JSON.stringify(r.stage0Seeds), 14)} ${pad(r.wallS, 7)} ${pad(r.startS, 8)}`);
  }
}
console.log('');
console.log(`held-out loss of the merged round (every stage's checkpoint of that round)`);
console.log(`round ${pairs.map((_, p) => `${pad(`rotate${PAIRS > 1 ? `#${p + 1}` : ''}`, 9)} ${pad(`fixed${PAIRS > 1 ? `#${p + 1}` : ''}`, 9)} ${pad('r − f', 8)}`).join('  ')}`);
const maxRound = Math.max(...pairs.flatMap((p) => [...p.rotate.heldOutByRound, ...p.fixed.heldOutByRound].map((r) => r.round)), 0);
for (let k = 1; k <= maxRound; k++) {
  const cells = pairs.map((pair) => {
    const a = pair.rotate.heldOutByRound.find((r) => r.round === k)?.heldOut;
    const b = pair.fixed.heldOutByRound.find((r) => r.round === k)?.heldOut;
    return `${pad(a?.toFixed(4) ?? '–', 9)} ${pad(b?.toFixed(4) ?? '–', 9)} ${pad(a !== undefined && b !== undefined ? (a - b >= 0 ? '+' : '') + (a - b).toFixed(4) : '–', 8)}`;
  });
  console.log(`${pad(k, 5)} ${cells.join('  ')}`);
}
console.log('');

const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
const summary = (runs: RunResult[]): { heldOut: number; rounds: number[]; wallS: number } =>
  runs.length === 1
    ? { heldOut: runs[0]!.heldOut, rounds: runs[0]!.rounds, wallS: runs[0]!.wallS }
    : { heldOut: +mean(runs.map((r) => r.heldOut)).toFixed(4), rounds: runs.at(-1)!.rounds, wallS: Math.round(mean(runs.map((r) => r.wallS))) };
const rotate = summary(pairs.map((p) => p.rotate));
const fixed = summary(pairs.map((p) => p.fixed));
const costs = pairs.map((p) => +(p.rotate.heldOut - p.fixed.heldOut).toFixed(4));
finish('rotation', {
  rotate,
  fixed,
  costNats: +(rotate.heldOut - fixed.heldOut).toFixed(4),
  microbatchesPerRun: 2 * N,
  machine: machine(backend),
  ...(PAIRS > 1
    ? {
        // Run-to-run noise: the spread of each setting over its repeats, beside the per-pair costs.
        costNatsPerPair: costs,
        spreadNats: {
          rotate: +(Math.max(...pairs.map((p) => p.rotate.heldOut)) - Math.min(...pairs.map((p) => p.rotate.heldOut))).toFixed(4),
          fixed: +(Math.max(...pairs.map((p) => p.fixed.heldOut)) - Math.min(...pairs.map((p) => p.fixed.heldOut))).toFixed(4),
        },
      }
    : {}),
  runs: pairs.flatMap((p) => [p.rotate, p.fixed]),
  budget: { preset, layout, training, merge, microbatchesPerStage0Replica: N, dataSeeds: Array.from({ length: MINERS }, (_, i) => dataSeed(i)), pairs: PAIRS, totalS },
});
process.exit(0);
