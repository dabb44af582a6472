import { PGlite, types } from '@electric-sql/pglite';
import { fork } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { tsxExecArgv } from '../tsx-loader';
import { MIGRATIONS, statements } from './migrations';

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
  // PGlite runs no autovacuum: what a data folder's miners table grew before migration 22 (or in a crash) is
  // reclaimed here, once per start (a few milliseconds for a table that kept its size).
  if (db.kind === 'pglite') await db.query('VACUUM miners');
  return db;
}

/**
 * PostgreSQL settings of the embedded database. Its default shared buffers
 * (128 MB) grow PGlite's WebAssembly memory to about 200 MB at start; a
 * coordinator's tables are read through the OS's file cache as well, and 32 MB
 * keeps an idle coordinator near 240 MB (bench/idle-memory.ts).
 */
export const PGLITE_SETTINGS = ['shared_buffers = 32MB'];

const INITDB_ENTRY = fileURLToPath(new URL('./initdb-process.ts', import.meta.url));

/**
 * Creates a fresh data folder in a short-lived child process (initdb-process.ts)
 * when it holds no database yet; resolves with that process's pid, or
 * undefined when the folder was ready.
 */
export async function initDataDir(dataDir: string): Promise<number | undefined> {
  if (existsSync(join(dataDir, 'PG_VERSION'))) return undefined;
  mkdirSync(dataDir, { recursive: true });
  const child = fork(INITDB_ENTRY, [dataDir], { execArgv: tsxExecArgv(), stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const code = await new Promise<number | null>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', resolve);
  });
  if (code !== 0 || !existsSync(join(dataDir, 'PG_VERSION'))) throw new Error(`could not create the database folder ${dataDir} (initdb exited ${code})`);
  return child.pid;
}

/**
 * A database in memory (tests, benches) starts as a copy of a freshly initialised one, then migrates as any other
 * does: PostgreSQL's initdb took 2.3–3.9 s of each open on these 2 cores, a copy 0.4–0.9 s. The copy is PGlite's own
 * dump of an empty database (`dumpDataDir`), kept per PGlite version in the system's temporary folder (written whole,
 * then renamed, so a reader never sees a part), made once by whichever process needs it first.
 */
async function initialisedInMemory(): Promise<Blob | undefined> {
  const version = pgliteVersion();
  if (!version) return undefined; // a bundle (the GPU machine's) carries no package to name the copy by: initdb as before
  const file = join(tmpdir(), `tah-pglite-${version}-initdb.tar`);
  if (existsSync(file)) return new Blob([readFileSync(file)]);
  const db = await PGlite.create();
  try {
    const dump = await db.dumpDataDir('none');
    const part = `${file}.${process.pid}.${Date.now()}`;
    writeFileSync(part, new Uint8Array(await dump.arrayBuffer()));
    renameSync(part, file);
    return dump;
  } finally {
    await db.close();
  }
}
/** The installed PGlite's version (looked up once), or undefined where its package cannot be found (bundled by esbuild). */
function pgliteVersion(): string | undefined {
  if (pgliteVersionFound === null) {
    try {
      const dir = join(dirname(createRequire(import.meta.url).resolve('@electric-sql/pglite')), '..');
      pgliteVersionFound = (JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { version: string }).version;
    } catch {
      pgliteVersionFound = undefined;
    }
  }
  return pgliteVersionFound;
}
let pgliteVersionFound: string | undefined | null = null;

/**
 * bytea through Node's native hex codec. PGlite 0.5 writes a bytea parameter
 * as hex through `Array.from(bytes).map(…).join('')` and parses one back byte
 * by byte: a `small` checkpoint (10 MB) took 3.5 s to store and 0.6 s to read,
 * blocking the coordinator's event loop; a `gpu` stage's (127 MB) could not be
 * stored at all (RangeError: Invalid array length). Buffer does each in one
 * call: 0.2 s and 0.06 s for 10 MB, 4.5 s and 2.7 s for 127 MB
 * (npm run bench:bytea; bytea.test.ts stores one).
 */
export const PGLITE_BYTEA = {
  serializers: {
    [types.BYTEA]: (x: unknown): string => {
      if (!(x instanceof Uint8Array)) throw new TypeError('a bytea parameter must be a Uint8Array');
      return '\\x' + Buffer.from(x.buffer, x.byteOffset, x.byteLength).toString('hex');
    },
  },
  parsers: {
    [types.BYTEA]: (x: string): Uint8Array => {
      const b = Buffer.from(x.slice(2), 'hex');
      return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    },
  },
};

async function pglite(dataDir?: string): Promise<Database> {
  if (dataDir) await initDataDir(dataDir);
  const fresh = dataDir ? undefined : await initialisedInMemory();
  const lite = await PGlite.create(dataDir, { postgresqlconf: PGLITE_SETTINGS, ...PGLITE_BYTEA, ...(fresh ? { loadDataDir: fresh } : {}) });
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

/**
 * Runs a transaction again when it lost a race to a concurrent one.
 * Under SERIALIZABLE (an operator's default_transaction_isolation) the loser
 * of two transactions writing the same row fails with a serialization failure
 * (40001) instead of waiting for the winner, and a deadlock (40P01) ends one
 * of two; run again, it meets what the winner committed and is refused by
 * name (NONCE_USED, ALREADY_CLAIMED) rather than answered 500. `fn` must
 * hold the whole transaction, so that a retry redoes all of it.
 */
export async function retryRaceLoss<T>(fn: () => Promise<T>, attempts = 3): Promise<T> {
  for (let i = 1; ; i++) {
    try {
      return await fn();
    } catch (e) {
      if (i >= attempts || !isRaceLoss(e)) throw e;
    }
  }
}

/** A transaction that lost a race with another: a serialization failure (40001) or a deadlock (40P01). */
export function isRaceLoss(e: unknown): boolean {
  const code = (e as { code?: unknown } | null)?.code;
  return code === '40001' || code === '40P01';
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
      for (const statement of statements(m.sql)) await tx.query(statement);
      await tx.query('INSERT INTO schema_migrations (version, name) VALUES ($1, $2)', [m.version, m.name]);
    });
    applied.push(m.version);
  }
  return applied;
}
