import { decodeAddress, encodeAddress } from '@polkadot/util-crypto';
import { SS58_PREFIX } from './identity';

/**
 * The messages a wallet signs for the Rewards API (docs/rewards-api.md). The
 * coordinator writes them, the wallet signs them verbatim, the coordinator
 * parses them back. Plain text, one `key: value` per line in a fixed order:
 * what a person reads in the extension's signing prompt is exactly what they
 * agree to, and the parser accepts only what the writer writes (a parsed
 * message formats back to the same text, byte for byte).
 */

export const LINK_TITLE = 'Train at Home: link a payout address';
export const CLAIM_TITLE = 'Train at Home: claim rewards';
/** No message is longer: a claim of MAX_CLAIM_EPOCHS epochs of the largest ids fits with room to spare. */
export const MAX_REWARDS_MESSAGE_CHARS = 8192;
/** One claim covers at most this many epochs (the oldest claimable first); a larger balance takes more claims. */
export const MAX_CLAIM_EPOCHS = 256;
/** Amounts are PostgreSQL bigints of base units. */
export const MAX_AMOUNT = 2n ** 63n - 1n;
const MAX_INT4 = 2 ** 31 - 1;

export interface LinkMessage {
  kind: 'link';
  domain: string;
  /** The miner's public key: 0x and 64 lower-case hex digits. */
  minerId: string;
  /** The wallet's SS58 address, in the generic format (prefix 42). */
  address: string;
  nonce: string;
  /** ISO 8601, milliseconds, UTC. */
  expires: string;
}

export interface ClaimMessage {
  kind: 'claim';
  domain: string;
  address: string;
  /** Base units: the sum of the epochs' payouts to the address. */
  amount: bigint;
  /** Ascending by (run, epoch), no repeats. */
  epochs: Array<{ runId: number; epoch: number }>;
  nonce: string;
  expires: string;
}

export type RewardsMessage = LinkMessage | ClaimMessage;

export type RewardsMessageErrorCode =
  /** Not a message this protocol writes (title, keys, order, or a value's format). */
  | 'BAD_MESSAGE'
  /** Not the SS58 address of a 32-byte key (characters, length or checksum). */
  | 'BAD_ADDRESS';

export class RewardsMessageError extends Error {
  override name = 'RewardsMessageError';
  constructor(
    readonly code: RewardsMessageErrorCode,
    message: string,
  ) {
    super(message);
  }
}

