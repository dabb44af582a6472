/**
 * Creates a new PGlite data folder (PostgreSQL's initdb) in a process of its
 * own and exits. PGlite runs initdb inside the process that opens a fresh
 * folder and keeps about 430 MB of that work's memory until the process ends;
 * run here, the coordinator opens a ready folder and never holds it
 * (database.ts, initDataDir). Usage: initdb-process.ts <folder>
 */
import { PGlite } from '@electric-sql/pglite';

const dir = process.argv[2];
if (!dir) {
  console.error('initdb-process: name the data folder');
  process.exit(2);
}
const db = await PGlite.create(dir);
await db.close();
