import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateIdentity, PROTOCOL_VERSION, type Identity } from '@train-at-home/protocol';
import { CoordinatorError, register, request } from '@train-at-home/swarm';
import { io as connect, type Socket } from 'socket.io-client';
import { afterAll, afterEach, beforeEach, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { AUDIT_GRACE_MS } from '../src/jobs/audits';

let app: App;
let url: string;
const sockets: Socket[] = [];

async function start(database?: Awaited<ReturnType<typeof testDatabase>>): Promise<void> {
  app = await buildApp({ run: { name: 'test', preset: 'tiny', stages: 3, bottleneck: 32 }, database: database ?? (await testDatabase()) });
  const address = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
  url = address;
}

async function open(): Promise<Socket> {
  const socket = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
  sockets.push(socket);
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('connect_error', reject);
  });
  return socket;
}

async function minerRows(): Promise<Array<{ id: string; stage: number; status: string }>> {
  return app.db.query('SELECT id, stage, status FROM miners ORDER BY id');
}

async function rejection(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(CoordinatorError);
    return (e as CoordinatorError).code;
  }
  return 'accepted';
}

const dirs: string[] = [];
afterEach(async () => {
  sockets.splice(0).forEach((s) => s.disconnect());
  await app?.close();
});
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe('coordinator: registration and stage assignment', () => {
  beforeEach(() => start());

  it('registers miners by signed challenge and spreads them over the stages', async () => {
    const stages: number[] = [];
    for (let i = 0; i < 6; i++) {
      const r = await register(await open(), generateIdentity(), { backend: 'wasm', tokensPerSec: 1000 + i });
      expect(r.minerId).toMatch(/^[0-9a-f]{64}$/);
      expect(r.layout).toMatchObject({ preset: 'tiny', stages: 3, bottleneck: 32, int8: true });
      stages.push(r.stage);
    }
    expect(stages.sort()).toEqual([0, 0, 1, 1, 2, 2]);
    const res = await app.fastify.inject({ method: 'GET', url: '/api/stages' });
    expect(res.statusCode).toBe(200);
    expect(res.json().stages.map((s: { miners: unknown[] }) => s.miners.length)).toEqual([2, 2, 2]);
    const status = await app.fastify.inject({ method: 'GET', url: '/api/status' });
    expect(status.json()).toMatchObject({ activeMiners: 6, database: process.env.TAH_TEST_DATABASE_URL ? 'postgres' : 'pglite', run: { name: 'test' } });
  });

  it('gives a newcomer the slowest of the least-staffed stages', async () => {
    await register(await open(), generateIdentity(), { backend: 'wasm', tokensPerSec: 500 }); // stage 0
    await register(await open(), generateIdentity(), { backend: 'wasm', tokensPerSec: 100 }); // stage 1
    await register(await open(), generateIdentity(), { backend: 'webgpu', tokensPerSec: 900 }); // stage 2
    const next = await register(await open(), generateIdentity(), { backend: 'wasm', tokensPerSec: 300 });
    expect(next.stage).toBe(1);
  });

  it('rejects a wrong signature, disconnects the sender and records nothing', async () => {
    const socket = await open();
    const miner = generateIdentity();
    const impostor = generateIdentity();
    const { challenge } = await request<{ challenge: string }>(socket, 'hello', { v: PROTOCOL_VERSION, publicKey: miner.publicKey });
    const signed = { publicKey: miner.publicKey, challenge, backend: 'wasm', tokensPerSec: 1 };
    const disconnected = new Promise((resolve) => socket.once('disconnect', resolve));
    expect(await rejection(request(socket, 'register', { v: 1, ...signed, signature: impostor.sign('register', signed) }))).toBe('BAD_SIGNATURE');
    await disconnected;
    expect(await minerRows()).toEqual([]);
  });

  it('rejects malformed, oversized, unknown and out-of-phase messages by name, changing nothing', async () => {
    const socket = await open();
    const miner: Identity = generateIdentity();
    const key = miner.publicKey;
    // Out of phase: registered-only events and register before hello.
    expect(await rejection(request(socket, 'heartbeat', { v: 1, seq: 0 }))).toBe('NOT_REGISTERED');
    const early = { publicKey: key, challenge: key, backend: 'wasm', tokensPerSec: 1 };
    expect(await rejection(request(socket, 'register', { v: 1, ...early, signature: miner.sign('register', early) }))).toBe('OUT_OF_PHASE');
    // Malformed and unknown.
    expect(await rejection(request(socket, 'hello', { v: 1, publicKey: 'nope' }))).toBe('SCHEMA');
    expect(await rejection(request(socket, 'hello', { v: 99, publicKey: key }))).toBe('BAD_VERSION');
    expect(await rejection(request(socket, 'steal', { all: true }))).toBe('UNKNOWN_EVENT');
    expect(await rejection(request(socket, 'hello', { v: 1, publicKey: key, pad: 'x'.repeat(80_000) }))).toBe('TOO_LARGE');
    expect(await minerRows()).toEqual([]);
  });

  it('rejects bad input on every event by name and leaves every table as it was', async () => {
    const good = await open();
    const registered = await register(good, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 });
    const snapshot = async (): Promise<string> =>
      JSON.stringify(
        await Promise.all(
          ['runs', 'miners', 'epochs', 'checkpoints', 'receipts', 'metrics', 'merge_events'].map((t) =>
            app.db.query(`SELECT * FROM ${t} ORDER BY 1`).then((rows) => rows.map((r) => ({ ...r, last_seen_at: undefined }))),
          ),
        ),
      );
    const before = await snapshot();
    const key = '0x' + '11'.repeat(32);
    const bad: unknown[] = [undefined, null, 42, 'text', [], {}, { v: 1 }, { v: 2 }, { v: 1, extra: 'x'.repeat(70_000) }];
    const events = ['hello', 'register', 'heartbeat', 'signal', 'loss', 'receipt', 'merge-ready', 'merged'];
    for (const event of events) {
      for (const payload of bad) {
        // A fresh connection each time: five rejections disconnect a connection.
        const code = await rejection(request(await open(), event, payload));
        expect(['SCHEMA', 'BAD_VERSION', 'TOO_LARGE'], `${event} ${JSON.stringify(payload)?.slice(0, 30)}`).toContain(code);
      }
    }
    // Well-formed but out of phase or not this miner's to say.
    expect(await rejection(request(good, 'loss', { v: 1, epoch: 0, activationId: 'a'.repeat(32), pathway: [registered.minerId, 'b', 'c'], loss: 1 }))).toBe(
      registered.stage === 2 ? 'SCHEMA' : 'OUT_OF_PHASE',
    );
    expect(await rejection(request(good, 'register', { v: 1, publicKey: key, challenge: key, backend: 'wasm', tokensPerSec: 1, signature: '0x' + '22'.repeat(64) }))).toBe('OUT_OF_PHASE');
    // No merge was called: a replica's answer and a merge report are both out of phase.
    const hash = 'ab'.repeat(32);
    expect(await rejection(request(good, 'merge-ready', { v: 1, stage: registered.stage, round: 1, stateId: hash, microbatches: 3, weightsHash: hash, optimizerHash: hash, contributionRoots: { outer: hash, average: hash } }))).toBe('OUT_OF_PHASE');
    expect(await rejection(request(good, 'merged', { v: 1, stage: registered.stage, round: 1, ok: true, hash, clipped: 0, evidence: [] }))).toBe('OUT_OF_PHASE');
    // A late reporter is no bad sender: refusals it earns from timing alone never disconnect it (a reconnection
    // ended the merge an honest miner was in).
    for (let i = 0; i < 8; i++) expect(await rejection(request(good, 'merged', { v: 1, stage: registered.stage, round: 1 + i, ok: true, hash, clipped: 0, evidence: [] }))).toBe('OUT_OF_PHASE');
    expect(await snapshot()).toBe(before);
    expect(good.connected).toBe(true); // twelve refusals, at most one of them for a malformed message: still connected
  });

  it('refuses a replayed challenge', async () => {
    const miner = generateIdentity();
    const socket = await open();
    const { challenge } = await request<{ challenge: string }>(socket, 'hello', { v: PROTOCOL_VERSION, publicKey: miner.publicKey });
    const signed = { publicKey: miner.publicKey, challenge, backend: 'wasm', tokensPerSec: 1 };
    const message = { v: 1, ...signed, signature: miner.sign('register', signed) };
    await request(socket, 'register', message);
    // The same signed answer on another connection: its challenge was never issued there.
    const other = await open();
    await request(other, 'hello', { v: PROTOCOL_VERSION, publicKey: miner.publicKey });
    expect(await rejection(request(other, 'register', message))).toBe('OUT_OF_PHASE');
  });

  it('tells a restart (another process under the same key) from a reconnection: its open audits are forfeited, never flagged, and so is one drawn as it restarted', async () => {
    const miner = generateIdentity();
    const [first, second] = ['a'.repeat(32), 'b'.repeat(32)];
    const { minerId, stage, runId } = await register(await open(), miner, { backend: 'wasm', tokensPerSec: 1, instance: first });
    const audit = async (round: number, seconds: number): Promise<string> => {
      const auditId = randomBytes(16).toString('hex');
      await app.db.query(`INSERT INTO audits (id, run_id, stage, round, miner_id, status, deadline) VALUES ($1, $2, $3, $4, $5, 'open', now() + make_interval(secs => $6))`, [auditId, runId, stage, round, minerId, seconds]);
      return auditId;
    };
    const row = async (auditId: string) => (await app.db.query<{ status: string; reason: string | null }>('SELECT status, reason FROM audits WHERE id = $1', [auditId]))[0];
    const open1 = await audit(1, 60);
    // A reconnection of the same process (its instance unchanged, or not named): nothing changes.
    expect((await register(await open(), miner, { backend: 'wasm', tokensPerSec: 1, instance: first })).restarted).toBeUndefined();
    expect((await register(await open(), miner, { backend: 'wasm', tokensPerSec: 1 })).restarted).toBeUndefined();
    expect(await row(open1)).toEqual({ status: 'open', reason: null });
    // An instance that is not 32 hex digits is refused by name, and changes nothing.
    expect(await rejection(register(await open(), miner, { backend: 'wasm', tokensPerSec: 1, instance: 'B'.repeat(32) }))).toBe('SCHEMA');
    expect(await app.db.query('SELECT instance FROM miners WHERE id = $1', [minerId])).toEqual([{ instance: first }]);
    expect(await app.db.query('SELECT 1 FROM miner_restarts')).toEqual([]);
    expect(await row(open1)).toEqual({ status: 'open', reason: null });
    // Round 2 committed by the first process, then drawn just as it restarted (its audit expires below).
    await app.db.query(`INSERT INTO round_commitments (run_id, stage, round, miner_id, weights_hash, optimizer_hash, ready_at) VALUES ($1, $2, 2, $3, 'w', 'o', now())`, [runId, stage, minerId]);
    // Another process under the same key: a restart, on the stage it held.
    const again = await register(await open(), miner, { backend: 'wasm', tokensPerSec: 1, instance: second });
    expect(again.restarted).toEqual({ forfeited: 1 });
    expect(again.stage).toBe(stage);
    expect(await row(open1)).toEqual({ status: 'forfeited', reason: 'RESTARTED' });
    const drawnLate = await audit(2, -(AUDIT_GRACE_MS / 1000 + 1)); // past its hard bound
    await app.validator.audits.tick();
    expect(await row(drawnLate)).toEqual({ status: 'forfeited', reason: 'RESTARTED' });
    expect(await app.db.query('SELECT stage, forfeited FROM miner_restarts WHERE miner_id = $1', [minerId])).toEqual([{ stage, forfeited: 2 }]);
    // One drawn from a round the new process committed, unanswered while it is here, is its own fault.
    await app.db.query(`INSERT INTO round_commitments (run_id, stage, round, miner_id, weights_hash, optimizer_hash, ready_at) VALUES ($1, $2, 3, $3, 'w', 'o', now())`, [runId, stage, minerId]);
    const unanswered = await audit(3, -(AUDIT_GRACE_MS / 1000 + 1));
    await app.validator.audits.tick();
    expect(await row(unanswered)).toEqual({ status: 'unanswered', reason: 'AUDIT_UNANSWERED' });
    expect(await app.db.query<{ kind: string }>('SELECT kind FROM flags WHERE miner_id = $1', [minerId])).toEqual([{ kind: 'AUDIT_UNANSWERED' }]);
  });

  it('records receipts from both ends; agreement confirms a transfer, disagreement is a dispute', async () => {
    const a = await open();
    const ra = await register(a, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 });
    const b = await open();
    const rb = await register(b, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 });
    const receipt = (id: string, bytes: number) => ({
      v: 1, epoch: 0, activationId: id, direction: 'activation', from: ra.minerId, to: rb.minerId, bytes, payloadHash: 'ab'.repeat(32),
    });
    await request(a, 'receipt', receipt('1'.repeat(32), 100));
    expect(await app.coordinator.receiptSummary()).toEqual({ confirmed: 0, oneSided: 1, disputed: 0 });
    await request(b, 'receipt', receipt('1'.repeat(32), 100));
    await request(a, 'receipt', receipt('2'.repeat(32), 100));
    await request(b, 'receipt', receipt('2'.repeat(32), 99)); // the receiver says it got less
    expect(await app.coordinator.receiptSummary()).toEqual({ confirmed: 1, oneSided: 0, disputed: 1 });
    // A miner speaks only for itself, once per transfer.
    expect(await rejection(request(a, 'receipt', receipt('1'.repeat(32), 100)))).toBe('REPLAYED');
    const c = await open();
    await register(c, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 });
    expect(await rejection(request(c, 'receipt', receipt('3'.repeat(32), 100)))).toBe('SCHEMA');
    expect(await rejection(request(await open(), 'receipt', receipt('3'.repeat(32), 100)))).toBe('NOT_REGISTERED');
    expect(await app.coordinator.receiptSummary()).toEqual({ confirmed: 1, oneSided: 0, disputed: 1 });
  });

  it('disconnects a connection that keeps sending bad messages', async () => {
    const socket = await open();
    const disconnected = new Promise((resolve) => socket.once('disconnect', resolve));
    for (let i = 0; i < 6; i++) socket.emit('hello', { v: 1, publicKey: 'bad' });
    await disconnected;
  });

  it('refills a stage that empties by moving a miner from the most crowded one', async () => {
    const a = await open();
    await register(a, generateIdentity(), { backend: 'wasm', tokensPerSec: 100 }); // stage 0
    const b = await open();
    await register(b, generateIdentity(), { backend: 'wasm', tokensPerSec: 100 }); // stage 1
    const c = await open();
    await register(c, generateIdentity(), { backend: 'wasm', tokensPerSec: 100 }); // stage 2
    const d = await open();
    const moved = await register(d, generateIdentity(), { backend: 'wasm', tokensPerSec: 50 }); // stage 0 (slowest there)
    expect(moved.stage).toBe(0);
    const reassigned = new Promise<{ stage: number }>((resolve) => d.once('reassigned', resolve));
    c.disconnect();
    expect((await reassigned).stage).toBe(2);
    const rows = await minerRows();
    expect(rows.filter((r) => r.status === 'active').map((r) => r.stage).sort()).toEqual([0, 1, 2]);
  });
});

