import { createHmac } from 'node:crypto';
import { generateIdentity, PROTOCOL_VERSION } from '@train-at-home/protocol';
import { register, request, requestIce, CoordinatorError } from '@train-at-home/swarm';
import { io as connect, type Socket } from 'socket.io-client';
import { afterAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { iceFor, networkSettings, NetworkConfigError, RelayBudget, turnCredentials } from '../src/network';

describe('network settings (STUN, TURN, the relay)', () => {
  it('mints TURN REST credentials: username expiry:minerId, password base64 HMAC-SHA1 of it with the secret', () => {
    const expiresAt = Date.UTC(2026, 10, 26, 12, 0, 0);
    const c = turnCredentials('s3cret', 'ab'.repeat(32), expiresAt);
    expect(c.username).toBe(`${expiresAt / 1000}:${'ab'.repeat(32)}`);
    expect(c.credential).toBe(createHmac('sha1', 's3cret').update(c.username).digest('base64'));
    expect(turnCredentials('other', 'ab'.repeat(32), expiresAt).credential).not.toBe(c.credential);
  });

  it('serves no ICE server unless the operator names one, and never the secret', () => {
    expect(iceFor(networkSettings(), 'm')).toEqual({ iceServers: [], expiresAt: null, relay: false });
    const s = networkSettings({ stun: ['stun:turn.example.org:3478'], turn: ['turn:turn.example.org:3478?transport=udp', 'turns:turn.example.org:443?transport=tcp'], turnSecret: 'k', turnTtlSeconds: 600 });
    const ice = iceFor(s, 'miner1', 1_000_000);
    expect(ice.expiresAt).toBe(1_000_000 + 600_000);
    expect(ice.iceServers).toEqual([
      { urls: ['stun:turn.example.org:3478'] },
      { urls: ['turn:turn.example.org:3478?transport=udp', 'turns:turn.example.org:443?transport=tcp'], ...turnCredentials('k', 'miner1', 1_600_000) },
    ]);
    expect(JSON.stringify(ice)).not.toContain('"k"');
  });

  it('refuses a bad setting by name', () => {
    expect(() => networkSettings({ stun: ['http://x'] })).toThrow(NetworkConfigError);
    expect(() => networkSettings({ turn: ['turn:x:3478?transport=sctp'], turnSecret: 'k' })).toThrow(/not a TURN URL/);
    expect(() => networkSettings({ turn: ['turn:x:3478'] })).toThrow(/secret/);
    expect(() => networkSettings({ turnTtlSeconds: 5 })).toThrow(/turnTtlSeconds/);
    expect(() => networkSettings({ relay: { enabled: true, bytesPerMinute: 0 } })).toThrow(/bytesPerMinute/);
  });

  it('counts relayed bytes per miner per minute', () => {
    const b = new RelayBudget(1000);
    expect(b.take('a', 600, 100_000)).toBeUndefined();
    expect(b.take('a', 600, 110_000)).toBe(50_000);
    expect(b.take('b', 600, 110_000)).toBeUndefined();
    // The clock's minute turning (at 120 s) starts nothing afresh: a's minute began at 100 s.
    expect(b.take('a', 300, 119_999)).toBeUndefined();
    expect(b.take('a', 200, 120_001)).toBe(39_999);
    expect(b.take('a', 1000, 160_000)).toBeUndefined(); // a's next minute
  });
});

describe('ICE servers with the registration, and fresh ones on request', () => {
  let app: App;
  const sockets: Socket[] = [];
  afterAll(async () => {
    sockets.forEach((s) => s.disconnect());
    await app?.close();
  });

  it('gives each miner TURN credentials of its own, fresh ones on `ice`, and refuses `ice` before registration', async () => {
    app = await buildApp({
      database: await testDatabase(),
      run: { name: 'ice', preset: 'tiny', stages: 2, bottleneck: 32 },
      network: { stun: ['stun:10.0.0.1:3478'], turn: ['turn:10.0.0.1:3478?transport=udp'], turnSecret: 'shh', turnTtlSeconds: 120 },
    });
    const url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
    const socket = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
    sockets.push(socket);
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
    await expect(request(socket, 'ice', { v: PROTOCOL_VERSION })).rejects.toMatchObject({ code: 'NOT_REGISTERED' });
    const before = Date.now();
    const { minerId, ice } = await register(socket, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 });
    expect(ice!.relay).toBe(false);
    expect(ice!.expiresAt).toBeGreaterThanOrEqual(before + 120_000);
    const turn = ice!.iceServers[1]!;
    expect(turn.username).toBe(`${Math.floor(ice!.expiresAt! / 1000)}:${minerId}`);
    expect(turn.credential).toBe(createHmac('sha1', 'shh').update(turn.username!).digest('base64'));
    await new Promise((r) => setTimeout(r, 1100));
    const fresh = await requestIce(socket);
    expect(fresh.expiresAt).toBeGreaterThan(ice!.expiresAt!);
    expect(fresh.iceServers[1]!.username).not.toBe(turn.username);
    // A rotated secret is used from the next request on.
    app.coordinator.setNetwork({ ...app.coordinator.network, turnSecret: 'rotated' });
    const rotated = (await requestIce(socket)).iceServers[1]!;
    expect(rotated.credential).toBe(createHmac('sha1', 'rotated').update(rotated.username!).digest('base64'));
    // Malformed: named, nothing else.
    await expect(request(socket, 'ice', { v: PROTOCOL_VERSION, extra: 1 })).rejects.toBeInstanceOf(CoordinatorError);
    await expect(request(socket, 'ice', { v: PROTOCOL_VERSION, extra: 1 })).rejects.toMatchObject({ code: 'SCHEMA' });
  });
});
