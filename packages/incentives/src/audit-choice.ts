import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex, hexToBytes } from '@noble/hashes/utils';

/**
 * Which (miner, round) pairs are audited: decided after the round closed,
 * from a secret the coordinator committed to when the round began.
 *
 *   1. When a stage's round begins, the coordinator draws a 32-byte secret
 *      and publishes its commitment SHA-256("tah-audit-commit" ‖ secret).
 *   2. Miners work and commit to their round (receipts as they go, their
 *      weights and optimizer state with `merge-ready`).
 *   3. When the round's merge is over the coordinator reveals the secret; a
 *      miner is audited when SHA-256("tah-audit" ‖ secret ‖ stage ‖ round ‖
 *      miner), read as a number in [0, 1), is below the audit rate.
 *
 * Before the reveal no miner can tell whether its round will be audited
 * (the choice is a hash of a secret it never saw); after it anyone can check
 * the commitment and recompute every choice, so the coordinator cannot pick
 * its audits after seeing the work either.
 */
export function auditCommitment(secretHex: string): string {
  return bytesToHex(sha256(concat(new TextEncoder().encode('tah-audit-commit'), hexToBytes(secretHex))));
}

/** The audit draw of one miner's round, in [0, 1). */
export function auditDraw(secretHex: string, stage: number, round: number, minerId: string): number {
  const head = new Uint8Array(8);
  const view = new DataView(head.buffer);
  view.setUint32(0, stage, true);
  view.setUint32(4, round, true);
  const digest = sha256(concat(new TextEncoder().encode('tah-audit'), hexToBytes(secretHex), head, hexToBytes(minerId)));
  // 48 bits are plenty for any rate a run sets.
  const word = new DataView(digest.buffer, digest.byteOffset, 8);
  return (word.getUint32(0, true) * 65536 + word.getUint16(4, true)) / 2 ** 48;
}

export function isAudited(secretHex: string, stage: number, round: number, minerId: string, rate: number): boolean {
  return auditDraw(secretHex, stage, round, minerId) < rate;
}

/** A round's draw rates: its own `rate` (lowered under the validator's backlog), and `fullRate`, the run's, for the miners in `unproven` (too few audits passed yet when the round closed). */
export interface DrawRates {
  rate: number;
  fullRate?: number;
  unproven?: Iterable<string>;
}

/** The rate a miner was drawn at in a round with these rates. */
export function drawRateOf(rates: DrawRates): (minerId: string) => number {
  const unproven = new Set(rates.unproven ?? []);
  const full = Math.max(rates.rate, rates.fullRate ?? rates.rate);
  return (minerId) => (unproven.has(minerId) ? full : rates.rate);
}

/** Checks a revealed secret against its commitment and returns the miners it chose (throws on a secret that does not match). */
export function verifyAuditChoice(a: DrawRates & { commitment: string; secret: string; stage: number; round: number; miners: string[] }): string[] {
  if (auditCommitment(a.secret) !== a.commitment) throw new Error('the revealed secret does not match its commitment');
  const rateOf = drawRateOf(a);
  return a.miners.filter((m) => isAudited(a.secret, a.stage, a.round, m, rateOf(m)));
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
