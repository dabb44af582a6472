import { generateIdentity, PROTOCOL_VERSION } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import type { Socket } from 'socket.io-client';
import { afterEach, describe, expect, it } from 'vitest';
import { hardeningHarness, type Reply } from '@train-at-home/testkit/hardening-harness';

/**
 * Issue 25, item 12: an event sent with an acknowledgement but without the one
 * payload the handler expected (none, or several) had its rejection sent as a
 * separate `reply` event, and the sender's callback never ran. socket.io puts
 * the callback last, after however many payloads; every event, known or not,
 * must answer through it.
 */
describe('acknowledgements whatever the payload', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  /** Emits with a callback; resolves with what the callback got, or 'no ack' after 3 s. Records stray `reply` events. */
  const ask = (socket: Socket, event: string, ...payloads: unknown[]): Promise<Reply | 'no ack'> =>
    new Promise((resolve) => {
      const timer = setTimeout(() => resolve('no ack'), 3000);
      socket.emit(event, ...payloads, (reply: Reply) => {
        clearTimeout(timer);
        resolve(reply);
      });
    });
  const strays = (socket: Socket): unknown[] => {
    const seen: unknown[] = [];
    socket.on('reply', (r: unknown) => seen.push(r));
    return seen;
  };

  const EVENTS = ['hello', 'register', 'heartbeat', 'signal', 'loss', 'receipt', 'merge-ready', 'merged', 'frame', 'ice'];

  it('every event with a callback and no payload, null, or several payloads gets its named rejection through the callback', async () => {
    // Room for every message below in one connection: rejections do not disconnect here, budgets are wide.
    const { url } = await h.start('hardening-ack');
    const shapes: Array<[string, unknown[]]> = [
      ['no payload', []],
      ['null', [null]],
      ['a number', [7]],
      ['two payloads', [{ v: PROTOCOL_VERSION }, { v: PROTOCOL_VERSION }]],
    ];
    for (const registered of [false, true]) {
      for (const event of [...EVENTS, 'no-such-event']) {
        for (const [shape, payloads] of shapes) {
          // A fresh connection each time: a connection that sends more than MAX_REJECTIONS bad messages is closed.
          const socket = await h.open(url);
          if (registered) await register(socket, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 });
          const seen = strays(socket);
          const reply = await ask(socket, event, ...payloads);
          const what = `${registered ? 'registered' : 'new'} connection, ${event} with ${shape}`;
          expect(reply, what).not.toBe('no ack');
          expect((reply as Reply).ok, what).toBe(false);
          expect((reply as Reply).error?.code, what).toMatch(/^[A-Z_]+$/);
          expect((reply as Reply).error?.code, what).not.toBe('INTERNAL');
          expect(seen, what).toEqual([]);
          socket.disconnect();
        }
      }
    }
  });

  it('names what is wrong: no payload is SCHEMA, two payloads are SCHEMA, an unknown event is UNKNOWN_EVENT, a frame before registering is NOT_REGISTERED', async () => {
    const { url } = await h.start('hardening-ack-codes');
    const socket = await h.open(url);
    expect(await ask(socket, 'hello')).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    const hello = { v: PROTOCOL_VERSION, publicKey: generateIdentity().publicKey };
    expect(await ask(socket, 'hello', hello, hello)).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    expect(await ask(socket, 'frame')).toMatchObject({ ok: false, error: { code: 'NOT_REGISTERED' } });
    expect(await ask(socket, 'no-such-event')).toMatchObject({ ok: false, error: { code: 'UNKNOWN_EVENT' } });
    // The same connection still works, and a good message is acknowledged as before.
    expect(await ask(socket, 'hello', hello)).toMatchObject({ ok: true });

    const miner = await h.open(url);
    await register(miner, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 });
    expect(await ask(miner, 'frame')).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    expect(await ask(miner, 'heartbeat')).toMatchObject({ ok: false, error: { code: 'SCHEMA' } });
    expect(await ask(miner, 'heartbeat', { v: PROTOCOL_VERSION, seq: 1 })).toMatchObject({ ok: true });
  });

  it('a message over its budget is refused through its callback too, with or without a payload', async () => {
    const { url } = await h.start('hardening-ack-budget', undefined, { socketRates: { hello: { max: 1, perMs: 60_000 }, other: { max: 1, perMs: 60_000 } } });
    const socket = await h.open(url);
    const seen = strays(socket);
    expect(await ask(socket, 'hello', { v: PROTOCOL_VERSION, publicKey: generateIdentity().publicKey })).toMatchObject({ ok: true });
    expect(await ask(socket, 'hello')).toMatchObject({ ok: false, error: { code: 'RATE_LIMITED' } });
    expect(await ask(socket, 'nope')).toMatchObject({ ok: false, error: { code: 'UNKNOWN_EVENT' } });
    expect(await ask(socket, 'nope', 1, 2)).toMatchObject({ ok: false, error: { code: 'RATE_LIMITED' } });
    expect(seen).toEqual([]);
  });
});
