import { MAX_AMOUNT, MAX_CLAIM_EPOCHS, type ClaimMessage } from '@train-at-home/protocol';
import { retryRaceLoss, type Database, type Queryable } from '../db/database';
import { RewardsError } from './errors';
import { consumeNonce } from './nonces';
import { baseUnits, iso } from './queries';

/**
 * Claims: the ledger's debits, in the same rules as its credits (settle.ts).
 * - A claim takes the whole payout of each epoch it names; amounts are bigint
 *   base units, summed from the payouts, never from what the client says.
 * - One transaction: the nonce is consumed, the epochs are checked
 *   claimable and the amount equal to their sum, the claimed items are
 *   written (their primary key (run, epoch, account) makes a second claim of
 *   a payout impossible, whatever races above it), the payout sink runs, and
 *   the claim row is written. Any refusal rolls it all back: nothing changed.
 * - Rows are never updated (the nonce's used_at aside): a balance is the
 *   sum of payouts minus the sum of claimed items, and the transaction checks
 *   before it commits that the second never exceeds the first.
 */

export interface ClaimedEpoch {
  runId: number;
  epoch: number;
  amount: bigint;
}

export interface Claim {
  id: number;
  address: string;
  amount: bigint;
  epochs: ClaimedEpoch[];
  nonce: string;
  claimedAt: Date;
}

/** What the payout sink did, stored with the claim (JSON). */
export type PayoutRecord = { method: string } & Record<string, unknown>;

/**
 * Where a claim's money goes. `pay` runs inside the claim's transaction, after
 * the claimed items are written (a double claim has failed by then) and before
 * the claim row is; a throw rolls the whole claim back. See the README for what
 * a chain transfer plugs in here.
 */
export interface PayoutSink {
  pay(claim: Claim, tx: Queryable): Promise<PayoutRecord>;
}

/** The default: the claim row is the payout, recorded in this ledger; nothing leaves it. */
export const ledgerPayoutSink: PayoutSink = {
  async pay() {
    return { method: 'ledger', status: 'recorded' };
  },
};

export interface Receipt {
  id: number;
  address: string;
  amount: string;
  epochs: Array<{ runId: number; epoch: number; amount: string }>;
  claimedAt: string;
  payout: PayoutRecord;
}

/** What `address` can claim now, oldest epochs first: at most MAX_CLAIM_EPOCHS, and a sum that fits a bigint. */
export async function claimable(db: Queryable, address: string): Promise<{ amount: bigint; epochs: ClaimedEpoch[] }> {
  const rows = await db.query<{ run_id: number; epoch: number; amount: string }>(
    `SELECT p.run_id, p.epoch, p.amount::text AS amount FROM payouts p
     WHERE p.account = $1 AND NOT EXISTS (SELECT 1 FROM claimed_items c WHERE c.run_id = p.run_id AND c.epoch = p.epoch AND c.account = p.account)
     ORDER BY p.run_id, p.epoch LIMIT $2`,
    [address, MAX_CLAIM_EPOCHS],
  );
  let amount = 0n;
  const epochs: ClaimedEpoch[] = [];
  for (const r of rows) {
    const a = baseUnits(r.amount);
    if (amount + a > MAX_AMOUNT) break;
    amount += a;
    epochs.push({ runId: Number(r.run_id), epoch: Number(r.epoch), amount: a });
  }
  return { amount, epochs };
}

/**
 * Executes a signed claim (its signature already checked) in one transaction,
 * or refuses it by name having changed nothing. `text` is the message as signed.
 */
