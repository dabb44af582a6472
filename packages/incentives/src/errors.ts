/**
 * One named error for the whole package. Every rejection is checked before
 * anything is computed, so a caller that catches an IncentivesError knows no
 * partial result exists; the `code` says which rule the input broke, so the
 * coordinator can log it (or show it) without parsing the message.
 */

export type IncentivesErrorCode =
  /** No observations, no payouts, or another list that must not be empty. */
  | 'EMPTY'
  /** Pathways of different lengths: a microbatch must cross every stage. */
  | 'RAGGED_PATHWAY'
  /** A pathway entry that is not a non-empty string. */
  | 'BAD_PATHWAY'
  /** NaN or ±Infinity where a finite number is required. */
  | 'NON_FINITE'
  /** An option outside its documented range. */
  | 'BAD_OPTION'
  /** A negative or non-finite score, or one too large to scale exactly. */
  | 'BAD_SCORE'
  /** A negative emission. */
  | 'BAD_EMISSION'
  /** An account that is not a non-empty string. */
  | 'BAD_ACCOUNT'
  /** The same account twice where each must be unique (Merkle leaves). */
  | 'DUPLICATE_ACCOUNT'
  /** The same miner twice in one epoch's evidence. */
  | 'DUPLICATE_MINER'
  /** An amount below zero or above uint256. */
  | 'BAD_AMOUNT'
  /** Vectors that must have the same length do not. */
  | 'LENGTH_MISMATCH'
  /** Evidence with a negative work count or a non-finite quality. */
  | 'BAD_EVIDENCE'
  /** A numerical step failed (a matrix that should be positive definite is not). */
  | 'NUMERICAL';

export class IncentivesError extends Error {
  override name = 'IncentivesError';
  constructor(
    readonly code: IncentivesErrorCode,
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}
