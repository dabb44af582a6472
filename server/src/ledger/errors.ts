/**
 * Every refusal of the Rewards API: a named code and its HTTP status. A
 * refusal changes nothing (checks come before writes, or roll back with the
 * transaction). docs/rewards-api.md has the same table for clients.
 */
export const REWARDS_ERRORS = {
  /** The body or query does not fit the route's schema (a missing field, a wrong type, a bound). */
  BAD_REQUEST: 400,
  /** Not the SS58 address of a 32-byte key. */
  BAD_ADDRESS: 400,
  /** The message is not one this coordinator writes (title, lines, a value's format). */
  BAD_MESSAGE: 400,
  /** The signature is not 64 bytes of hex (or 65 with a key-type prefix). */
  MALFORMED_SIGNATURE: 400,
  /** The message differs from the one issued with its nonce. */
  MESSAGE_MISMATCH: 400,
  /** The nonce was never issued here for this purpose (or expired and was removed). */
  UNKNOWN_NONCE: 400,
  /** An epoch the claim names pays nothing to its address. */
  NOT_CLAIMABLE: 400,
  /** The wallet's signature does not verify for the message's address. */
  BAD_SIGNATURE: 401,
  /** The miner's signature does not verify for the message's miner. */
  BAD_MINER_SIGNATURE: 401,
  /** The signature verifies, but not as sr25519 (the only key type accepted). */
  UNSUPPORTED_KEY_TYPE: 401,
  /** The message names another coordinator's domain. */
  WRONG_DOMAIN: 403,
  /** No miner with this id has registered with this coordinator. */
  NO_SUCH_MINER: 404,
  /** The nonce was used already: the message was accepted once. */
  NONCE_USED: 409,
  /** Nothing is claimable by this address now. */
  NOTHING_TO_CLAIM: 409,
  /** An epoch the claim names was claimed meanwhile (by another claim of the same balance). */
  ALREADY_CLAIMED: 409,
  /** The signed amount is more than the claimable amount of the epochs named. */
  AMOUNT_EXCEEDS_CLAIMABLE: 409,
  /** The signed amount is less than the claimable amount of the epochs named. */
  AMOUNT_MISMATCH: 409,
  /** The message's expiry has passed. */
  EXPIRED: 410,
  /** The body is larger than the coordinator accepts. */
  BODY_TOO_LARGE: 413,
  /** The body is not JSON. */
  BAD_CONTENT_TYPE: 415,
  /** Too many requests from this IP or for this address; retry after `retryAfterMs`. */
  RATE_LIMITED: 429,
} as const;

export type RewardsErrorCode = keyof typeof REWARDS_ERRORS;

export class RewardsError extends Error {
  override name = 'RewardsError';
  constructor(
    readonly code: RewardsErrorCode,
    message: string,
  ) {
    super(message);
  }

  get status(): number {
    return REWARDS_ERRORS[this.code];
  }
}
