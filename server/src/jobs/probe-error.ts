/** A miner's probe upload refused by name (a 4xx): a probe never sent, another miner's, bytes not the confirmed payload, or too large. */
export class ProbeError extends Error {
  override name = 'ProbeError';
  constructor(
    readonly code: 'NO_SUCH_PROBE' | 'NOT_YOUR_PROBE' | 'HASH_MISMATCH' | 'TOO_LARGE',
    /** The refusal without its code (what a reply's `message` carries beside `code`). */
    readonly detail: string,
  ) {
    super(`${code}: ${detail}`);
  }
}
