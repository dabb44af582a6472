/**
 * npm run bench:load — how many miners one coordinator process holds.
 * (One file over 400 lines: a benchmark read top to bottom as one procedure, ramp by ramp; the coordinator and the
 * simulated miners it drives live in bench/load-coordinator.ts and testkit/.)
 *
 * The coordinator runs in a process of its own (bench/load-coordinator.ts:
 * `tiny`, 3 stages, the embedded database, then a PostgreSQL server); a
 * process of the bench's, fresh for each database, is the generator,
 * on the same machine: simulated miners that behave like the real client
 * (testkit/src/sim-miners.ts: sr25519 registration, the stage map
 * they are sent and its deltas, a heartbeat at the interval the coordinator
 * names, 2 s by default), and 30 training pipelines (a miner of each stage)
 * reporting 1 microbatch a second each: both ends' receipts of every
 * activation and gradient, and the last stage's loss. The ramp adds miners
 * step by step and measures, over WINDOW_MS at each count: heartbeat
 * round-trip p99, /api/status p99, the coordinator's RSS, and the bytes each
 * miner received from the coordinator per minute. Then the same again under
 * people's churn (TAH_LOAD_SESSION_MIN, 30 minutes by default: a miner stays
 * that long on average, so N/30 leave and as many newcomers join a minute):
 * heartbeat, /api/status and registration p99 while they come and go. Then a
 * burst of 200 departures and joins measures the coordinator's CPU per
 * registration (its CPU over the burst less its quiet rate, per join). It
 * stops when heartbeat p99 passes 500 ms, quiet or under churn, or any miner
 * is dropped.
 *
 * The simulated miners of one stage share one stage-map view
 * (SharedStageViews): every socket still receives and decodes every message,
 * but N copies of an O(N) map made the generator's own memory grow as N² (at
 * 5,000 miners 2.5 GB of heap and a quarter of its time in the garbage
 * collector, its event loop stalling until miners were dropped).
 *
 * TAH_LOAD_CPU_PROF=<folder>: the coordinator writes a V8 CPU profile there
 * when it stops (where its time went); TAH_LOAD_GENERATOR_PROF=<folder>: the
 * generator does.
 *
 * Measured here: one process on the embedded database (the headline keys),
 * one on a PostgreSQL server started here (`maxMinersOneProcessPostgres`,
 * `postgres`), and two processes in scale-out mode on that server and a
 * Redis started here (`maxMinersTwoProcesses`, `twoProcesses`): the miners
 * join the two in turn, as a load balancer spreads them; the RSS is the two
 * processes' sum. (Scale-out mode does not train a run yet: README.md,
 * "Scale-out"; the pipelines' receipts and losses are stored all the same.)
 */
import { execFileSync, fork, spawn, type ChildProcess } from 'node:child_process';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PROTOCOL_VERSION } from '@train-at-home/protocol';
import { finish, machine } from './lib';
import { SharedStageViews, simMiner, type SimMiner } from '@train-at-home/testkit/sim-miners';

/** Churn: a miner stays SESSION_MIN minutes on average (exponentially distributed), so N / SESSION_MIN leave and as many join a minute. */
const SESSION_MIN = Number(process.env.TAH_LOAD_SESSION_MIN ?? 30);
const STEPS = (process.env.TAH_LOAD_STEPS ?? '100,300,600,1000,2000,3000,5000,7500,10000').split(',').map(Number);
const WINDOW_MS = Number(process.env.TAH_LOAD_WINDOW_MS ?? 30_000);
const PIPELINES = 30;
const HB_LIMIT_MS = 500;
/** The generator process's heap limit (MB). */
const GENERATOR_HEAP_MB = 12_288;

