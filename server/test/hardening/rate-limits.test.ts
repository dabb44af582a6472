import { generateIdentity, PROTOCOL_VERSION } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import { afterEach, describe, expect, it } from 'vitest';
import { emitWithAck, hardeningHarness, type Reply } from '@train-at-home/testkit/hardening-harness';

/** Rate limits on every HTTP route (per IP) and every socket event (per connection and per miner; registrations also per address). */
describe('rate limits', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  it('answer HTTP requests over the per-IP budget with 429 RATE_LIMITED and the time to wait', async () => {
    const { app } = await h.start('hardening-http-rate', undefined, { http: { requestsPerIpPerMinute: 5 } });
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) statuses.push((await app.fastify.inject({ method: 'GET', url: '/api/status' })).statusCode);
    expect(statuses).toEqual([200, 200, 200, 200, 200]);
    // Every route counts toward the same budget, and the refusal is named.
    const refused = await app.fastify.inject({ method: 'GET', url: '/api/leaderboard' });
    expect(refused.statusCode).toBe(429);
    expect(refused.json()).toMatchObject({ error: 'RATE_LIMITED' });
    expect(refused.json().retryAfterMs).toBeGreaterThan(0);
    expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);
    // Another address has its own budget.
    expect((await app.fastify.inject({ method: 'GET', url: '/api/status', remoteAddress: '10.9.8.7' })).statusCode).toBe(200);
  });

  it('behind a trusted load balancer, count each forwarded client, and believe no one else who says they forward', async () => {
    const { app } = await h.start('hardening-http-rate-proxy', undefined, { http: { requestsPerIpPerMinute: 2, trustedProxies: ['10.1.0.0/24'] } });
    const via = (client: string, from = '10.1.0.9') => app.fastify.inject({ method: 'GET', url: '/api/status', remoteAddress: from, headers: { 'x-forwarded-for': client } }).then((r) => r.statusCode);
    // Two clients behind the balancer: each its own budget, though every request comes from the balancer.
    expect([await via('203.0.113.1'), await via('203.0.113.1'), await via('203.0.113.1')]).toEqual([200, 200, 429]);
    expect([await via('203.0.113.2'), await via('203.0.113.2')]).toEqual([200, 200]);
    // A client that is not the balancer names someone else in the header: its own address is counted.
    expect([await via('203.0.113.3', '198.51.100.7'), await via('203.0.113.4', '198.51.100.7'), await via('203.0.113.5', '198.51.100.7')]).toEqual([200, 200, 429]);
  });

  it('refuse a flood of registrations from one address by name, before any signature is checked, while another address joins at once', async () => {
    const { app, url } = await h.start('hardening-register-flood', undefined, { socketRates: { 'register-per-address': { max: 3, perMs: 60_000 } } });
    /** A new identity's hello and register on a connection of its own, from `from` (a loopback address); `forge` signs it wrongly. */
    const join = async (from = '127.0.0.1', forge = false): Promise<Reply> => {
      const socket = await h.open(url, ['websocket'], from);
      const identity = generateIdentity();
      const hello = await emitWithAck(socket, 'hello', { v: PROTOCOL_VERSION, publicKey: identity.publicKey });
      const signed = { publicKey: identity.publicKey, challenge: hello.challenge as string, backend: 'wasm', tokensPerSec: 1 };
      const signature = forge ? generateIdentity().sign('register', signed) : identity.sign('register', signed);
      return emitWithAck(socket, 'register', { v: PROTOCOL_VERSION, ...signed, signature });
    };
    const active = async (): Promise<number> => (await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM miners WHERE status = 'active'`))[0]!.n;
    expect((await Promise.all([join(), join(), join()])).map((r) => r.ok)).toEqual([true, true, true]);
    const flooded = await join();
    expect(flooded).toMatchObject({ ok: false, error: { code: 'RATE_LIMITED', message: expect.stringContaining('registrations from this address') } });
    expect(flooded.error!.retryAfterMs).toBeGreaterThan(0);
    // Refused before its signature is looked at: a forged one gets the same answer, not BAD_SIGNATURE.
    expect(await join('127.0.0.1', true)).toMatchObject({ ok: false, error: { code: 'RATE_LIMITED' } });
    expect(await active()).toBe(3);
    // Someone else, from another address, joins at once.
    expect(await join('127.0.0.2')).toMatchObject({ ok: true, stage: expect.any(Number) });
    expect(await active()).toBe(4);
  });

  it('refuse socket events over budget by name, with the time to wait, per connection and per miner, and take them again after it', async () => {
    const { app, url } = await h.start('hardening-socket-rate', undefined, { socketRates: { heartbeat: { max: 3, perMs: 1000 }, other: { max: 2, perMs: 1000 } } });
    const identity = generateIdentity();
    const first = await h.open(url);
    await register(first, identity, { backend: 'wasm', tokensPerSec: 1 });
    const beat = (s: typeof first, seq: number) => emitWithAck(s, 'heartbeat', { v: PROTOCOL_VERSION, seq });
    const replies = [await beat(first, 1), await beat(first, 2), await beat(first, 3), await beat(first, 4)];
    expect(replies.slice(0, 3)).toEqual([{ ok: true }, { ok: true }, { ok: true }]);
    expect(replies[3]).toMatchObject({ ok: false, error: { code: 'RATE_LIMITED' } });
    const waitMs = replies[3]!.error!.retryAfterMs!;
    expect(waitMs).toBeGreaterThan(0);
    expect(waitMs).toBeLessThanOrEqual(1000);
    // A second connection of the same miner shares its budget.
    const second = await h.open(url);
    await register(second, identity, { backend: 'wasm', tokensPerSec: 1 });
    expect(await beat(second, 5)).toMatchObject({ ok: false, error: { code: 'RATE_LIMITED' } });
    // Over-budget messages are not bad messages: the connection is not dropped, and after the wait it is heard again.
    await new Promise((r) => setTimeout(r, waitMs + 50));
    expect(await beat(second, 6)).toEqual({ ok: true });
    // Unknown events have a budget too (and still count as bad messages).
    const stranger = await h.open(url);
    const unknown = [await emitWithAck(stranger, 'nonsense', 1), await emitWithAck(stranger, 'nonsense', 2), await emitWithAck(stranger, 'nonsense', 3)];
    expect(unknown.map((r) => r.error?.code)).toEqual(['UNKNOWN_EVENT', 'UNKNOWN_EVENT', 'RATE_LIMITED']);
    expect((await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM miners WHERE status = 'active'`))[0]!.n).toBe(1);
  });
});
