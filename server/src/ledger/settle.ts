import { IncentivesError, payoutTree, verifyPayout } from '@train-at-home/incentives';
import type { Database, Queryable } from '../db/database';
import { MAX_EPOCH } from './epochs';

/**
 * Settling an emission epoch: the validator's scores and the split of the
 * epoch's emission over payout accounts become rows of `settlements`,
 * `scores` and `payouts`, in one transaction, once.
 *
 * The ledger's rules (TigerBeetle's, for a ledger that only credits):
 * - amounts are integers of base units end to end (bigint here, int8 in the
 *   database, decimal strings on the wire); nothing goes through a float;
 * - the settlement row is the idempotency key: (run, epoch) is its primary
 *   key, and whoever inserts it writes the epoch's rows; everyone else
 *   changes nothing and hears `settled: false`;
 * - the input is checked whole before anything is written (sum of payouts =
 *   allocated ≤ emission, accounts unique, proofs that verify against the
 *   root), and the sum is checked again in SQL before the commit;
 * - rows are never updated: a balance is a sum of payouts.
 */

export interface SettlementInput {
  runId: number;
  epoch: number;
  startsAt: Date;
  endsAt: Date;
  /** Base units emitted this epoch. */
  emission: bigint;
  /** What splitEmission allocated, when the caller has it: must equal the sum of the payouts. */
  allocated?: bigint;
  scores: Array<{ minerId: string; stage: number | null; account: string; work: number; quality: number; score: number; flagged: boolean; breakdown: object }>;
  /** One per account; `miners` are the scored miners whose earnings go to it. */
  payouts: Array<{ account: string; amount: bigint; miners: string[]; proof: string[] }>;
  /** The payouts' Merkle root (OpenZeppelin StandardMerkleTree of [account, amount]); null when nobody is paid. */
  merkleRoot: string | null;
}

export type LedgerErrorCode =
  /** The input is inconsistent (sums, signs, duplicates, proofs, formats); nothing was written. */
  | 'BAD_SETTLEMENT'
  /** The run named by the input does not exist; nothing was written. */
  | 'NO_SUCH_RUN';

