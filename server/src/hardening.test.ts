import { mkdtempSync, rmSync } from 'node:fs';
import { createConnection, type Socket as NetSocket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateIdentity, PROTOCOL_VERSION } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import { io as connect, type Socket } from 'socket.io-client';
import { afterEach, describe, expect, it, onTestFinished } from 'vitest';
import { buildApp, type App, type AppOptions } from './app';
import { testDatabase } from './db/test-database';

/**
 * What a hostile or merely unlucky client found (issue 16), each sent as it
 * was found: the answer is a clear 4xx or a named rejection, and the state
 * the coordinator keeps is what it should be.
 */
let app: App | undefined;
const sockets: Socket[] = [];
/** Raw TCP connections a test holds open (closed before the app, which waits for them). */
const raw: NetSocket[] = [];
afterEach(async () => {
  sockets.splice(0).forEach((s) => s.disconnect());
  raw.splice(0).forEach((c) => c.destroy());
  await app?.close();
  app = undefined;
});

async function start(name = 'hardening', database?: Awaited<ReturnType<typeof testDatabase>>, http?: AppOptions['http']): Promise<{ app: App; url: string }> {
  app = await buildApp({ run: { name, preset: 'tiny', stages: 3, bottleneck: 32 }, database: database ?? (await testDatabase()), ...(http ? { http } : {}) });
  return { app, url: await app.fastify.listen({ port: 0, host: '127.0.0.1' }) };
}

async function open(url: string, transports: Array<'websocket' | 'polling'> = ['websocket']): Promise<Socket> {
  const socket = connect(url, { transports, reconnection: false, forceNew: true });
  sockets.push(socket);
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('connect_error', reject);
  });
  return socket;
}

const stageMap = async (a: App): Promise<string[][]> => (await a.coordinator.stageMap()).map((s) => s.miners.map((m) => m.id));
const emitWithAck = (socket: Socket, event: string, ...args: unknown[]): Promise<{ ok: boolean; error?: { code: string } }> =>
  new Promise((resolve) => socket.emit(event, ...args, resolve));

