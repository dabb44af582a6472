/**
 * npm run bench:bytea — how long storing and reading a checkpoint holds the
 * coordinator's event loop with embedded PGlite: its own bytea codec (hex
 * through `Array.from(bytes).map(…).join('')`, parsed back byte by byte)
 * against the coordinator's (`PGLITE_BYTEA`: Node's Buffer hex), for a
 * `small` stage's checkpoint (10 MB), 40 MB, and a `gpu` stage's in 3 stages
 * (127 MB). One in-memory PGlite per codec, one row rewritten each time.
 */
import { PGlite } from '@electric-sql/pglite';
import { PGLITE_BYTEA, PGLITE_SETTINGS } from '../server/src/db/database';
import { finish, machine } from './lib';

const SIZES_MB = [10, 40, 127];
type Row = { codec: string; megabytes: number; insertMs: number | null; selectMs: number | null; error?: string };
const rows: Row[] = [];
for (const codec of ['pglite', 'node-buffer'] as const) {
  const lite = await PGlite.create(undefined, { postgresqlconf: PGLITE_SETTINGS, ...(codec === 'node-buffer' ? PGLITE_BYTEA : {}) });
  await lite.query('CREATE TABLE c (id int PRIMARY KEY, data bytea)');
  for (const megabytes of SIZES_MB) {
    const bytes = new Uint8Array(megabytes * 1024 * 1024);
    for (let i = 0; i < bytes.length; i += 4099) bytes[i] = i & 255;
    let t = performance.now();
    try {
      await lite.query('INSERT INTO c VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET data = $1', [bytes]);
      const insertMs = Math.round(performance.now() - t);
      t = performance.now();
      const { rows: got } = await lite.query<{ data: Uint8Array }>('SELECT data FROM c WHERE id = 1');
      const selectMs = Math.round(performance.now() - t);
      if (got[0]?.data.length !== bytes.length) throw new Error('read back a different length');
      rows.push({ codec, megabytes, insertMs, selectMs });
    } catch (e) {
      rows.push({ codec, megabytes, insertMs: null, selectMs: null, error: (e as Error).message.slice(0, 80) });
    }
    const r = rows.at(-1)!;
    console.log(`${codec.padEnd(11)} ${String(megabytes).padStart(4)} MB: ${r.error ? `failed (${r.error})` : `insert ${r.insertMs} ms, select ${r.selectMs} ms`}`);
  }
  await lite.close();
}
const at = (codec: string, mb: number) => rows.find((r) => r.codec === codec && r.megabytes === mb)!;
finish('bytea', {
  /** Event-loop time to store / read a 10 MB (`small`) and a 127 MB (`gpu`, 3 stages) checkpoint; null: it failed. */
  smallInsertMs: { pglite: at('pglite', 10).insertMs, nodeBuffer: at('node-buffer', 10).insertMs },
  smallSelectMs: { pglite: at('pglite', 10).selectMs, nodeBuffer: at('node-buffer', 10).selectMs },
  gpuInsertMs: { pglite: at('pglite', 127).insertMs, nodeBuffer: at('node-buffer', 127).insertMs },
  gpuSelectMs: { pglite: at('pglite', 127).selectMs, nodeBuffer: at('node-buffer', 127).selectMs },
  rows,
  machine: machine('pglite (wasm)'),
});