export async function executeClaim(db: Database, m: ClaimMessage, text: string, sink: PayoutSink, now: Date): Promise<Receipt> {
  return retryRaceLoss(() =>
    db.transaction(async (tx) => {
      const issued = await consumeNonce(tx, m.nonce, 'claim', now);
      const epochs = await checkClaimable(tx, m);
      // The checks above name what is wrong with a changed amount or epoch list; this catches any other change.
      if (issued.message !== text || issued.address !== m.address) throw new RewardsError('MESSAGE_MISMATCH', 'the message differs from the one issued with its nonce');
      const [next] = await tx.query<{ id: number }>(`SELECT nextval(pg_get_serial_sequence('claims', 'id'))::int AS id`);
      const claim: Claim = { id: Number(next!.id), address: m.address, amount: m.amount, epochs, nonce: m.nonce, claimedAt: now };
      await writeClaimedItems(tx, claim);
      const payout = await sink.pay(claim, tx);
      const stored = claim.epochs.map((e) => ({ runId: e.runId, epoch: e.epoch, amount: e.amount.toString() }));
      await tx.query(`INSERT INTO claims (id, address, amount, epochs, nonce, created_at, payout) VALUES ($1, $2, $3::bigint, $4::jsonb, $5, $6, $7::jsonb)`, [
        claim.id,
        claim.address,
        claim.amount.toString(),
        JSON.stringify(stored),
        claim.nonce,
        now.toISOString(),
        JSON.stringify(payout),
      ]);
      await checkBalance(tx, claim);
      return { id: claim.id, address: claim.address, amount: claim.amount.toString(), epochs: stored, claimedAt: now.toISOString(), payout };
    }),
  );
}

/** The payouts the claim names, each unclaimed, adding up to exactly the signed amount. */
async function checkClaimable(tx: Queryable, m: ClaimMessage): Promise<ClaimedEpoch[]> {
  const rows = await tx.query<{ run_id: number; epoch: number; amount: string | null; claimed: boolean }>(
    `SELECT e.run_id, e.epoch, p.amount::text AS amount, c.claim_id IS NOT NULL AS claimed
     FROM jsonb_to_recordset($2::jsonb) AS e(run_id integer, epoch integer)
     LEFT JOIN payouts p ON p.run_id = e.run_id AND p.epoch = e.epoch AND p.account = $1
     LEFT JOIN claimed_items c ON c.run_id = e.run_id AND c.epoch = e.epoch AND c.account = $1
     ORDER BY e.run_id, e.epoch`,
    [m.address, JSON.stringify(m.epochs.map((e) => ({ run_id: e.runId, epoch: e.epoch })))],
  );
  const missing = rows.find((r) => r.amount === null);
  if (missing) throw new RewardsError('NOT_CLAIMABLE', `epoch ${missing.run_id}:${missing.epoch} pays nothing to ${m.address}`);
  const claimed = rows.find((r) => r.claimed);
  if (claimed) throw new RewardsError('ALREADY_CLAIMED', `epoch ${claimed.run_id}:${claimed.epoch} was claimed already`);
  const epochs = rows.map((r) => ({ runId: Number(r.run_id), epoch: Number(r.epoch), amount: baseUnits(r.amount) }));
  const sum = epochs.reduce((s, e) => s + e.amount, 0n);
  if (m.amount > sum) throw new RewardsError('AMOUNT_EXCEEDS_CLAIMABLE', `the message claims ${m.amount}; its epochs hold ${sum}`);
  if (m.amount !== sum) throw new RewardsError('AMOUNT_MISMATCH', `the message claims ${m.amount}; its epochs hold ${sum}`);
  return epochs;
}

/**
 * The double-pay guard. Under PostgreSQL a racing claim of the same payout waits
 * here for the first to commit, then inserts nothing and is refused.
 */
async function writeClaimedItems(tx: Queryable, claim: Claim): Promise<void> {
  const items = claim.epochs.map((e) => ({ run_id: e.runId, epoch: e.epoch, amount: e.amount.toString() }));
  const inserted = await tx.query(
    `INSERT INTO claimed_items (run_id, epoch, account, amount, claim_id)
     SELECT e.run_id, e.epoch, $1, e.amount, $3 FROM jsonb_to_recordset($2::jsonb) AS e(run_id integer, epoch integer, amount bigint)
     ORDER BY e.run_id, e.epoch
     ON CONFLICT (run_id, epoch, account) DO NOTHING RETURNING 1`,
    [claim.address, JSON.stringify(items), claim.id],
  );
  if (inserted.length !== items.length) throw new RewardsError('ALREADY_CLAIMED', 'another claim took some of these epochs first');
}