describe('hardening: what a hostile or unlucky client found', () => {
  it('a miner that registers again on a new connection stays registered when the old connection closes', async () => {
    const { app, url } = await start();
    const identity = generateIdentity();
    const first = await open(url);
    const { minerId } = await register(first, identity, { backend: 'wasm', tokensPerSec: 1 });
    const second = await open(url);
    await register(second, identity, { backend: 'wasm', tokensPerSec: 1 });
    first.disconnect();
    // The old connection's close is handled (give it the time a departure takes to be stored)…
    await new Promise((r) => setTimeout(r, 500));
    // …and the miner is still active, in the stage map, and its heartbeats on the new connection count.
    expect((await app.db.query<{ status: string }>('SELECT status FROM miners WHERE id = $1', [minerId]))[0]!.status).toBe('active');
    expect((await stageMap(app)).flat()).toContain(minerId);
    expect(await emitWithAck(second, 'heartbeat', { v: PROTOCOL_VERSION, seq: 1 })).toEqual({ ok: true });
    expect(app.coordinator.sockets.get(minerId)?.id).toBe(second.id);
  });

  it('a connection that closes while its registration is being stored leaves no active miner behind', async () => {
    const { app, url } = await start();
    const identity = generateIdentity();
    const socket = await open(url);
    const { challenge } = await new Promise<{ challenge: string }>((r) => socket.emit('hello', { v: PROTOCOL_VERSION, publicKey: identity.publicKey }, r));
    const signed = { publicKey: identity.publicKey, challenge, backend: 'wasm', tokensPerSec: 1 };
    socket.emit('register', { v: PROTOCOL_VERSION, ...signed, signature: identity.sign('register', signed) }, () => {});
    socket.disconnect(); // at once: the registration is still being stored
    const minerId = identity.publicKey.slice(2);
    await expect.poll(async () => (await app.db.query<{ status: string }>('SELECT status FROM miners WHERE id = $1', [minerId]))[0]?.status ?? 'none').not.toBe('active');
    await new Promise((r) => setTimeout(r, 300));
    expect((await app.db.query<{ status: string }>('SELECT status FROM miners WHERE id = $1', [minerId]))[0]?.status ?? 'none').not.toBe('active');
    expect(app.coordinator.sockets.has(minerId)).toBe(false);
    expect((await stageMap(app)).flat()).not.toContain(minerId);
  });

  it('a version that is an object, and a message with no payload, get a named rejection as their acknowledgement', async () => {
    const { url } = await start();
    const socket = await open(url);
    expect(await emitWithAck(socket, 'hello', { v: { toString: 1 }, publicKey: generateIdentity().publicKey })).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    expect(await emitWithAck(socket, 'heartbeat')).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    // The connection still works.
    expect(await emitWithAck(socket, 'hello', { v: PROTOCOL_VERSION, publicKey: generateIdentity().publicKey })).toMatchObject({ ok: true });
  });

  it('a miner that registers into another run (the coordinator restarted under a new name) appears in that run', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tah-hardening-'));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const database = await testDatabase(`hardening_runs_${Date.now()}`, dir);
    const identity = generateIdentity();
    let { app: first, url } = await start('run-a', database);
    await register(await open(url), identity, { backend: 'wasm', tokensPerSec: 1 });
    sockets.splice(0).forEach((s) => s.disconnect());
    await first.close();
    ({ app: first, url } = await start('run-b', database));
    const { minerId, runId } = await register(await open(url), identity, { backend: 'wasm', tokensPerSec: 1 });
    expect(runId).toBe(first.coordinator.runId);
    expect((await stageMap(first)).flat()).toContain(minerId);
  });

  it('answers a DELETE on a live socket.io session with a clear 4xx, and the session lives on', async () => {
    const { url } = await start();
    const socket = await open(url, ['polling']);
    const sid = (socket.io.engine as unknown as { id: string }).id;
    const res = await fetch(`${url}/socket.io/?EIO=4&transport=polling&sid=${sid}`, { method: 'DELETE' });
    expect(res.status).toBe(405);
    expect(await res.json()).toMatchObject({ error: 'METHOD_NOT_ALLOWED' });
    expect(await emitWithAck(socket, 'hello', { v: PROTOCOL_VERSION, publicKey: generateIdentity().publicKey })).toMatchObject({ ok: true });
  });
  it('answers out-of-range stages and steps of checkpoints with a named 4xx, never a 500 with database internals', async () => {
    const { app, url } = await start();
    const { minerId } = await register(await open(url), generateIdentity(), { backend: 'wasm', tokensPerSec: 1 }); // stage 0
    for (const stage of ['2147483648', '1e10', '9007199254740993', '3', '-1', '01']) {
      const res = await app.fastify.inject({ method: 'GET', url: `/api/checkpoints/${stage}/latest` });
      expect([res.statusCode, res.json().error], stage).toEqual([404, 'NO_SUCH_STAGE']);
    }
    const put = await app.fastify.inject({
      method: 'PUT',
      url: '/api/checkpoints/0',
      headers: { 'content-type': 'application/octet-stream', 'x-miner-id': minerId, 'x-step': '2147483648', 'x-signature': '0x00' },
      payload: Buffer.alloc(16),
    });
    expect([put.statusCode, put.json().error]).toEqual([400, 'SCHEMA']);
    expect(await app.db.query('SELECT 1 FROM checkpoints')).toEqual([]);
  });
  /** Sends a request's headers and the first bytes of its body by hand; resolves with the status the server answers, or 'closed'. */
  function rawRequest(url: string, head: string, body: Buffer): Promise<{ status: number | 'closed'; ms: number }> {
    const { hostname, port } = new URL(url);
    const started = performance.now();
    return new Promise((resolve) => {
      const socket = createConnection({ host: hostname, port: Number(port) }, () => socket.write(Buffer.concat([Buffer.from(head), body])));
      let data = '';
      socket.on('data', (c) => (data += c.toString()));
      const done = (): void => {
        const m = /^HTTP\/1\.1 (\d{3})/.exec(data);
        resolve({ status: m ? Number(m[1]) : 'closed', ms: performance.now() - started });
      };
      socket.on('close', done);
      socket.on('error', () => {});
      socket.setTimeout(15_000, () => socket.destroy());
      // An answer may come before the server closes: take it as soon as its status line is in.
      socket.on('data', () => /^HTTP\/1\.1 \d{3}/.test(data) && (socket.destroy(), undefined));
    });
  }

  it('refuses a huge JSON body to the checkpoint route from its headers, before reading it, and stays responsive', async () => {
    const { app, url } = await start();
    const rss = process.memoryUsage().rss;
    // Headers promise 60 MB of JSON; one byte follows. An answer can only come from the headers.
    const head = `PUT /api/checkpoints/0 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${60 * 1024 * 1024}\r\n\r\n`;
    expect((await rawRequest(url, head, Buffer.from('{'))).status).toBe(415);
    const octets = `PUT /api/checkpoints/0 HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: ${65 * 1024 * 1024}\r\nx-miner-id: ${'ab'.repeat(32)}\r\n\r\n`;
    expect((await rawRequest(url, octets, Buffer.alloc(1))).status).toBe(413);
    const stranger = octets.replace(`${65 * 1024 * 1024}`, `${1024 * 1024}`);
    expect((await rawRequest(url, stranger, Buffer.alloc(1))).status).toBe(403);
    const status = await app.fastify.inject({ method: 'GET', url: '/api/status' });
    expect(status.statusCode).toBe(200);
    expect(process.memoryUsage().rss - rss).toBeLessThan(50 * 1024 * 1024);
    expect(await app.db.query('SELECT 1 FROM checkpoints')).toEqual([]);
  });

  it('times out a request whose body never finishes, and caps connections per IP address', async () => {
    const { url } = await start('hardening-limits', undefined, { requestTimeoutMs: 1500, headersTimeoutMs: 1500, maxConnectionsPerIp: 4 });
    // A body of 32 KiB promised (within the JSON limit), 12 bytes sent: answered 408 and closed once the request's time is up.
    const head = `POST /api/rewards/challenge HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${32 * 1024}\r\n\r\n`;
    const slow = await rawRequest(url, head, Buffer.from('{"kind":"li"'));
    expect(slow.status === 408 || slow.status === 'closed', JSON.stringify(slow)).toBe(true);
    expect(slow.ms).toBeLessThan(10_000);
    // Four connections from this address stay open; a fifth is closed at once.
    const { hostname, port } = new URL(url);
    const held = await Promise.all(Array.from({ length: 4 }, () => new Promise<NetSocket>((r) => raw.push(createConnection({ host: hostname, port: Number(port) }, function (this: NetSocket) { r(this); })))));
    const fifth = createConnection({ host: hostname, port: Number(port) });
    await new Promise<void>((r) => fifth.once('close', () => r()));
    // Once one closes, a new connection is served.
    held.pop()!.destroy();
    await new Promise((r) => setTimeout(r, 200));
    expect((await fetch(`${url}/api/status`)).status).toBe(200);
  });
});
