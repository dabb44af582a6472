import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { MIGRATIONS } from './migrations';

/** What the coordinator needs of PostgreSQL: queries and transactions. */
export interface Queryable {
  query<T = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<T[]>;
}

export interface Database extends Queryable {
  readonly kind: 'pglite' | 'postgres';
  transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

export interface DatabaseOptions {
  /** A PostgreSQL server (postgres://…); when absent, embedded PGlite. */
  url?: string;
  /** PGlite's folder; when absent, in memory (tests). */
  dataDir?: string;
}

/**
 * One data layer over two engines: embedded PGlite (the default, files under
 * a data folder) or a PostgreSQL server when DATABASE_URL is set. Migrations
 * run on open, so a restart finds the schema it left.
 */
export async function openDatabase(options: DatabaseOptions): Promise<Database> {
  const db = options.url ? postgres(options.url) : await pglite(options.dataDir);
  await migrate(db);
  return db;
}

async function pglite(dataDir?: string): Promise<Database> {
  const lite = await PGlite.create(dataDir);
  const run = async <T>(q: { query: PGlite['query'] }, sql: string, params?: unknown[]): Promise<T[]> =>
    (await q.query<T>(sql, params as unknown[])).rows;
  return {
    kind: 'pglite',
    query: (sql, params) => run(lite, sql, params),
    transaction: (fn) => lite.transaction((tx) => fn({ query: (sql, params) => run(tx, sql, params) })),
    close: () => lite.close(),
  };
}

/** Connections the coordinator keeps to a PostgreSQL server. */
export const POOL_CONNECTIONS = 20;

function postgres(url: string): Database {
  // Every query takes a turn of the event loop to come back: under load (many miners' receipts) more
  // connections in flight keep the queue short. PostgreSQL's default max_connections is 100.
  const pool = new pg.Pool({ connectionString: url, max: POOL_CONNECTIONS });
  return {
    kind: 'postgres',
    query: async (sql, params) => (await pool.query(sql, params)).rows,
    transaction: async (fn) => {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        const out = await fn({ query: async (sql, params) => (await client.query(sql, params)).rows });
        await client.query('COMMIT');
        return out;
      } catch (e) {
        await client.query('ROLLBACK');
        throw e;
      } finally {
        client.release();
      }
    },
    close: () => pool.end(),
  };
}

/** Applies every migration not yet recorded, each in its own transaction. */
export async function migrate(db: Database): Promise<number[]> {
  await db.query(`CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`);
  const done = new Set((await db.query<{ version: number }>('SELECT version FROM schema_migrations')).map((r) => r.version));
  const applied: number[] = [];
  for (const m of MIGRATIONS) {
    if (done.has(m.version)) continue;
    await db.transaction(async (tx) => {
      for (const statement of m.sql.split(/;\s*\n/).map((s) => s.trim()).filter(Boolean)) await tx.query(statement);
      await tx.query('INSERT INTO schema_migrations (version, name) VALUES ($1, $2)', [m.version, m.name]);
    });
    applied.push(m.version);
  }
  return applied;
}
