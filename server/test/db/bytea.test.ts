import { createHash, randomFillSync } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../../src/db/database';
import { testDatabase } from '@train-at-home/testkit/database';

/** A `gpu` stage's checkpoint in 3 stages is ~127 MB of fp32 weights and their header. */
const GPU_STAGE_CHECKPOINT_BYTES = 128 * 1024 * 1024 + 12_345;

let db: Database;
beforeAll(async () => {
  db = await openDatabase(await testDatabase());
  await db.query('CREATE TEMP TABLE blobs (id int PRIMARY KEY, data bytea)');
});
afterAll(() => db?.close());

const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

describe('bytea columns', () => {
  it("store and read back a gpu stage's checkpoint byte for byte (PGlite's own hex codec could not)", async () => {
    const bytes = randomFillSync(new Uint8Array(GPU_STAGE_CHECKPOINT_BYTES));
    await db.query('INSERT INTO blobs VALUES (1, $1)', [bytes]);
    const [row] = await db.query<{ data: Uint8Array }>('SELECT data FROM blobs WHERE id = 1');
    expect(row!.data).toBeInstanceOf(Uint8Array);
    expect([row!.data.length, sha(row!.data)]).toEqual([bytes.length, sha(bytes)]);
  });

  it('keep empty and odd values exact, and refuse a parameter that is not bytes by name', async () => {
    for (const [id, bytes] of [[2, new Uint8Array(0)], [3, Uint8Array.of(0, 255, 92, 120)], [4, new Uint8Array(new ArrayBuffer(8), 3, 4).fill(7)]] as const) {
      await db.query('INSERT INTO blobs VALUES ($1, $2)', [id, bytes]);
      const [row] = await db.query<{ data: Uint8Array }>('SELECT data FROM blobs WHERE id = $1', [id]);
      expect([...row!.data]).toEqual([...bytes]);
    }
    if (db.kind === 'pglite') await expect(db.query('INSERT INTO blobs VALUES (5, $1::bytea)', [[1, 2]])).rejects.toThrow(/bytea parameter must be a Uint8Array/);
  });
});
