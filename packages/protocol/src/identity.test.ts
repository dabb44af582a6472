import { beforeAll, describe, expect, it } from 'vitest';
import { canonicalJson, cryptoReady, generateIdentity, IdentityError, newChallenge, sdpFingerprint, verifySignature } from './identity';

beforeAll(async () => {
  await cryptoReady();
});

describe('miner identity (sr25519)', () => {
  it('signs and verifies a registration challenge', () => {
    const miner = generateIdentity();
    const payload = { challenge: newChallenge(), publicKey: miner.publicKey };
    const signature = miner.sign('register', payload);
    expect(verifySignature('register', payload, signature, miner.publicKey)).toBe(true);
    expect(miner.address).toMatch(/^5[1-9A-HJ-NP-Za-km-z]{47}$/);
  });

  it('binds a signature to its purpose, payload and signer', () => {
    const miner = generateIdentity();
    const other = generateIdentity();
    const payload = { to: 'm2', kind: 'offer', payload: 'v=0', seq: 1 };
    const signature = miner.sign('signal', payload);
    expect(verifySignature('register', payload, signature, miner.publicKey)).toBe(false); // replayed for another purpose
    expect(verifySignature('signal', { ...payload, seq: 2 }, signature, miner.publicKey)).toBe(false); // changed payload
    expect(verifySignature('signal', payload, signature, other.publicKey)).toBe(false); // someone else's key
    expect(verifySignature('signal', payload, other.sign('signal', payload), miner.publicKey)).toBe(false); // forged by another
  });

  it('answers false, never throws, for malformed keys and signatures', () => {
    const miner = generateIdentity();
    const sig = miner.sign('register', { a: 1 });
    for (const [s, k] of [
      ['', miner.publicKey],
      [sig.slice(0, -2), miner.publicKey],
      [sig, '0x1234'],
      [sig, 'not hex at all'],
      [42, miner.publicKey],
    ] as Array<[unknown, unknown]>) {
      expect(verifySignature('register', { a: 1 }, s as string, k as string)).toBe(false);
    }
  });

  it('signs canonical JSON: key order does not matter, unsignable values are refused', () => {
    expect(canonicalJson({ b: 1, a: [1, { d: 2, c: 'x' }] })).toBe('{"a":[1,{"c":"x","d":2}],"b":1}');
    const miner = generateIdentity();
    expect(verifySignature('receipt', { y: 2, x: 1 }, miner.sign('receipt', { x: 1, y: 2 }), miner.publicKey)).toBe(true);
    expect(() => canonicalJson({ a: NaN })).toThrow(IdentityError);
    expect(() => canonicalJson(1n)).toThrow(IdentityError);
  });

  it('derives the same key from the same seed', () => {
    const seed = new Uint8Array(32).fill(7);
    expect(generateIdentity(seed).publicKey).toBe(generateIdentity(seed).publicKey);
    expect(() => generateIdentity(new Uint8Array(31))).toThrow(IdentityError);
  });

  it('finds the DTLS fingerprint an SDP announces', () => {
    const sdp = 'v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\na=fingerprint:sha-256 AB:CD:EF\r\na=setup:actpass\r\n';
    expect(sdpFingerprint(sdp)).toBe('sha-256 AB:CD:EF');
    expect(sdpFingerprint('v=0\r\n')).toBeUndefined();
  });
});
