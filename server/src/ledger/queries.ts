import type { Queryable } from '../db/database';

/**
 * The run's start in whole milliseconds, the origin of its emission epochs.
 * Computed in SQL (created_at keeps microseconds; they are dropped, never rounded)
 * so that PGlite and PostgreSQL, the API and the validator agree on it.
 */
export async function runStartMs(db: Queryable, runId: number): Promise<number> {
  const [row] = await db.query<{ ms: string }>(`SELECT floor(extract(epoch FROM created_at) * 1000)::bigint::text AS ms FROM runs WHERE id = $1`, [runId]);
  if (!row) throw new Error(`no run ${runId}`);
  return Number(row.ms);
}

/** A bigint or numeric column as PGlite or pg returns it (bigint, number or string), as a bigint. */
export function baseUnits(value: unknown): bigint {
  if (typeof value === 'bigint') return value;
  if (typeof value === 'string' && /^-?\d+$/.test(value)) return BigInt(value);
  if (typeof value === 'number' && Number.isSafeInteger(value)) return BigInt(value);
  throw new TypeError(`not an integer amount: ${String(value)}`);
}

/** A timestamp column (Date from both drivers; a string to be safe) as ISO 8601. */
export function iso(value: unknown): string {
  return (value instanceof Date ? value : new Date(String(value))).toISOString();
}
