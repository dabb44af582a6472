import { hexToU8a, u8aToHex } from '@polkadot/util';
import { cryptoWaitReady, encodeAddress, randomAsU8a, sr25519PairFromSeed, sr25519Sign, sr25519Verify } from '@polkadot/util-crypto';

/**
 * Miner identity: an sr25519 key pair the miner generates itself. Every
 * signature covers a domain-separated, canonical string, so a signature made
 * for one purpose (a registration challenge) can never be replayed for
 * another (a WebRTC offer).
 */
export const SIGNING_DOMAIN = 'train-at-home/v1';
/** SS58 prefix 42: the generic Substrate address format. */
export const SS58_PREFIX = 42;

/** 'payout-link': the miner agrees that its earnings go to a wallet (over { message }, the wallet's link message). */
export type SignaturePurpose = 'register' | 'signal' | 'receipt' | 'checkpoint' | 'payout-link' | 'audit';

export interface Identity {
  /** 0x-prefixed hex of the 32-byte sr25519 public key. */
  publicKey: string;
  /** SS58 address of the public key (what people see). */
  address: string;
  sign(purpose: SignaturePurpose, payload: unknown): string;
}

export class IdentityError extends Error {
  override name = 'IdentityError';
}

/** Resolves once the WASM crypto (sr25519) is loaded; call before generating or verifying. */
export function cryptoReady(): Promise<boolean> {
  return cryptoWaitReady();
}

export function generateIdentity(seed: Uint8Array = randomAsU8a(32)): Identity {
  if (seed.length !== 32) throw new IdentityError('an sr25519 seed is 32 bytes');
  const pair = sr25519PairFromSeed(seed);
  const publicKey = u8aToHex(pair.publicKey);
  return {
    publicKey,
    address: encodeAddress(pair.publicKey, SS58_PREFIX),
    sign: (purpose, payload) => u8aToHex(sr25519Sign(signingBytes(purpose, payload), pair)),
  };
}

/** Checks a signature; false (never a throw) for anything malformed. */
export function verifySignature(purpose: SignaturePurpose, payload: unknown, signature: string, publicKey: string): boolean {
  if (!isHex(signature, 64) || !isHex(publicKey, 32)) return false;
  try {
    return sr25519Verify(signingBytes(purpose, payload), hexToU8a(signature), hexToU8a(publicKey));
  } catch {
    return false;
  }
}

export function isHex(value: unknown, bytes: number): value is string {
  return typeof value === 'string' && value.length === 2 + 2 * bytes && /^0x[0-9a-f]+$/i.test(value);
}

/** The exact bytes signed: domain, purpose and the payload as canonical JSON (keys sorted). */
export function signingBytes(purpose: SignaturePurpose, payload: unknown): Uint8Array {
  return new TextEncoder().encode(`${SIGNING_DOMAIN}:${purpose}:${canonicalJson(payload)}`);
}

export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') {
    if (typeof value === 'number' && !Number.isFinite(value)) throw new IdentityError('cannot sign a non-finite number');
    if (value === undefined || typeof value === 'function' || typeof value === 'symbol' || typeof value === 'bigint') {
      throw new IdentityError(`cannot sign a ${typeof value}`);
    }
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, v]) => v !== undefined)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
}

/** A fresh registration challenge: 32 random bytes, as hex. */
export function newChallenge(): string {
  return u8aToHex(randomAsU8a(32));
}

/**
 * The DTLS fingerprint inside an SDP offer or answer. Signing the SDP binds
 * this fingerprint to the miner's key: whoever completes the DTLS handshake
 * holds the certificate that the registered miner announced.
 */
export function sdpFingerprint(sdp: string): string | undefined {
  return /^a=fingerprint:(\S+ \S+)\s*$/m.exec(sdp)?.[1];
}
