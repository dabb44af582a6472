import { DASHBOARD_NAMESPACE, LiveSeries, PROTOCOL_VERSION, TRAFFIC_KINDS, emptyTraffic, generateIdentity, type DashboardUpdate } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import { io as connect, type Socket } from 'socket.io-client';
import { afterEach, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { LiveState, mergeLive } from '../src/dashboard/live';

let app: App | undefined;
const sockets: Socket[] = [];
afterEach(async () => {
  sockets.splice(0).forEach((s) => s.disconnect());
  await app?.close();
  app = undefined;
});

async function start(): Promise<{ app: App; url: string }> {
  app = await buildApp({ run: { name: 'dashboard', preset: 'tiny', stages: 2, bottleneck: 32 }, database: await testDatabase(), dashboard: { pushMs: 200 } });
  return { app, url: await app.fastify.listen({ port: 0, host: '127.0.0.1' }) };
}

function viewer(url: string): { socket: Socket; updates: DashboardUpdate[] } {
  const socket = connect(`${url}${DASHBOARD_NAMESPACE}`, { transports: ['websocket'], forceNew: true, reconnection: false });
  sockets.push(socket);
  const updates: DashboardUpdate[] = [];
  socket.on('update', (u: DashboardUpdate) => updates.push(u));
  return { socket, updates };
}

const addLoss = (a: App, values: number[], name = 'train_loss') =>
  a.db.query(`INSERT INTO metrics (run_id, epoch, name, value) SELECT $1, 0, $2, v FROM unnest($3::float8[]) v`, [a.coordinator.runId, name, values]);

describe('the dashboard feed', () => {
  it('pushes new points, with the cursor they follow, the swarm with each miner’s reported state, and never an insane value', async () => {
    const { app, url } = await start();
    const miner = connect(url, { transports: ['websocket'], forceNew: true, reconnection: false });
    sockets.push(miner);
    const { minerId } = await register(miner, generateIdentity(), { backend: 'wasm', tokensPerSec: 10 });
    // The miner says what it is doing; a report with a NaN rate is refused by the schema and never shown.
    const beat = (status: unknown) => new Promise<{ ok: boolean }>((r) => miner.emit('heartbeat', { v: PROTOCOL_VERSION, seq: 1, status }, r));
    // Paths: per path the peers and bytes; an unknown path, a negative count or a stray field is refused.
    expect(await beat({ phase: 'training', tokensPerSec: 1, microbatches: 1, paths: { lan: { peers: 1, bytes: 1 } } })).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    expect(await beat({ phase: 'training', tokensPerSec: 1, microbatches: 1, paths: { turn: { peers: -1, bytes: 1 } } })).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    expect(await beat({ phase: 'training', tokensPerSec: 1, microbatches: 1, paths: { turn: { peers: 1, bytes: 1, host: 'x' } } })).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    // Traffic by kind (its bad forms: messages.test). The heartbeat budget is 10 a second: these are 8.
    const traffic = Object.fromEntries(TRAFFIC_KINDS.map((k, i) => [k, { sent: 2 ** 52 + i, received: 2 ** 52 - i }]));
    // The longest a miner sends (every kind at its largest, a why of 200 characters, every path) fits the event's bound.
    expect(await beat({ phase: 'training', why: 'x'.repeat(200), tokensPerSec: 1e7 - 1, microbatches: 2 ** 31 - 1, trainedTokens: 2 ** 52, traffic, paths: Object.fromEntries(['direct', 'turn', 'coordinator'].map((p) => [p, { peers: 99_999, bytes: 2 ** 52 }])) })).toEqual({ ok: true });
    expect(await beat({ phase: 'waiting', why: 'no miner holds stage 1 yet', tokensPerSec: 0, microbatches: 0, paths: { direct: { peers: 2, bytes: 4096 }, turn: { peers: 1, bytes: 512 } }, trainedTokens: 4096, traffic: { activation: { sent: 40_960, received: 0 }, coordinator: { sent: 300, received: 900 } } })).toEqual({ ok: true });
    expect(await beat({ phase: 'training', tokensPerSec: NaN, microbatches: 3 })).toMatchObject({ ok: false });
    expect(await beat({ phase: 'training', tokensPerSec: 5e9, microbatches: 3 })).toMatchObject({ ok: false });

    await addLoss(app, [5.5, 5.4]);
    const v = viewer(url);
    await expect.poll(() => v.updates.length, { timeout: 5000 }).toBeGreaterThan(0);
    // First paint over REST, then the pushes: the series holds every point once, in order, and nothing insane.
    const series = new LiveSeries();
    series.append((await (await fetch(`${url}/api/metrics/train_loss`)).json()).points);
    expect(series.points.map((p) => p.value)).toEqual([5.5, 5.4]);
    await addLoss(app, [5.3, Number.NaN, Number.POSITIVE_INFINITY, -1, 5.2]);
    await expect.poll(() => v.updates.some((u) => u.points.trainLoss.some((p) => p.value === 5.2)), { timeout: 5000 }).toBe(true);
    for (const u of v.updates) {
      expect(series.apply(u.after.trainLoss, u.points.trainLoss)).toBe('applied');
      for (const p of u.points.trainLoss) expect(Number.isFinite(p.value) && p.value >= 0).toBe(true);
    }
    expect(series.points.map((p) => p.value)).toEqual([5.5, 5.4, 5.3, 5.2]);

    const last = v.updates[v.updates.length - 1]!;
    expect(last.swarm.stages.map((s) => s.miners.map((m) => [m.id, m.state, m.why]))).toEqual([[[minerId, 'waiting', 'no miner holds stage 1 yet']], []]);
    expect(last.swarm.boundaries).toEqual([{ from: 0, to: 1, activationsPerSec: 0, gradientsPerSec: 0, bytesPerSec: 0 }]);
    expect(last.sentAt).toBeGreaterThan(0);
    // REST says the same for a first paint.
    const first = await (await fetch(`${url}/api/dashboard`)).json();
    expect(first.swarm.stages[0].miners[0]).toMatchObject({ id: minerId, state: 'waiting', backend: 'wasm', paths: { direct: { peers: 2, bytes: 4096 }, turn: { peers: 1, bytes: 512 } } });
    // Each stage sums its miners' traffic by kind (every kind named, 0 where none moved) with the tokens they trained.
    expect(first.swarm.stages[0].traffic).toEqual({ tokens: 4096, kinds: { ...emptyTraffic(), activation: { sent: 40_960, received: 0 }, coordinator: { sent: 300, received: 900 } } });
    expect(first.swarm.stages[1].traffic).toEqual({ tokens: 0, kinds: emptyTraffic() });
    expect(first.run).toMatchObject({ name: 'dashboard', stages: 2 });
  });

  it('takes nothing from viewers: their events are ignored, and a viewer that keeps sending is disconnected', async () => {
    const { app, url } = await start();
    const v = viewer(url);
    await new Promise<void>((r) => v.socket.once('connect', () => r()));
    const closed = new Promise<void>((r) => v.socket.once('disconnect', () => r()));
    for (let i = 0; i < 10; i++) v.socket.emit('register', { v: PROTOCOL_VERSION });
    await closed;
    expect((await app.db.query<{ n: number }>('SELECT count(*)::int AS n FROM miners'))[0]!.n).toBe(0);
  });

  it('a viewer that falls behind (a reconnect, a restart) sees a gap and backfills it over REST: no hole', async () => {
    const { app, url } = await start();
    await addLoss(app, [6, 5.9, 5.8]);
    const series = new LiveSeries();
    series.append((await (await fetch(`${url}/api/metrics/train_loss?limit=2`)).json()).points); // it stopped after two
    const v = viewer(url);
    await expect.poll(() => v.updates.length, { timeout: 5000 }).toBeGreaterThan(0); // the feed follows from where the run is
    await addLoss(app, [5.7, 5.6]);
    await expect.poll(() => v.updates.some((u) => u.points.trainLoss.length > 0), { timeout: 5000 }).toBe(true);
    const u = v.updates.find((x) => x.points.trainLoss.length > 0)!;
    expect(series.apply(u.after.trainLoss, u.points.trainLoss)).toBe('gap');
    for (let after: number | null = series.lastId; after !== null; ) {
      const page = await (await fetch(`${url}/api/metrics/train_loss?after=${after}&limit=1`)).json();
      series.append(page.points, page.nextAfter === null ? u.after.trainLoss : 0);
      after = page.nextAfter;
    }
    expect(series.apply(u.after.trainLoss, u.points.trainLoss)).toBe('applied');
    expect(series.points.map((p) => p.value)).toEqual([6, 5.9, 5.8, 5.7, 5.6]);
  });

  it('pages the samples of what the model writes', async () => {
    const { app } = await start();
    for (let i = 1; i <= 3; i++) {
      await app.db.query('INSERT INTO samples (run_id, rounds, held_out_loss, prompt, text) VALUES ($1, $2, $3, $4, $5)', [app.coordinator.runId, JSON.stringify([i, i]), 4 - i / 10, 'The state', ` text ${i}`]);
    }
    const first = (await app.fastify.inject({ method: 'GET', url: '/api/samples?limit=2' })).json();
    expect(first.samples.map((s: { text: string }) => s.text)).toEqual([' text 3', ' text 2']);
    const rest = (await app.fastify.inject({ method: 'GET', url: `/api/samples?limit=2&before=${first.nextBefore}` })).json();
    expect(rest.samples.map((s: { text: string; rounds: number[] }) => [s.text, s.rounds])).toEqual([[' text 1', [1, 1]]]);
    expect(rest.nextBefore).toBeNull();
    expect((await app.fastify.inject({ method: 'GET', url: '/api/samples?limit=1000' })).statusCode).toBe(400);
  });

  it('merges the live figures of several coordinator processes: each miner\'s newest report, rates and totals summed, a malformed part ignored', () => {
    const now = 1_000_000_000;
    const a = new LiveState(3, 100);
    const b = new LiveState(3, 100);
    a.report('m1', { phase: 'training', tokensPerSec: 5, microbatches: 1 }, now - 5000);
    b.report('m1', { phase: 'merging', tokensPerSec: 6, microbatches: 2 }, now - 1000); // came back on b since
    b.report('m2', { phase: 'waiting', tokensPerSec: 0, microbatches: 0 }, now - 60_000); // stale: not shown
    for (let s = 0; s < 10; s++) {
      a.transfer('activation', 1, 10, now - 10_000 + s * 1000);
      b.transfer('gradient', 1, 30, now - 10_000 + s * 1000);
    }
    const merged = mergeLive([a.summary({ frameBytes: 1, signalBytes: 2 }, now), b.summary({ frameBytes: 3, signalBytes: 4 }, now), null, { miners: 'x' }, 42]);
    expect(merged.miners).toEqual([['m1', { phase: 'merging', tokensPerSec: 6, microbatches: 2, at: now - 1000 }]]);
    expect(merged.rates[0]).toEqual({ from: 0, to: 1, activationsPerSec: 1, gradientsPerSec: 0, bytesPerSec: 10 });
    expect(merged.rates[1]).toEqual({ from: 1, to: 2, activationsPerSec: 0, gradientsPerSec: 1, bytesPerSec: 30 });
    expect(merged.totals).toEqual({ transfers: 20, bytes: 400, uncompressedBytes: 2000 });
    expect(merged.relayed).toEqual({ frameBytes: 4, signalBytes: 6 });
  });
});