/** The ledger's invariant, checked in SQL before the commit: claimed ≤ settled, and the claim is the sum of its items. */
async function checkBalance(tx: Queryable, claim: Claim): Promise<void> {
  const [row] = await tx.query<{ settled: string; claimed: string; items: string }>(
    `SELECT (SELECT coalesce(sum(amount), 0) FROM payouts WHERE account = $1)::text AS settled,
            (SELECT coalesce(sum(amount), 0) FROM claimed_items WHERE account = $1)::text AS claimed,
            (SELECT coalesce(sum(amount), 0) FROM claimed_items WHERE claim_id = $2)::text AS items`,
    [claim.address, claim.id],
  );
  if (baseUnits(row!.items) !== claim.amount || baseUnits(row!.claimed) > baseUnits(row!.settled)) {
    throw new Error(`ledger invariant broken for ${claim.address}: settled ${row!.settled}, claimed ${row!.claimed}, claim ${claim.amount} of items ${row!.items}`);
  }
}

/** Everything `address` was paid and claimed, with each epoch's proof; epochs newest first, by pages. */
export async function balance(db: Queryable, address: string, limit: number, before: { runId: number; epoch: number } | null) {
  const [totals] = await db.query<{ settled: string; claimed: string }>(
    `SELECT (SELECT coalesce(sum(amount), 0) FROM payouts WHERE account = $1)::text AS settled,
            (SELECT coalesce(sum(amount), 0) FROM claimed_items WHERE account = $1)::text AS claimed`,
    [address],
  );
  const rows = await db.query<{ run_id: number; epoch: number; settled: string; claimed: string; merkle_root: string; proof: string[] }>(
    `SELECT p.run_id, p.epoch, p.amount::text AS settled, coalesce(c.amount, 0)::text AS claimed, s.merkle_root, p.proof
     FROM payouts p JOIN settlements s ON s.run_id = p.run_id AND s.epoch = p.epoch
     LEFT JOIN claimed_items c ON c.run_id = p.run_id AND c.epoch = p.epoch AND c.account = p.account
     WHERE p.account = $1 AND ($2::int IS NULL OR (p.run_id, p.epoch) < ($2::int, $3::int))
     ORDER BY p.run_id DESC, p.epoch DESC LIMIT $4`,
    [address, before?.runId ?? null, before?.epoch ?? null, limit + 1],
  );
  const page = rows.slice(0, limit);
  const settled = baseUnits(totals!.settled);
  const claimed = baseUnits(totals!.claimed);
  const last = page[page.length - 1];
  return {
    totals: { settled: settled.toString(), claimed: claimed.toString(), claimable: (settled - claimed).toString() },
    epochs: page.map((r) => {
      const [s, c] = [baseUnits(r.settled), baseUnits(r.claimed)];
      return { runId: Number(r.run_id), epoch: Number(r.epoch), settled: s.toString(), claimed: c.toString(), claimable: (s - c).toString(), root: r.merkle_root, proof: r.proof };
    }),
    nextBefore: rows.length > limit && last ? `${last.run_id}:${last.epoch}` : null,
  };
}

/** An address's claims, newest first, by pages. */
export async function receipts(db: Queryable, address: string, limit: number, before: number | null): Promise<{ claims: Receipt[]; nextBefore: number | null }> {
  const rows = await db.query<{ id: number; address: string; amount: string; epochs: Receipt['epochs']; created_at: Date; payout: PayoutRecord }>(
    `SELECT id, address, amount::text AS amount, epochs, created_at, payout FROM claims
     WHERE address = $1 AND ($2::int IS NULL OR id < $2) ORDER BY id DESC LIMIT $3`,
    [address, before, limit + 1],
  );
  const page = rows.slice(0, limit);
  return {
    claims: page.map((r) => ({ id: Number(r.id), address: r.address, amount: baseUnits(r.amount).toString(), epochs: r.epochs, claimedAt: iso(r.created_at), payout: r.payout })),
    nextBefore: rows.length > limit ? Number(page[page.length - 1]!.id) : null,
  };
}
