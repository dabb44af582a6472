import { generateIdentity, PROTOCOL_VERSION } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import { afterEach, describe, expect, it } from 'vitest';
import { emitWithAck, hardeningHarness, stageMap } from '@train-at-home/testkit/hardening-harness';

/** Defect 1: a reconnecting miner was deregistered when its old connection closed. */
describe('a miner that reconnects', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  it('stays registered when its old connection closes after it registered again on a new one', async () => {
    const { app, url } = await h.start();
    const identity = generateIdentity();
    const first = await h.open(url);
    const { minerId } = await register(first, identity, { backend: 'wasm', tokensPerSec: 1 });
    const second = await h.open(url);
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

  it('leaves no active miner behind when a connection closes while its registration is being stored', async () => {
    const { app, url } = await h.start();
    const identity = generateIdentity();
    const socket = await h.open(url);
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
});
