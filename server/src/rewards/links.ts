import type { Queryable } from '../db/database';
import { iso } from '../ledger/queries';

/** Whether a miner with this id (hex, no 0x) ever registered here, in any run. */
export async function minerKnown(db: Queryable, minerId: string): Promise<boolean> {
  return (await db.query('SELECT 1 FROM miners WHERE id = $1', [minerId])).length > 0;
}

/** Records a link (a new row: relinking keeps the history); it is the miner's current one from now on. */
export async function insertLink(tx: Queryable, minerId: string, address: string, nonce: string): Promise<string> {
  const [row] = await tx.query<{ linked_at: Date }>('INSERT INTO payout_links (miner_id, address, nonce) VALUES ($1, $2, $3) RETURNING linked_at', [minerId, address, nonce]);
  return iso(row!.linked_at);
}

/** The miners whose current link is this address (0x-prefixed ids), at most `limit`. */
export async function linkedMiners(db: Queryable, address: string, limit: number): Promise<string[]> {
  // Links to the address that are still their miner's latest (by index, rather than the view's scan of every miner).
  const rows = await db.query<{ miner_id: string }>(
    `SELECT l.miner_id FROM payout_links l WHERE l.address = $1 AND l.id = (SELECT max(id) FROM payout_links WHERE miner_id = l.miner_id)
     ORDER BY l.miner_id LIMIT $2`,
    [address, limit],
  );
  return rows.map((r) => `0x${r.miner_id}`);
}
