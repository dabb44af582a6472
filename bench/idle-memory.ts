/**
 * npm run bench:idle-memory — what an idle coordinator holds: the README's
 * coordinator (embedded PGlite, the `tiny` preset here, 2 stages) started on a
 * fresh data folder, left alone until /api/status answers and IDLE_MS more,
 * then its resident memory read from /proc; then stopped and started again on
 * the same folder (a restart), and read again. No miner, no traffic.
 *
 * Where the memory goes (issue 16, defect 9): Node with tsx and the modules
 * (~210 MB: tfjs for checkpoint checks, sr25519 crypto, fastify, socket.io),
 * and PGlite's WebAssembly PostgreSQL. PGlite used to run initdb in the
 * coordinator's own process on a fresh folder and keep ~430 MB of it; now
 * initdb runs in a child that exits (server/src/db/initdb-process.ts). Its
 * shared buffers are 32 MB, not 128.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { finish, machine } from './lib';

const IDLE_MS = 15_000;
const MAIN = fileURLToPath(new URL('../server/src/main.ts', import.meta.url));

const freePort = (): Promise<number> =>
  new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });

const rssMb = (pid: number): number => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;

async function idleCoordinator(dataDir: string): Promise<{ rssMb: number; startMs: number }> {
  const port = await freePort();
  const started = performance.now();
  const child = spawn(process.execPath, ['--import', 'tsx', MAIN, '--port', String(port), '--host', '127.0.0.1', '--preset', 'tiny', '--stages', '2', '--data-dir', dataDir], {
    stdio: ['ignore', 'ignore', 'inherit'],
    env: { ...process.env, DATABASE_URL: '' },
  });
  try {
    for (;;) {
      if (child.exitCode !== null) throw new Error(`the coordinator exited (${child.exitCode})`);
      const ok = await fetch(`http://127.0.0.1:${port}/api/status`).then((r) => r.ok, () => false);
      if (ok) break;
      await new Promise((r) => setTimeout(r, 250));
    }
    const startMs = performance.now() - started;
    await new Promise((r) => setTimeout(r, IDLE_MS));
    return { rssMb: rssMb(child.pid!), startMs };
  } finally {
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
  }
}

const dir = mkdtempSync(join(tmpdir(), 'tah-idle-'));
try {
  const fresh = await idleCoordinator(join(dir, 'db'));
  console.log(`fresh data folder: ${fresh.rssMb.toFixed(0)} MB resident after ${IDLE_MS / 1000} s idle (up in ${(fresh.startMs / 1000).toFixed(1)} s)`);
  const restart = await idleCoordinator(join(dir, 'db'));
  console.log(`restart on the same folder: ${restart.rssMb.toFixed(0)} MB resident after ${IDLE_MS / 1000} s idle (up in ${(restart.startMs / 1000).toFixed(1)} s)`);
  finish('idle-memory', {
    preset: 'tiny',
    idleMs: IDLE_MS,
    freshRssMb: Math.round(fresh.rssMb),
    restartRssMb: Math.round(restart.rssMb),
    // Measured the same way before the fix (this session, same machine): 975 MB on a fresh folder.
    beforeFixFreshRssMb: 975,
    machine: machine('none (coordinator idle)'),
  });
} finally {
  rmSync(dir, { recursive: true, force: true });
}