describe('coordinator: heartbeats', () => {
  it('drops a miner that stops sending heartbeats, and keeps one that does not', async () => {
    app = await buildApp({ run: { name: 'silent', preset: 'tiny', stages: 3, bottleneck: 32 }, database: await testDatabase(), silentMs: 1500 });
    url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
    const quiet = await open();
    const quietId = (await register(quiet, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 })).minerId;
    const alive = await open();
    await register(alive, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 });
    const beat = setInterval(() => alive.emit('heartbeat', { v: 1, seq: 0 }), 300);
    const dropped = new Promise((resolve) => quiet.once('disconnect', resolve));
    await dropped;
    clearInterval(beat);
    const rows = await minerRows();
    expect(rows.find((r) => r.id === quietId)?.status).toBe('dropped');
    expect(rows.filter((r) => r.status === 'active')).toHaveLength(1);
    expect(alive.connected).toBe(true);
  });
});

describe('coordinator: its own stalls', () => {
  it('does not drop a miner whose heartbeats were queued while the coordinator itself was busy', async () => {
    app = await buildApp({ run: { name: 'stall', preset: 'tiny', stages: 3, bottleneck: 32 }, database: await testDatabase(), silentMs: 1500 });
    url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
    const alive = await open();
    const id = (await register(alive, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 })).minerId;
    const beat = setInterval(() => alive.emit('heartbeat', { v: 1, seq: 0 }), 300);
    await new Promise((r) => setTimeout(r, 1000));
    // Three seconds of synchronous work in the coordinator's process (as a held-out evaluation is).
    const until = Date.now() + 3000;
    while (Date.now() < until);
    await new Promise((r) => setTimeout(r, 3000));
    clearInterval(beat);
    expect(alive.connected).toBe(true);
    expect((await minerRows()).find((r) => r.id === id)?.status).toBe('active');
  });
});

