/**
 * npm run bench:dashboard — many dashboard viewers on one coordinator while
 * miners train: do they get updates at the pushed rate, how late, and what
 * does it cost the coordinator's event loop?
 *
 * The coordinator (this process: the `tiny` run on 2 stages, embedded
 * database, one update a second) serves VIEWERS socket.io connections to
 * /dashboard opened by a second process (bench/dashboard-viewers.ts), while
 * two miner processes (the miner CLI) train. Over MEASURE_S seconds it reads
 * each update's delivery delay (receipt − sentAt), the updates each viewer
 * got against the pushes sent, and the coordinator's event-loop delay
 * (monitorEventLoopDelay). The per-IP connection cap (256 by default) is
 * raised to fit every viewer on one machine, and so is the per-IP request
 * limit: both are stated in the output.
 */
import { spawn, fork, type ChildProcess } from 'node:child_process';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { initNodeBackend } from '@train-at-home/model/node';
import { buildApp } from '../server/src/app';
import { finish, machine } from './lib';

const VIEWERS = Number(process.env.VIEWERS ?? 1000);
const MEASURE_S = Number(process.env.MEASURE_S ?? 60);
const PUSH_MS = 1000;
const limits = { maxConnectionsPerIp: VIEWERS + 100, requestsPerIpPerMinute: 100_000 };

await initNodeBackend();
const app = await buildApp({ run: { name: `bench-dashboard-${Date.now()}`, preset: 'tiny', stages: 2, bottleneck: 32 }, http: limits, dashboard: { pushMs: PUSH_MS } });
await app.fastify.listen({ port: 0, host: '127.0.0.1' });
const url = `http://127.0.0.1:${(app.fastify.server.address() as { port: number }).port}`;
const children: ChildProcess[] = [];
const stopAll = (): void => children.forEach((c) => c.exitCode === null && c.kill('SIGTERM'));
process.once('exit', stopAll);

const miner = fileURLToPath(new URL('../apps/miner/src/main.ts', import.meta.url));
for (let i = 0; i < 2; i++) children.push(spawn(process.execPath, ['--import', 'tsx', miner, '--coordinator', url], { stdio: 'ignore' }));
const losses = async (): Promise<number> => (await app.fastify.inject({ method: 'GET', url: '/api/metrics' })).json().counts.trainLoss;
while ((await losses()) < 3) await new Promise((r) => setTimeout(r, 1000));
console.log(`miners training (${await losses()} losses); opening ${VIEWERS} viewers`);

const viewers = fork(fileURLToPath(new URL('./dashboard-viewers.ts', import.meta.url)), [], { execArgv: ['--import', 'tsx'], env: { ...process.env, TAH_VIEWERS: JSON.stringify({ url, viewers: VIEWERS }) } });
children.push(viewers);
const next = <T,>(key: string): Promise<T> => new Promise((resolve) => viewers.on('message', function on(m: Record<string, unknown>) { if (key in m) { viewers.off('message', on); resolve(m[key] as T); } }));
console.log(`${await next<number>('connected')} viewers connected; measuring ${MEASURE_S} s`);
await new Promise((r) => setTimeout(r, 5000)); // settle

const lag = monitorEventLoopDelay({ resolution: 10 });
viewers.send({ reset: true });
await next('reset');
lag.enable();
const pushes0 = app.feed.pushes;
const losses0 = await losses();
await new Promise((r) => setTimeout(r, MEASURE_S * 1000));
lag.disable();
const pushes = app.feed.pushes - pushes0;
viewers.send({ report: true });
const report = await next<{ delays: number[]; updates: number; minPerViewer: number; maxPerViewer: number; connected: number }>('report');
const trained = (await losses()) - losses0;

const sorted = [...report.delays].sort((a, b) => a - b);
const pct = (p: number): number => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;
const result = {
  viewers: VIEWERS,
  connectedAtEnd: report.connected,
  measureS: MEASURE_S,
  pushMs: PUSH_MS,
  pushes,
  updatesPerViewerPerSec: Number((report.updates / VIEWERS / MEASURE_S).toFixed(3)),
  pushesPerSec: Number((pushes / MEASURE_S).toFixed(3)),
  minUpdatesPerViewer: report.minPerViewer,
  p50Ms: pct(50),
  p99Ms: pct(99),
  maxMs: sorted[sorted.length - 1] ?? NaN,
  loopLagP99Ms: Number((lag.percentile(99) / 1e6).toFixed(1)),
  loopLagMaxMs: Number((lag.max / 1e6).toFixed(1)),
  minersTraining: 2,
  microbatchesDuring: trained,
  limitsRaisedForTheBench: limits,
  machine: machine('wasm (miners); the coordinator and the viewers are separate processes on the same 2 cores'),
};
console.log(`${report.updates} updates to ${VIEWERS} viewers over ${MEASURE_S} s (${pushes} pushes): delay p50 ${result.p50Ms} ms, p99 ${result.p99Ms} ms; coordinator loop lag p99 ${result.loopLagP99Ms} ms; ${trained} microbatches trained meanwhile`);
stopAll();
await app.close();
finish('dashboard', result);
process.exit(0);
