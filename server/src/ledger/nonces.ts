import { newChallenge } from '@train-at-home/protocol';
import { isRaceLoss, retryRaceLoss, type Queryable } from '../db/database';
import { RewardsError } from './errors';

export type NoncePurpose = 'link' | 'claim';

export interface Issued {
  message: string;
  nonce: string;
  expiresAt: string;
}

/**
 * Issues a nonce and stores it with the message written around it (`write`
 * gets the nonce and the expiry). Expired nonces are deleted on the way: an
 * unknown nonce is refused just as a used one is, so deleting never lets a
 * message through, and the table holds only what can still be used.
 */
export async function issueNonce(db: Queryable, purpose: NoncePurpose, address: string, now: Date, ttlMs: number, write: (nonce: string, expires: string) => string): Promise<Issued> {
  await sweepExpired(db, now);
  const nonce = newChallenge(); // 32 random bytes, 0x and lower-case hex
  const expiresAt = new Date(now.getTime() + ttlMs).toISOString();
  const message = write(nonce, expiresAt);
  // Under SERIALIZABLE the insert can still be chosen to fail beside concurrent sweeps: it is tried again (a new row
  // with the same random nonce; nothing of the failed attempt was kept).
  await retryRaceLoss(() => db.query('INSERT INTO nonces (nonce, purpose, address, message, expires_at) VALUES ($1, $2, $3, $4, $5)', [nonce, purpose, address, message, expiresAt]));
  return { message, nonce, expiresAt };
}

/**
 * Deletes expired nonces. Under SERIALIZABLE, concurrent requests sweep the same rows and all but one fail to
 * serialize (40001) or deadlock (40P01): a sweep that lost that race is done, since the rows it meant to delete
 * are another's to delete, and an expired nonce is refused whether or not its row is still there.
 */
async function sweepExpired(db: Queryable, now: Date): Promise<void> {
  try {
    await db.query('DELETE FROM nonces WHERE expires_at <= $1', [now.toISOString()]);
  } catch (e) {
    if (!isRaceLoss(e)) throw e;
  }
}

/**
 * Marks a nonce used, inside the caller's transaction, and returns what was
 * issued with it; the caller compares that with what was signed. Under
 * PostgreSQL a second transaction for the same nonce waits on the row until
 * the first commits, then finds it used: one message, one use. Throws
 * UNKNOWN_NONCE, NONCE_USED or EXPIRED.
 */
export async function consumeNonce(tx: Queryable, nonce: string, purpose: NoncePurpose, now: Date): Promise<{ address: string; message: string }> {
  const at = now.toISOString();
  const [row] = await tx.query<{ address: string; message: string }>(
    `UPDATE nonces SET used_at = $3 WHERE nonce = $1 AND purpose = $2 AND used_at IS NULL AND expires_at > $3 RETURNING address, message`,
    [nonce, purpose, at],
  );
  if (row) return row;
  const [seen] = await tx.query<{ used: boolean }>('SELECT used_at IS NOT NULL AS used FROM nonces WHERE nonce = $1 AND purpose = $2', [nonce, purpose]);
  if (!seen) throw new RewardsError('UNKNOWN_NONCE', `no ${purpose} challenge was issued with this nonce, or it expired`);
  if (seen.used) throw new RewardsError('NONCE_USED', 'this message was accepted once already; ask for a new challenge');
  throw new RewardsError('EXPIRED', 'the challenge expired; ask for a new one');
}