const SS58 = /^[1-9A-HJ-NP-Za-km-z]{40,60}$/;
const MINER = /^0x[0-9a-f]{64}$/;
const NONCE = /^0x[0-9a-f]{64}$/;
const DOMAIN = /^[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?(?::[0-9]{1,5})?$/;
const ISO_MS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const AMOUNT = /^[1-9][0-9]{0,18}$/;
const RUN_EPOCH = /^([1-9][0-9]{0,9}):(0|[1-9][0-9]{0,9})$/;

/**
 * An SS58 address in the generic format (prefix 42), whatever format it came in:
 * one key, one spelling, so payouts, links and claims of a wallet always meet.
 * Only 32-byte keys (sr25519, ed25519); throws BAD_ADDRESS otherwise.
 */
export function canonicalAddress(address: unknown): string {
  if (typeof address !== 'string' || !SS58.test(address)) throw new RewardsMessageError('BAD_ADDRESS', 'not an SS58 address');
  let key: Uint8Array;
  try {
    key = decodeAddress(address);
  } catch {
    throw new RewardsMessageError('BAD_ADDRESS', 'not a valid SS58 address (checksum or length)');
  }
  if (key.length !== 32) throw new RewardsMessageError('BAD_ADDRESS', 'not the address of a 32-byte public key');
  return encodeAddress(key, SS58_PREFIX);
}

/** A coordinator's domain as messages name it: a lower-case host name, with a port if any. */
export function isRewardsDomain(value: unknown): value is string {
  return typeof value === 'string' && DOMAIN.test(value);
}

export function formatRewardsMessage(m: RewardsMessage): string {
  const lines =
    m.kind === 'link'
      ? [LINK_TITLE, `domain: ${m.domain}`, `miner: ${m.minerId}`, `address: ${m.address}`, `nonce: ${m.nonce}`, `expires: ${m.expires}`]
      : [
          CLAIM_TITLE,
          `domain: ${m.domain}`,
          `address: ${m.address}`,
          `amount: ${m.amount}`,
          `epochs: ${m.epochs.map((e) => `${e.runId}:${e.epoch}`).join(',')}`,
          `nonce: ${m.nonce}`,
          `expires: ${m.expires}`,
        ];
  return lines.join('\n');
}

const bad = (message: string): RewardsMessageError => new RewardsMessageError('BAD_MESSAGE', message);

/**
 * Parses a link or claim message; throws RewardsMessageError (BAD_MESSAGE or
 * BAD_ADDRESS) for anything else. It checks form only: whether the domain is
 * this coordinator's, the nonce was issued and the time has not passed is the
 * coordinator's business.
 */
export function parseRewardsMessage(text: unknown): RewardsMessage {
  if (typeof text !== 'string' || text.length > MAX_REWARDS_MESSAGE_CHARS) throw bad(`a message is a string of at most ${MAX_REWARDS_MESSAGE_CHARS} characters`);
  const [title, ...lines] = text.split('\n');
  const keys = title === LINK_TITLE ? ['domain', 'miner', 'address', 'nonce', 'expires'] : title === CLAIM_TITLE ? ['domain', 'address', 'amount', 'epochs', 'nonce', 'expires'] : null;
  if (!keys) throw bad(`the first line must be "${LINK_TITLE}" or "${CLAIM_TITLE}"`);
  if (lines.length !== keys.length) throw bad(`expected the lines ${keys.join(', ')} after the title`);
  const v: Record<string, string> = {};
  keys.forEach((key, i) => {
    const prefix = `${key}: `;
    if (!lines[i]!.startsWith(prefix)) throw bad(`line ${i + 2} must start with "${prefix}"`);
    v[key] = lines[i]!.slice(prefix.length);
  });
  if (!DOMAIN.test(v.domain!)) throw bad('domain is not a lower-case host name');
  const address = canonicalAddress(v.address);
  if (address !== v.address) throw bad(`address must be in the generic SS58 format (${address})`);
  if (!NONCE.test(v.nonce!)) throw bad('nonce must be 0x and 64 lower-case hex digits');
  if (!ISO_MS.test(v.expires!) || Number.isNaN(Date.parse(v.expires!)) || new Date(v.expires!).toISOString() !== v.expires) throw bad('expires must be an ISO 8601 UTC time with milliseconds');
  const common = { domain: v.domain!, address, nonce: v.nonce!, expires: v.expires! };
  const message: RewardsMessage =
    title === LINK_TITLE ? { kind: 'link', ...common, minerId: miner(v.miner!) } : { kind: 'claim', ...common, amount: amount(v.amount!), epochs: epochs(v.epochs!) };
  // Everything above is strict, so this holds; it stays as the definition of "only what the writer writes".
  if (formatRewardsMessage(message) !== text) throw bad('not in canonical form');
  return message;
}

function miner(value: string): string {
  if (!MINER.test(value)) throw bad('miner must be 0x and 64 lower-case hex digits');
  return value;
}

function amount(value: string): bigint {
  if (!AMOUNT.test(value) || BigInt(value) > MAX_AMOUNT) throw bad('amount must be a positive integer of base units below 2^63');
  return BigInt(value);
}

function epochs(value: string): Array<{ runId: number; epoch: number }> {
  const parts = value.split(',');
  if (parts.length > MAX_CLAIM_EPOCHS) throw bad(`a claim covers at most ${MAX_CLAIM_EPOCHS} epochs`);
  const out = parts.map((part) => {
    const m = RUN_EPOCH.exec(part);
    if (!m || Number(m[1]) > MAX_INT4 || Number(m[2]) > MAX_INT4) throw bad(`epoch "${part.slice(0, 24)}" is not <run>:<epoch>`);
    return { runId: Number(m[1]), epoch: Number(m[2]) };
  });
  for (let i = 1; i < out.length; i++) {
    const [a, b] = [out[i - 1]!, out[i]!];
    if (a.runId > b.runId || (a.runId === b.runId && a.epoch >= b.epoch)) throw bad('epochs must be in ascending order, each once');
  }
  return out;
}
