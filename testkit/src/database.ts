import pg from 'pg';
import type { DatabaseOptions } from '@train-at-home/server/db/database';

/**
 * The database a test's coordinator uses: embedded PGlite by default (in
 * memory, or in `dataDir` when the test restarts the coordinator), or, when
 * TAH_TEST_DATABASE_URL names a PostgreSQL server (scripts/test-postgres.sh),
 * a database of its own on that server, named by `key` so a restarted
 * coordinator finds the same one.
 */
export async function testDatabase(key: string = `t${Date.now()}${Math.floor(Math.random() * 1e6)}`, dataDir?: string): Promise<DatabaseOptions> {
  const server = process.env.TAH_TEST_DATABASE_URL;
  if (!server) return dataDir ? { dataDir } : {};
  const name = `tah_${key.replace(/[^a-z0-9_]/gi, '_').toLowerCase()}`.slice(0, 60);
  const admin = new pg.Client({ connectionString: server });
  await admin.connect();
  try {
    const exists = await admin.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
    if (exists.rowCount === 0) await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const url = new URL(server);
  url.pathname = `/${name}`;
  return { url: url.toString() };
}
