import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it, onTestFinished } from 'vitest';
import { initDataDir, openDatabase } from '../../src/db/database';

const externalMb = (): number => process.memoryUsage().external / 2 ** 20;

/**
 * Defect 9: an idle `tiny` coordinator held 0.65–1 GB. Where it went
 * (bench/idle-memory.ts prints the figures): PGlite runs PostgreSQL's initdb
 * in the process that opens a fresh data folder and keeps ~430 MB of it, and
 * its 128 MB of shared buffers grow its WebAssembly memory to ~200 MB.
 */
describe('the embedded database at idle', () => {
  it('is created in a process of its own, and opened with small shared buffers', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tah-idle-'));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const before = externalMb();
    const initdb = await initDataDir(join(dir, 'db'));
    expect(initdb).toBeGreaterThan(0);
    expect(initdb).not.toBe(process.pid);
    // A folder that is ready is opened as it is.
    expect(await initDataDir(join(dir, 'db'))).toBeUndefined();
    const db = await openDatabase({ dataDir: join(dir, 'db') });
    try {
      expect((await db.query<{ shared_buffers: string }>('SHOW shared_buffers'))[0]!.shared_buffers).toBe('32MB');
      // Opening the fresh folder in this process held ~630 MB outside the JS heap; now it holds what a restart does.
      expect(externalMb() - before).toBeLessThan(300);
    } finally {
      await db.close();
    }
  });
});