export class LedgerError extends Error {
  override name = 'LedgerError';
  constructor(
    readonly code: LedgerErrorCode,
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

/** A miner's id: its sr25519 public key in hex. */
export const MINER_ID = /^[0-9a-f]{64}$/;
/** A payout account: an SS58 address a miner linked, else its miner id. */
export const ACCOUNT = /^(?:[1-9A-HJ-NP-Za-km-z]{40,60}|[0-9a-f]{64})$/;
/** A Merkle root or proof node: 32 bytes, lower-case hex (as the Merkle library writes them). */
export const HASH32 = /^0x[0-9a-f]{64}$/;
/** int8's largest value: no amount or sum may exceed it. */
const MAX_INT8 = 2n ** 63n - 1n;
const MAX_INT4 = 2 ** 31 - 1;

export interface SettleFaults {
  /** Called after the n-th payout row (1-based) is written, inside the transaction; a throw rolls it all back. */
  afterRow?: (n: number) => void | Promise<void>;
}

/**
 * Writes one epoch's settlement, scores and payouts in one transaction.
 * `settled: false` means the epoch was settled already (by this call's twin,
 * or earlier) and nothing changed. Throws LedgerError before writing anything
 * when the input is inconsistent.
 */
export async function settleEpoch(db: Database, input: SettlementInput, faults: SettleFaults = {}): Promise<{ settled: boolean }> {
  const allocated = checkSettlement(input);
  const { runId, epoch } = input;
  try {
    return await db.transaction(async (tx) => {
      const run = await tx.query('SELECT 1 FROM runs WHERE id = $1', [runId]);
      if (run.length === 0) throw new LedgerError('NO_SUCH_RUN', `run ${runId}`);
      // The idempotency key. On PostgreSQL a racing twin blocks here until the first commits
      // (then inserts nothing) or rolls back (then inserts): READ COMMITTED never errors on it.
      const inserted = await tx.query(
        `INSERT INTO settlements (run_id, epoch, starts_at, ends_at, emission, allocated, merkle_root)
         VALUES ($1, $2, $3, $4, $5::bigint, $6::bigint, $7)
         ON CONFLICT (run_id, epoch) DO NOTHING RETURNING 1`,
        [runId, epoch, input.startsAt.toISOString(), input.endsAt.toISOString(), input.emission.toString(), allocated.toString(), input.merkleRoot],
      );
      if (inserted.length === 0) return { settled: false };
      await writeScores(tx, input);
      let n = 0;
      for (const p of input.payouts) {
        await tx.query(`INSERT INTO payouts (run_id, epoch, account, amount, miners, proof) VALUES ($1, $2, $3, $4::bigint, $5::jsonb, $6::jsonb)`, [
          runId,
          epoch,
          p.account,
          p.amount.toString(),
          JSON.stringify(p.miners),
          JSON.stringify(p.proof),
        ]);
        await faults.afterRow?.(++n);
      }
      // The rows as stored must add up to what the settlement says was allocated.
      const [sum] = await tx.query<{ total: string }>(`SELECT coalesce(sum(amount), 0)::text AS total FROM payouts WHERE run_id = $1 AND epoch = $2`, [runId, epoch]);
      if (BigInt(sum!.total) !== allocated) throw new LedgerError('BAD_SETTLEMENT', `stored payouts sum to ${sum!.total}, not ${allocated}`);
      return { settled: true };
    });
  } catch (e) {
    // Under SERIALIZABLE (an operator's default_transaction_isolation) the twin that loses the race
    // gets a serialization failure instead: it lost to a settlement that did commit.
    if (isRaceLoss(e) && (await isSettled(db, runId, epoch))) return { settled: false };
    throw e;
  }
}

/** The epochs of a run that are settled, in order. */
export async function settledEpochs(db: Queryable, runId: number): Promise<number[]> {
  const rows = await db.query<{ epoch: number }>('SELECT epoch FROM settlements WHERE run_id = $1 ORDER BY epoch', [runId]);
  return rows.map((r) => Number(r.epoch));
}

async function isSettled(db: Queryable, runId: number, epoch: number): Promise<boolean> {
  return (await db.query('SELECT 1 FROM settlements WHERE run_id = $1 AND epoch = $2', [runId, epoch])).length > 0;
}

function isRaceLoss(e: unknown): boolean {
  const code = (e as { code?: unknown } | null)?.code;
  return code === '40001' || code === '23505';
}

async function writeScores(tx: Queryable, input: SettlementInput): Promise<void> {
  if (input.scores.length === 0) return;
  // One statement for all of them: the rows travel as one JSON array.
  const rows = input.scores.map((s) => ({
    miner_id: s.minerId,
    stage: s.stage,
    account: s.account,
    work: s.work,
    quality: s.quality,
    score: s.score,
    flagged: s.flagged,
    breakdown: s.breakdown,
  }));
  await tx.query(
    `INSERT INTO scores (run_id, epoch, miner_id, stage, account, work, quality, score, flagged, breakdown)
     SELECT $1, $2, r.miner_id, r.stage, r.account, r.work, r.quality, r.score, r.flagged, r.breakdown
     FROM jsonb_to_recordset($3::jsonb) AS r(miner_id text, stage integer, account text, work integer, quality double precision, score double precision, flagged boolean, breakdown jsonb)`,
    [input.runId, input.epoch, JSON.stringify(rows)],
  );
}

function bad(message: string): LedgerError {
  return new LedgerError('BAD_SETTLEMENT', message);
}

/** Checks the whole input and returns the allocated sum; throws BAD_SETTLEMENT on the first problem. */
export function checkSettlement(input: SettlementInput): bigint {
  const { runId, epoch, startsAt, endsAt, emission, scores, payouts, merkleRoot } = input;
  if (!Number.isInteger(runId) || runId <= 0 || runId > MAX_INT4) throw bad(`run id ${runId}`);
  if (!Number.isInteger(epoch) || epoch < 0 || epoch > MAX_EPOCH) throw bad(`epoch ${epoch} is not an integer in 0…${MAX_EPOCH}`);
  if (!(startsAt instanceof Date) || !(endsAt instanceof Date) || !(startsAt.getTime() < endsAt.getTime())) throw bad('the epoch must start before it ends');
  if (typeof emission !== 'bigint' || emission < 0n || emission > MAX_INT8) throw bad(`emission ${String(emission)} is not a bigint in 0…2^63−1`);
  if (!Array.isArray(scores) || !Array.isArray(payouts)) throw bad('scores and payouts must be arrays');

  const accountOf = new Map<string, string>();
  for (const s of scores) {
    if (typeof s.minerId !== 'string' || !MINER_ID.test(s.minerId)) throw bad(`miner id ${String(s.minerId)}`);
    if (accountOf.has(s.minerId)) throw bad(`miner ${s.minerId} is scored twice`);
    if (typeof s.account !== 'string' || !ACCOUNT.test(s.account)) throw bad(`account ${String(s.account)} of miner ${s.minerId}`);
    accountOf.set(s.minerId, s.account);
    if (s.stage !== null && !(Number.isInteger(s.stage) && s.stage >= 0 && s.stage <= MAX_INT4)) throw bad(`stage ${s.stage} of miner ${s.minerId}`);
    if (!Number.isInteger(s.work) || s.work < 0 || s.work > MAX_INT4) throw bad(`work ${s.work} of miner ${s.minerId}`);
    if (typeof s.quality !== 'number' || !(s.quality >= 0 && s.quality <= 1)) throw bad(`quality ${s.quality} of miner ${s.minerId} is not in [0, 1]`);
    if (typeof s.score !== 'number' || !Number.isFinite(s.score) || s.score < 0) throw bad(`score ${s.score} of miner ${s.minerId}`);
    if (typeof s.flagged !== 'boolean') throw bad(`flagged of miner ${s.minerId} is not a boolean`);
    // A flagged miner's quality is zero (migration 6), so it earns nothing.
    if (s.flagged && (s.quality !== 0 || s.score !== 0)) throw bad(`miner ${s.minerId} is flagged but has quality ${s.quality}, score ${s.score}`);
    if (typeof s.breakdown !== 'object' || s.breakdown === null || Array.isArray(s.breakdown)) throw bad(`breakdown of miner ${s.minerId} is not an object`);
    try {
      JSON.stringify(s.breakdown);
    } catch {
      throw bad(`breakdown of miner ${s.minerId} is not JSON`);
    }
  }

  let sum = 0n;
  const accounts = new Set<string>();
  const paidMiners = new Set<string>();
  for (const p of payouts) {
    if (typeof p.account !== 'string' || !ACCOUNT.test(p.account)) throw bad(`payout account ${String(p.account)}`);
    if (accounts.has(p.account)) throw bad(`account ${p.account} is paid twice`);
    accounts.add(p.account);
    if (typeof p.amount !== 'bigint' || p.amount <= 0n) throw bad(`amount ${String(p.amount)} to ${p.account} is not a positive bigint`);
    sum += p.amount;
    if (!Array.isArray(p.miners) || p.miners.length === 0) throw bad(`payout to ${p.account} names no miners`);
    for (const m of p.miners) {
      if (accountOf.get(m) !== p.account) throw bad(`payout to ${p.account} names miner ${String(m)}, which is not scored with that account`);
      if (paidMiners.has(m)) throw bad(`miner ${m} is in two payouts`);
      paidMiners.add(m);
    }
    if (!Array.isArray(p.proof) || !p.proof.every((h) => typeof h === 'string' && HASH32.test(h))) throw bad(`proof of ${p.account} is not an array of 0x-prefixed 32-byte hex strings`);
  }
  if (input.allocated !== undefined && input.allocated !== sum) throw bad(`payouts sum to ${sum}, not the allocated ${String(input.allocated)}`);
  if (sum > emission) throw bad(`payouts sum to ${sum}, more than the emission ${emission}`);

  if (payouts.length === 0) {
    if (merkleRoot !== null) throw bad('a Merkle root without payouts');
    return sum;
  }
  if (typeof merkleRoot !== 'string' || !HASH32.test(merkleRoot)) throw bad(`Merkle root ${String(merkleRoot)}`);
  // The root must commit to exactly these payouts, and each stored proof must prove its payout.
  let tree: { root: string };
  try {
    tree = payoutTree(payouts.map((p) => ({ account: p.account, amount: p.amount })));
  } catch (e) {
    if (e instanceof IncentivesError) throw bad(`no payout tree: ${e.message}`);
    throw e;
  }
  if (tree.root !== merkleRoot) throw bad(`Merkle root ${merkleRoot} is not the root of these payouts (${tree.root})`);
  for (const p of payouts) {
    if (!verifyPayout(merkleRoot, p.account, p.amount, p.proof)) throw bad(`the proof of ${p.account} does not verify against the root`);
  }
  return sum;
}