describe('coordinator: persistence', () => {
  it('keeps the run and its miners across a restart (PGlite on disk, or the PostgreSQL server)', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'tah-coord-'));
    dirs.push(dataDir);
    const database = await testDatabase(`restart${Date.now()}`, dataDir);
    await start(database);
    const runId = app.coordinator.runId;
    const r = await register(await open(), generateIdentity(), { backend: 'wasm', tokensPerSec: 10 });
    sockets.splice(0).forEach((s) => s.disconnect());
    await app.close();

    await start(database);
    expect(app.coordinator.runId).toBe(runId);
    const rows = await minerRows();
    expect(rows.map((x) => x.id)).toEqual([r.minerId]);
    // It must register again to become active; until then it is not counted.
    expect((await app.fastify.inject({ method: 'GET', url: '/api/status' })).json().activeMiners).toBe(0);
    const again = await register(await open(), generateIdentity(), { backend: 'wasm', tokensPerSec: 10 });
    expect(again.stage).toBe(0);
  });
});

describe('coordinator: static files', () => {
  it('serves the built web app and the prepared shards by byte range, and nothing else from the data folder', async () => {
    const { DATA_DIR, datasetName } = await import('@train-at-home/model/node');
    const { mkdtempSync, writeFileSync } = await import('node:fs');
    const webRoot = mkdtempSync(join(tmpdir(), 'tah-web-'));
    dirs.push(webRoot);
    writeFileSync(join(webRoot, 'index.html'), '<h1>Train at Home</h1>');
    app = await buildApp({ run: { name: 'static', preset: 'tiny', stages: 3, bottleneck: 32 }, database: await testDatabase(), webRoot, dataRoot: DATA_DIR });
    const page = await app.fastify.inject({ method: 'GET', url: '/' });
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('Train at Home');
    const shard = `/data/${datasetName(320)}/train-000.bin`;
    const range = await app.fastify.inject({ method: 'GET', url: shard, headers: { range: 'bytes=0-127' } });
    expect(range.statusCode).toBe(206);
    expect(range.rawPayload.length).toBe(128);
    expect((await app.fastify.inject({ method: 'GET', url: '/data/../package.json' })).statusCode).toBe(404);
    expect((await app.fastify.inject({ method: 'GET', url: '/data/coordinator/PG_VERSION' })).statusCode).toBe(404);
    // Only the names a dataset has: no `..`, encoded or not, and no other file.
    for (const path of [`/data/${datasetName(320)}/..`, `/data/${datasetName(320)}/%2e%2e`, `/data/${datasetName(320)}/..%2f..%2fpackage.json`, `/data/${datasetName(320)}/notes.txt`]) {
      expect((await app.fastify.inject({ method: 'GET', url: path })).statusCode, path).toBe(404);
    }
    expect((await app.fastify.inject({ method: 'GET', url: `/data/${datasetName(320)}/manifest.json` })).statusCode).toBe(200);
  });
});

