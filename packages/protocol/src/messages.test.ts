import { describe, expect, it } from 'vitest';
import { MAX_EVENT_BYTES, MAX_SOCKET_MESSAGE_BYTES, parseClientMessage, ProtocolError } from './messages';

const key = '0x' + 'ab'.repeat(32);
const sig = '0x' + 'cd'.repeat(64);

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ProtocolError);
    return (e as ProtocolError).code;
  }
  return 'accepted';
}

describe('socket messages', () => {
  it('accept well-formed messages', () => {
    expect(parseClientMessage('hello', { v: 1, publicKey: key })).toEqual({ v: 1, publicKey: key });
    const register = { v: 1, publicKey: key, challenge: key, backend: 'wasm', tokensPerSec: 1200, signature: sig };
    expect(parseClientMessage('register', register)).toEqual(register);
    const loss = { v: 1, epoch: 2, activationId: 'a'.repeat(32), pathway: ['m1', 'm2', 'm3'], loss: 3.2 };
    expect(parseClientMessage('loss', loss)).toEqual(loss);
  });

  it('name each rejection', () => {
    expect(code(() => parseClientMessage('drop_tables', {}))).toBe('UNKNOWN_EVENT');
    expect(code(() => parseClientMessage('__proto__', {}))).toBe('UNKNOWN_EVENT');
    expect(code(() => parseClientMessage('hello', { v: 2, publicKey: key }))).toBe('BAD_VERSION');
    expect(code(() => parseClientMessage('hello', { v: 1, publicKey: '0x12' }))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('hello', { v: 1, publicKey: key, extra: true }))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('hello', null))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('hello', 'hello'))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('heartbeat', { v: 1, seq: -1 }))).toBe('SCHEMA');
    // A heartbeat's traffic: per kind the bytes sent and received; an unknown kind, a fraction, a negative count or a stray field is refused.
    const beat = (more: object) => ({ v: 1, seq: 0, status: { phase: 'training', tokensPerSec: 1, microbatches: 1, ...more } });
    expect(() => parseClientMessage('heartbeat', beat({ traffic: { merge: { sent: 1, received: 2 } }, trainedTokens: 5 }))).not.toThrow();
    expect(code(() => parseClientMessage('heartbeat', beat({ traffic: { gossip: { sent: 1, received: 1 } } })))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('heartbeat', beat({ traffic: { merge: { sent: 1.5, received: 1 } } })))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('heartbeat', beat({ traffic: { merge: { sent: -1, received: 1 } } })))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('heartbeat', beat({ traffic: { merge: { sent: 1, received: 1, via: 'x' } } })))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('heartbeat', beat({ trainedTokens: -3 })))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('loss', { v: 1, epoch: 0, activationId: 'z'.repeat(32), pathway: ['m'], loss: 1 }))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('loss', { v: 1, epoch: 0, activationId: 'a'.repeat(32), pathway: ['m'], loss: NaN }))).toBe('SCHEMA');
    expect(code(() => parseClientMessage('signal', { v: 1, to: 'm', kind: 'offer', payload: 'x'.repeat(MAX_SOCKET_MESSAGE_BYTES), seq: 0, signature: sig }))).toBe('TOO_LARGE');
    // Each event has its own bound: a heartbeat padded to 1 KiB is refused before its schema is read.
    expect(code(() => parseClientMessage('heartbeat', { v: 1, seq: 0, pad: 'x'.repeat(MAX_EVENT_BYTES.heartbeat!) }))).toBe('TOO_LARGE');
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(code(() => parseClientMessage('hello', cyclic))).toBe('SCHEMA');
  });
});
