import { randomBytes } from 'node:crypto';
import type { Queryable } from '@train-at-home/server/db/database';

/**
 * One microbatch as the pipeline records it, written straight to the database (for tests of what is paid): every
 * transfer along `pathway` (each activation forward, each gradient back) confirmed by both ends with the same bytes
 * and hash, then the last stage's loss with the pathway, in merge round `round`, all at `at` (default: now).
 */
export async function recordMicrobatch(db: Queryable, runId: number, pathway: string[], o: { loss?: number; round?: number; at?: Date } = {}): Promise<string> {
  const activationId = randomBytes(16).toString('hex');
  const at = o.at ?? new Date();
  for (let k = 0; k + 1 < pathway.length; k++) {
    for (const [direction, from, to] of [['activation', pathway[k], pathway[k + 1]], ['gradient', pathway[k + 1], pathway[k]]] as const) {
      const hash = randomBytes(32).toString('hex');
      for (const reporter of [from, to]) {
        await db.query(
          `INSERT INTO receipts (run_id, epoch, activation_id, direction, from_miner, to_miner, reporter, bytes, payload_hash, created_at) VALUES ($1, 0, $2, $3, $4, $5, $6, 1000, $7, $8)`,
          [runId, activationId, direction, from, to, reporter, hash, at],
        );
      }
    }
  }
  await db.query(`INSERT INTO metrics (run_id, epoch, name, value, activation_id, pathway, round, created_at) VALUES ($1, 0, 'train_loss', $2, $3, $4, $5, $6)`, [
    runId,
    o.loss ?? 4,
    activationId,
    JSON.stringify(pathway),
    o.round ?? 0,
    at,
  ]);
  return activationId;
}