describe('coordinator: a run on the gpu preset', () => {
  it('refuses a miner whose backend cannot train the preset by name, records nothing, and takes a WebGPU one', async () => {
    app = await buildApp({ run: { name: 'gpu-run', preset: 'gpu', stages: 3 }, database: await testDatabase() });
    url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
    for (const backend of ['wasm', 'cpu'] as const) {
      expect(await rejection(register(await open(), generateIdentity(), { backend, tokensPerSec: 50 }))).toBe('UNSUITABLE_BACKEND');
    }
    expect(await minerRows()).toEqual([]);
    const r = await register(await open(), generateIdentity(), { backend: 'webgpu', tokensPerSec: 5000 });
    expect([r.stage, r.layout.preset]).toEqual([0, 'gpu']);
    expect((await minerRows()).map((m) => m.status)).toEqual(['active']);
  });

  it('does not fill its empty stages from a machine that cannot train it: the local miners it starts are refused, and none is started again', async () => {
    app = await buildApp({ run: { name: 'gpu-local', preset: 'gpu', stages: 3 }, database: await testDatabase() });
    url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
    await register(await open(), generateIdentity(), { backend: 'webgpu', tokensPerSec: 5000 }); // a visitor on a GPU
    app.localMiners.start(url, 2);
    // They ask for WebGPU; Dawn finds no adapter on this machine, they fall back to WASM, and the coordinator refuses them.
    await expect.poll(() => app.localMiners.refused, { timeout: 90_000, interval: 250 }).toBe(true);
    await expect.poll(() => app.localMiners.running, { timeout: 20_000, interval: 250 }).toBe(0);
    await new Promise((r) => setTimeout(r, 3000)); // three ticks of the sweep
    expect(app.localMiners.running).toBe(0);
    expect((await minerRows()).length).toBe(1);
  });
});