const p99 = (xs: number[]): number => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(s.length * 0.99))]!;
};
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function startCoordinator(dataDir: string): Promise<{ child: ChildProcess; url: string }> {
  const child = fork(join(import.meta.dirname, 'load-coordinator.ts'), [], { execArgv: ['--import', 'tsx', ...(process.env.TAH_LOAD_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.TAH_LOAD_CPU_PROF}`] : [])], env: { ...process.env, TAH_LOAD_DATA_DIR: dataDir }, stdio: ['ignore', process.env.TAH_LOAD_COORDINATOR_LOG ? 'inherit' : 'ignore', 'inherit', 'ipc'] });
  return new Promise((resolve, reject) => {
    child.once('message', (m: { url: string }) => resolve({ child, url: m.url }));
    child.once('exit', (code) => reject(new Error(`the coordinator exited (${code})`)));
  });
}
/** The coordinator's RSS, the longest its event loop was held since the last ask, and its CPU time so far. */
const coordinatorState = (child: ChildProcess): Promise<{ rssMb: number; maxStallMs: number; cpuMs: number; queuedMax: number }> =>
  new Promise((resolve) => {
    const on = (m: { rssMb?: number; maxStallMs?: number; cpuMs?: number; queuedMax?: number }): void => {
      if (m.rssMb === undefined) return;
      child.off('message', on);
      resolve({ rssMb: m.rssMb, maxStallMs: m.maxStallMs ?? NaN, cpuMs: m.cpuMs ?? NaN, queuedMax: m.queuedMax ?? 0 });
    };
    child.on('message', on);
    child.send({ rss: true });
  });
/** The kernel's count of connections dropped because a listening socket's accept queue was full (Linux; this machine's, all sockets). */
function listenOverflows(): number {
  try {
    const lines = readFileSync('/proc/net/netstat', 'utf8').split('\n').filter((l) => l.startsWith('TcpExt:'));
    const [names, values] = lines.map((l) => l.trim().split(/\s+/));
    const i = names!.indexOf('ListenOverflows');
    return i < 0 ? NaN : Number(values![i]);
  } catch {
    return NaN;
  }
}

/** The generator's own event loop: a late heartbeat or a connect timeout may be this side's. */
const generatorDelay = monitorEventLoopDelay({ resolution: 20 });
generatorDelay.enable();

interface Step {
  miners: number;
  registrationP99Ms: number;
  hbP99Ms: number;
  statusP99Ms: number;
  rssMb: number;
  /** The longest the coordinator's event loop was held at once during the step (registration and window), and the generator's. */
  coordinatorMaxStallMs: number;
  generatorMaxStallMs: number;
  /** The generator's own heap and RSS at the step's end (its simulated miners' sockets live there). */
  generatorHeapMb: number;
  generatorRssMb: number;
  bytesPerMinerPerMin: number;
  stageMapBytesPerMinerPerMin: number;
  dropped: number;
  /** Joins tried again in this step (a connection or registration that did not complete), and why. */
  joinRetries: number;
  joinRetryErrors: Record<string, number>;
  /** Connections the kernel dropped from a full accept queue during the step (registration and window). */
  listenOverflows: number;
  /** Stages the miners fetched again over REST after a missed delta, in all. */
  stageMapRefetches: number;
  dropReasons: Record<string, number>;
  microbatchesReported: number;
  /** The most registrations that waited their turn at once (admission.ts) during the step: its ramp, churn and burst. */
  admissionQueueMax: number;
  /** The churn half of the window (sessions of SESSION_MIN minutes on average): joins, their p99, and what every client saw meanwhile. */
  churnRegistrations: number;
  registrationP99MsChurn: number;
  hbP99MsChurn: number;
  statusP99MsChurn: number;
  /**
   * Coordinator CPU (ms) per registration with its departure: CHURN_BURST miners leave and as many join, 25 at a
   * time, and the coordinator's CPU meanwhile, less what it spends in as long a quiet time, is divided by the joins.
   */
  cpuMsPerReg: number;
  /** The same for the step's ramp (its newcomers' joins, no departures). */
  rampCpuMsPerReg: number;
  /** Coordinator CPU, in cores, in the quiet half and in the churn half. */
  cpuCoresQuiet: number;
  cpuCoresChurn: number;
}

/** Set when this process runs one ramp (on that database) for the orchestrator below, which runs one per database. */
const RAMP = process.env.TAH_LOAD_RAMP as 'pglite' | 'postgres' | 'two-processes' | undefined;
if (!RAMP) {
  await orchestrate();
  process.exit(0);
}

const dataDir = mkdtempSync(join(tmpdir(), 'tah-load-'));
// Two processes: the first takes the singleton jobs' lease before the second starts.
const coordinators = [await startCoordinator(dataDir)];
if (RAMP === 'two-processes') coordinators.push(await startCoordinator(dataDir));
const urls = coordinators.map((c) => c.url);
/** One stage-map view per stage for all the simulated miners (SharedStageViews). */
const sharedViews = new SharedStageViews(urls[0]!);
let nextUrl = 0;
/** Every coordinator process's state: RSS summed, the longest stall of any. */
/** The most registrations that waited their turn at once in any process (admission.ts), since the step began. */
let stepQueueMax = 0;
const coordinatorsState = async (): Promise<{ rssMb: number; maxStallMs: number; cpuMs: number; rssMbEach: number[] }> => {
  const each = await Promise.all(coordinators.map((c) => coordinatorState(c.child)));
  stepQueueMax = Math.max(stepQueueMax, ...each.map((e) => e.queuedMax));
  return { rssMb: each.reduce((a, e) => a + e.rssMb, 0), maxStallMs: Math.max(...each.map((e) => e.maxStallMs)), cpuMs: each.reduce((a, e) => a + e.cpuMs, 0), rssMbEach: each.map((e) => Math.round(e.rssMb)) };
};
const miners: SimMiner[] = [];
let dropped = 0;
/** Why miners were disconnected (socket.io's reasons: 'ping timeout', 'transport close', 'io server disconnect'…). */
const dropReasons: Record<string, number> = {};
const received = new Map<SimMiner, number>();
/** Of those, the stage map's (snapshots and deltas). */
let stageMapBytes = 0;
const hbRtts: number[] = [];
const beats = new Map<SimMiner, ReturnType<typeof setInterval>>();
/** Miners closed because their session ended (churn), until their disconnect is seen. */
const leaving = new Set<SimMiner>();

/** A registered miner: counts the bytes it is sent, heartbeats like the client, and notices being dropped. */
function watch(m: SimMiner): void {
  received.set(m, 0);
  m.socket.io.engine.on('packet', (p: { data?: unknown }) => {
    const n = typeof p.data === 'string' ? Buffer.byteLength(p.data) : p.data instanceof ArrayBuffer || ArrayBuffer.isView(p.data) ? (p.data as ArrayBuffer).byteLength : 0;
    received.set(m, received.get(m)! + 1 + n);
    if (typeof p.data === 'string' && p.data.startsWith('2["stage')) stageMapBytes += 1 + n;
  });
  m.socket.on('disconnect', (reason: string) => {
    if (leaving.has(m)) return void leaving.delete(m); // its session ended (churn): it left, it was not dropped
    dropped++;
    dropReasons[reason] = (dropReasons[reason] ?? 0) + 1;
  });
  // Spread over the interval, as independent clients are.
  setTimeout(() => m.socket.connected && beats.set(m, setInterval(() => void m.heartbeat().then((ms) => hbRtts.push(ms)), m.heartbeatMs)), Math.random() * m.heartbeatMs);
}

/** 30 pipelines, each a miner of every stage, reporting one microbatch a second: every receipt both ends send, and the loss. */
let reported = 0;
/** The pipelines' miners: they stay (churn takes the others). */
const pinned = new Set<SimMiner>();
function pipelines(): () => void {
  const byStage = [0, 1, 2].map((s) => miners.filter((m) => m.stage === s));
  const lanes = Array.from({ length: PIPELINES }, (_, i) => byStage.map((ms) => ms[i % ms.length]!));
  for (const lane of lanes) for (const m of lane) pinned.add(m);
  const emit = (by: SimMiner, event: string, msg: object): Promise<unknown> => new Promise((resolve) => by.socket.emit(event, { v: PROTOCOL_VERSION, ...msg }, resolve));
  const timers = lanes.map((lane, i) =>
    setTimeout(
      () =>
        (timers[i] = setInterval(async () => {
          const activationId = randomBytes(16).toString('hex');
          const receipt = async (direction: 'activation' | 'gradient', from: SimMiner, to: SimMiner): Promise<void> => {
            const payloadHash = randomBytes(32).toString('hex');
            for (const by of [from, to]) await emit(by, 'receipt', { epoch: 0, activationId, direction, from: from.minerId, to: to.minerId, bytes: 40_000, payloadHash });
          };
          await receipt('activation', lane[0]!, lane[1]!);
          await receipt('activation', lane[1]!, lane[2]!);
          await emit(lane[2]!, 'loss', { epoch: 0, activationId, pathway: lane.map((m) => m.minerId), loss: 4 + Math.random() * 0.01 });
          await receipt('gradient', lane[2]!, lane[1]!);
          await receipt('gradient', lane[1]!, lane[0]!);
          reported++;
        }, 1000) as unknown as ReturnType<typeof setTimeout>),
      (i / PIPELINES) * 1000,
    ),
  );
  return () => timers.forEach((t) => clearInterval(t));
}

/**
 * One miner joins as the client does: a connection or registration that fails is tried again (the client keeps
 * knocking), at most JOIN_TRIES times; each retry is counted, with its error, in the step's figures. Its
 * registration time runs from the first try.
 */
const JOIN_TRIES = 3;
let joinRetries = 0;
const joinRetryErrors: Record<string, number> = {};
async function joinOne(regMs: number[]): Promise<SimMiner> {
  const t = performance.now();
  for (let attempt = 1; ; attempt++) {
    try {
      const m = await simMiner(urls[nextUrl++ % urls.length]!, undefined, sharedViews); // in turn, as a load balancer spreads them
      regMs.push(performance.now() - t);
      watch(m); // heartbeats from now on, not once its whole batch is in (a batch can outlast the silence limit)
      return m;
    } catch (e) {
      if (attempt >= JOIN_TRIES) throw e;
      joinRetries++;
      const why = (e as Error).message;
      joinRetryErrors[why] = (joinRetryErrors[why] ?? 0) + 1;
      await sleep(500 * attempt);
    }
  }
}

/** /api/status, asked every 500 ms for `ms` (of each process in turn): each answer's time. */
async function pollStatus(ms: number): Promise<number[]> {
  const out: number[] = [];
  const start = performance.now();
  while (performance.now() - start < ms) {
    const t = performance.now();
    await fetch(`${urls[out.length % urls.length]}/api/status`).then((r) => r.json());
    out.push(performance.now() - t);
    await sleep(500);
  }
  return out;
}

/** A miner outside the pipelines, at random, ends its session: it disconnects, and is no longer heartbeating or counted. */
function leaveOne(): void {
  if (miners.length <= pinned.size) throw new Error('every miner left is in a pipeline: none to end its session');
  let i: number;
  do i = Math.floor(Math.random() * miners.length);
  while (pinned.has(miners[i]!));
  const [gone] = miners.splice(i, 1);
  leaving.add(gone!);
  clearInterval(beats.get(gone!));
  beats.delete(gone!);
  received.delete(gone!);
  gone!.close();
}

/**
 * `ms` of people's churn at the current size: every 250 ms, each miner outside the pipelines ends its session with
 * the probability that gives a mean session of SESSION_MIN minutes, and a newcomer joins for each one that left (so
 * the count holds). Measured meanwhile: the joins' times, heartbeats, /api/status, the coordinator's CPU.
 */
async function churnWindow(ms: number): Promise<{ regMs: number[]; hbRtts: number[]; statusMs: number[]; cpuMs: number; ms: number }> {
  hbRtts.length = 0;
  const regMs: number[] = [];
  const joins: Array<Promise<void>> = [];
  const cpuFrom = (await coordinatorsState()).cpuMs;
  const start = performance.now();
  let owed = 0;
  const tick = setInterval(() => {
    owed += (miners.length * 0.25) / (SESSION_MIN * 60);
    for (; owed >= 1; owed--) {
      if (miners.length <= pinned.size) break;
      leaveOne();
      joins.push(joinOne(regMs).then((m) => void miners.push(m)));
    }
  }, 250);
  const statusMs = await pollStatus(ms);
  clearInterval(tick);
  await Promise.all(joins);
  const took = performance.now() - start;
  const cpuMs = (await coordinatorsState()).cpuMs - cpuFrom;
  return { regMs, hbRtts: [...hbRtts], statusMs, cpuMs, ms: took };
}

/** Departures and joins of each step's burst (cpuMsPerReg). */
const CHURN_BURST = 200;

/** `n` miners outside the pipelines leave and as many newcomers join, 25 pairs at a time: the coordinator's CPU (ms) per join, less its quiet rate. */
async function churnBurst(n: number, quietCpuPerMs: number): Promise<number> {
  const from = (await coordinatorsState()).cpuMs;
  const start = performance.now();
  const regMs: number[] = [];
  // At most the miners outside the pipelines at once (at 100 miners the 30 pipelines hold 90: leaving 25 at once
  // looked forever for a 26th miner to end, and the bench spun).
  for (let done = 0, pairs = 0; done < n; done += pairs) {
    pairs = Math.min(25, n - done, miners.length - pinned.size);
    if (pairs <= 0) throw new Error('every miner left is in a pipeline: none to end its session');
    await Promise.all(
      Array.from({ length: pairs }, async () => {
        leaveOne();
        miners.push(await joinOne(regMs));
      }),
    );
  }
  const cpu = (await coordinatorsState()).cpuMs - from;
  return (cpu - quietCpuPerMs * (performance.now() - start)) / n;
}

const steps: Step[] = [];
let registrationFailed: { at: number; target: number; error: string; coordinatorMaxStallMs: number; generatorMaxStallMs: number; listenOverflows: number } | undefined;
let stopPipelines: (() => void) | undefined;
for (const target of STEPS) {
  const regMs: number[] = [];
  const t0 = performance.now();
  generatorDelay.reset();
  joinRetries = 0;
  const overflowsBefore = listenOverflows();
  for (const k of Object.keys(joinRetryErrors)) delete joinRetryErrors[k];
  let refused: string | undefined;
  const rampCpuBefore = (await coordinatorsState()).cpuMs;
  stepQueueMax = 0;
  const rampFrom = miners.length;
  while (miners.length < target) {
    try {
      const batch = await Promise.all(Array.from({ length: Math.min(50, target - miners.length) }, () => joinOne(regMs)));
      miners.push(...batch);
    } catch (e) {
      // A join that failed JOIN_TRIES times: the coordinator is past what it holds.
      refused = (e as Error).message;
      break;
    }
  }
  if (refused) {
    const { maxStallMs } = await coordinatorsState();
    registrationFailed = { at: miners.length, target, error: refused, coordinatorMaxStallMs: Math.round(maxStallMs), generatorMaxStallMs: Math.round(generatorDelay.max / 1e6), listenOverflows: listenOverflows() - overflowsBefore };
    console.log(`registration failed at ${miners.length} of ${target} miners: ${refused} (longest event-loop stall: coordinator ${registrationFailed.coordinatorMaxStallMs} ms, generator ${registrationFailed.generatorMaxStallMs} ms; ${registrationFailed.listenOverflows} connections dropped from a full accept queue)`);
    break;
  }
  const rampCpu = (await coordinatorsState()).cpuMs - rampCpuBefore;
  const rampMs = performance.now() - t0;
  console.log(`${target} miners registered in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  if (!stopPipelines) stopPipelines = pipelines();
  await sleep(5000); // settle: the joins' deltas and the heartbeats' phases
  hbRtts.length = 0;
  for (const m of miners) received.set(m, 0);
  stageMapBytes = 0;
  const reportedBefore = reported;
  const cpuQuietFrom = (await coordinatorsState()).cpuMs;
  const windowStart = performance.now();
  const statusMs = await pollStatus(WINDOW_MS);
  const minutes = (performance.now() - windowStart) / 60_000;
  const coordinator = await coordinatorsState();
  const quietHb = [...hbRtts];
  const bytes = [...received.values()].reduce((a, b) => a + b, 0);
  const quietStageMapBytes = stageMapBytes;
  const quietMiners = miners.length;
  const churn = await churnWindow(WINDOW_MS);
  const cpuQuiet = coordinator.cpuMs - cpuQuietFrom;
  const quietCpuPerMs = cpuQuiet / (minutes * 60_000);
  const rampCpuMsPerReg = (rampCpu - quietCpuPerMs * rampMs) / Math.max(1, miners.length - rampFrom);
  const burst = await churnBurst(CHURN_BURST, quietCpuPerMs);
  const step: Step = {
    miners: miners.length,
    registrationP99Ms: Math.round(p99(regMs)),
    hbP99Ms: Math.round(p99(quietHb)),
    statusP99Ms: Math.round(p99(statusMs)),
    rssMb: Math.round(coordinator.rssMb),
    ...(coordinators.length > 1 ? { rssMbEach: coordinator.rssMbEach } : {}),
    coordinatorMaxStallMs: Math.round(coordinator.maxStallMs),
    generatorMaxStallMs: Math.round(generatorDelay.max / 1e6),
    generatorHeapMb: Math.round(process.memoryUsage().heapUsed / 1e6),
    generatorRssMb: Math.round(process.memoryUsage().rss / 1e6),
    bytesPerMinerPerMin: Math.round(bytes / quietMiners / minutes),
    stageMapBytesPerMinerPerMin: Math.round(quietStageMapBytes / quietMiners / minutes),
    dropped,
    dropReasons: { ...dropReasons },
    joinRetries,
    joinRetryErrors: { ...joinRetryErrors },
    listenOverflows: listenOverflows() - overflowsBefore,
    stageMapRefetches: [...new Set(miners.map((m) => m.view))].reduce((n, v) => n + v.refetches, 0),
    microbatchesReported: reported - reportedBefore,
    admissionQueueMax: stepQueueMax,
    churnRegistrations: churn.regMs.length,
    registrationP99MsChurn: Math.round(p99(churn.regMs)),
    hbP99MsChurn: Math.round(p99(churn.hbRtts)),
    statusP99MsChurn: Math.round(p99(churn.statusMs)),
    cpuMsPerReg: Math.round(burst),
    rampCpuMsPerReg: Math.round(rampCpuMsPerReg),
    cpuCoresQuiet: Number((cpuQuiet / (minutes * 60_000)).toFixed(2)),
    cpuCoresChurn: Number((churn.cpuMs / churn.ms).toFixed(2)),
  };
  steps.push(step);
  console.log(JSON.stringify(step));
  if (Math.max(step.hbP99Ms, step.hbP99MsChurn) > HB_LIMIT_MS || dropped > 0) break;
}
stopPipelines?.();
beats.forEach((t) => clearInterval(t));
miners.forEach((m) => {
  leaving.add(m); // the bench is done: closed, not dropped
  m.close();
});
for (const { child } of coordinators) {
  child.send({ stop: true });
  await new Promise((r) => child.once('exit', r));
}
rmSync(dataDir, { recursive: true, force: true });

const held = steps.filter((s) => Math.max(s.hbP99Ms, s.hbP99MsChurn) <= HB_LIMIT_MS && s.dropped === 0);
const best = held.at(-1);
console.log('miners | registration p99 (ramp / churn) | heartbeat p99 (quiet / churn) | /api/status p99 (quiet / churn) | churn joins | CPU ms per registration (churn / ramp) | cores (quiet / churn) | RSS | bytes per miner per minute (of which stage map) | microbatches reported');
for (const s of steps) console.log(`${s.miners} | ${s.registrationP99Ms} / ${s.registrationP99MsChurn} ms | ${s.hbP99Ms} / ${s.hbP99MsChurn} ms | ${s.statusP99Ms} / ${s.statusP99MsChurn} ms | ${s.churnRegistrations} | ${s.cpuMsPerReg} / ${s.rampCpuMsPerReg} | ${s.cpuCoresQuiet} / ${s.cpuCoresChurn} | ${s.rssMb} MB | ${s.bytesPerMinerPerMin} (${s.stageMapBytesPerMinerPerMin}) | ${s.microbatchesReported}`);
const at1000 = steps.find((s) => s.miners >= 1000);
// The orchestrator reads this line.
console.log(JSON.stringify({
  maxMiners: best?.miners ?? 0,
  hbP99Ms: best?.hbP99Ms ?? null,
  statusP99Ms: best?.statusP99Ms ?? null,
  churnSessionMin: SESSION_MIN,
  hbP99MsChurn: best?.hbP99MsChurn ?? null,
  statusP99MsChurn: best?.statusP99MsChurn ?? null,
  registrationP99MsChurn: best?.registrationP99MsChurn ?? null,
  cpuMsPerRegAt1000: at1000?.cpuMsPerReg ?? null,
  cpuMsPerRegAtMax: best?.cpuMsPerReg ?? null,
  // What 1,000 more miners cost the coordinator's memory: the slope from the first step to the last held one.
  rssMbPer1000: best && best !== steps[0] ? Math.round(((best.rssMb - steps[0]!.rssMb) / (best.miners - steps[0]!.miners)) * 1000) : null,
  rssMbAtStart: steps[0]?.rssMb ?? null,
  bytesPerMinerPerMin: best?.bytesPerMinerPerMin ?? null,
  stoppedBecause: registrationFailed
    ? `registering the step to ${registrationFailed.target} failed at ${registrationFailed.at} miners (${registrationFailed.error}; longest event-loop stall: coordinator ${registrationFailed.coordinatorMaxStallMs} ms, generator ${registrationFailed.generatorMaxStallMs} ms)`
    : steps.length === STEPS.length && held.length === steps.length
      ? `the last step (${STEPS.at(-1)})`
      : dropped > 0
        ? `a miner was dropped${(steps.at(-1)?.generatorMaxStallMs ?? 0) > 15_000 ? ` (the generator's own event loop stalled ${steps.at(-1)!.generatorMaxStallMs} ms: its simulated miners' heartbeats stopped; the limit there is the generator's)` : ''}`
        : `heartbeat p99 over ${HB_LIMIT_MS} ms${(steps.at(-1)?.hbP99Ms ?? 0) <= HB_LIMIT_MS ? ' under churn' : ''}`,
  ramp: steps,
}));
process.exit(0);

/**
 * Runs the ramp once per database, each in a process of its own (a fresh generator): the embedded database, then
 * a PostgreSQL server started here (Debian's, on a private port and folder, removed afterwards; installed when
 * missing, as scripts/test-postgres.sh does). TAH_LOAD_DATABASES=pglite (or postgres) runs one.
 */
async function orchestrate(): Promise<void> {
  const wanted = (process.env.TAH_LOAD_DATABASES ?? 'pglite,postgres,two-processes').split(',');
  const ramp = async (database: 'pglite' | 'postgres' | 'two-processes', env: Record<string, string> = {}): Promise<Record<string, unknown>> => {
    console.log(database === 'two-processes' ? '--- two coordinator processes on PostgreSQL and Redis' : `--- one coordinator process on ${database}`);
    // The generator's heap, raised from Node's default (about 4 GB) so that its limit is not what ends the ramp: its
    // simulated miners hold about 0.45 MB each (3.5 GB at 7,500). Measured with it: the generator still stalls 47 s at
    // 7,500 (bench/results/load-pglite.json), so that stall is its CPU, not its heap.
    const child = spawn(process.execPath, [`--max-old-space-size=${GENERATOR_HEAP_MB}`, ...(process.env.TAH_LOAD_GENERATOR_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.TAH_LOAD_GENERATOR_PROF}`] : []), '--import', 'tsx', fileURLToPath(import.meta.url)], { env: { ...process.env, ...env, TAH_LOAD_RAMP: database }, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => {
      process.stdout.write(d);
      out += d.toString();
    });
    const code = await new Promise((r) => child.once('exit', r));
    const last = out.trim().split('\n').at(-1) ?? '';
    if (code !== 0 || !last.startsWith('{')) throw new Error(`the ramp on ${database} failed (exit ${code})`);
    return JSON.parse(last) as Record<string, unknown>;
  };
  const lite = wanted.includes('pglite') ? await ramp('pglite') : undefined;
  let pg: Record<string, unknown> | undefined;
  let two: Record<string, unknown> | undefined;
  if (wanted.includes('postgres')) {
    const server = startPostgres();
    try {
      pg = await ramp('postgres', { TAH_LOAD_DATABASE_URL: server.url });
    } finally {
      server.stop();
    }
  }
  if (wanted.includes('two-processes')) {
    // A fresh server, so the one-process ramp's miners are not the run's.
    const server = startPostgres();
    const redis = await startRedis();
    try {
      two = await ramp('two-processes', { TAH_LOAD_DATABASE_URL: server.url, TAH_LOAD_REDIS_URL: redis.url });
    } finally {
      redis.stop();
      server.stop();
    }
  }
  // Every ramp: bench/results/load.json; some (TAH_LOAD_DATABASES): load-<those>.json, leaving load.json as it was.
  const all = lite && pg && two;
  finish(all ? 'load' : `load-${wanted.join('-')}`, {
    maxMinersOneProcess: lite?.maxMiners ?? null,
    hbP99Ms: lite?.hbP99Ms ?? null,
    statusP99Ms: lite?.statusP99Ms ?? null,
    churnSessionMin: SESSION_MIN,
    hbP99MsChurn: lite?.hbP99MsChurn ?? null,
    statusP99MsChurn: lite?.statusP99MsChurn ?? null,
    registrationP99MsChurn: lite?.registrationP99MsChurn ?? null,
    cpuMsPerRegAt1000: lite?.cpuMsPerRegAt1000 ?? null,
    cpuMsPerRegAtMax: lite?.cpuMsPerRegAtMax ?? null,
    rssMbPer1000: lite?.rssMbPer1000 ?? null,
    rssMbAtStart: lite?.rssMbAtStart ?? null,
    bytesPerMinerPerMin: lite?.bytesPerMinerPerMin ?? null,
    stoppedBecause: lite?.stoppedBecause ?? 'not run (TAH_LOAD_DATABASES)',
    maxMinersOneProcessPostgres: pg?.maxMiners ?? null,
    postgres: pg ?? 'not run (TAH_LOAD_DATABASES)',
    maxMinersTwoProcesses: two?.maxMiners ?? null,
    twoProcesses: two ?? 'not run (TAH_LOAD_DATABASES)',
    ramp: lite?.ramp ?? [],
    windowMs: WINDOW_MS,
    pipelines: PIPELINES,
    generator: 'on this machine beside the coordinator; the simulated miners of a stage share one stage-map view (each socket still receives and decodes every message)',
    machine: machine('wasm'),
  });
}

/** A throwaway Redis (scripts/redis.sh: Debian's, loopback, nothing on disk), once it answers. */
async function startRedis(): Promise<{ url: string; stop: () => void }> {
  const port = 20_000 + Math.floor(Math.random() * 20_000);
  const child = spawn('bash', ['scripts/redis.sh', String(port)], { stdio: 'inherit', detached: true });
  const url = `redis://127.0.0.1:${port}`;
  const { Redis } = await import('ioredis');
  for (let tries = 0; ; tries++) {
    const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => {});
    const up = await probe.connect().then(() => true, () => false);
    probe.disconnect();
    if (up) break;
    if (tries > 600) throw new Error('Redis did not start');
    await sleep(250);
  }
  return { url, stop: () => process.kill(-child.pid!, 'SIGTERM') };
}

/** A throwaway PostgreSQL server: Debian's, on a private port and socket folder under /tmp (as scripts/test-postgres.sh starts one). */
function startPostgres(): { url: string; stop: () => void } {
  const bin = (): string | undefined => {
    try {
      return execFileSync('bash', ['-c', 'ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1'], { encoding: 'utf8' }).trim() || undefined;
    } catch {
      return undefined;
    }
  };
  if (!bin()) execFileSync('bash', ['scripts/apt-install.sh', 'bench:load', 'postgresql'], { stdio: 'inherit' });
  const BIN = bin()!;
  const root = process.getuid?.() === 0;
  const asPg = (cmd: string, args: string[]): void => void execFileSync(root ? 'runuser' : cmd, root ? ['-u', 'postgres', '--', cmd, ...args] : args, { stdio: ['ignore', 'ignore', 'inherit'] });
  const dir = mkdtempSync('/tmp/tah-load-pg.');
  chmodSync(dir, 0o755);
  if (root) execFileSync('chown', ['postgres', dir]);
  const port = 20_000 + Math.floor(Math.random() * 20_000);
  asPg(`${BIN}/initdb`, ['-D', `${dir}/data`, '-A', 'trust', '-U', 'tah']);
  asPg(`${BIN}/pg_ctl`, ['-D', `${dir}/data`, '-l', `${dir}/server.log`, '-w', '-o', `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200`, 'start']);
  return {
    url: `postgresql://tah@127.0.0.1:${port}/postgres`,
    stop: () => {
      try {
        asPg(`${BIN}/pg_ctl`, ['-D', `${dir}/data`, '-m', 'immediate', 'stop']);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}
