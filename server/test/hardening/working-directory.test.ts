import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';

const MAIN = fileURLToPath(new URL('../../src/main.ts', import.meta.url));
/** How a service manager outside the project starts the coordinator: Node with tsx's loader named by its path. */
const TSX = pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;

/**
 * Issue 25, item 11: the coordinator started from a folder other than the
 * project's crashed on its first start, because the child that creates a
 * fresh PGlite folder (db/initdb-process.ts) was run with `--import tsx`,
 * which Node resolves from the working directory. Started here from the
 * system's temporary folder, with a data folder that does not exist yet, it
 * must create the database and answer.
 */
describe('the coordinator started from another folder', () => {
  let child: ChildProcess | undefined;
  const dirs: string[] = [];
  afterEach(() => {
    if (child && child.exitCode === null) child.kill('SIGKILL');
    child = undefined;
    dirs.splice(0).forEach((d) => rmSync(d, { recursive: true, force: true }));
  });

  it('creates a fresh database through its init child and answers /api/status', { timeout: 120_000 }, async () => {
    const cwd = mkdtempSync(join(tmpdir(), 'tah-cwd-'));
    dirs.push(cwd);
    const dataDir = join(cwd, 'db'); // not there yet: the init child must run
    const env = { ...process.env };
    delete env.DATABASE_URL; // embedded PGlite, whatever the caller's environment says
    child = spawn(process.execPath, ['--import', TSX, MAIN, '--port', '0', '--host', '127.0.0.1', '--local-miners', '0', '--domain', 'localhost', '--data-dir', dataDir], {
      cwd,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout!.on('data', (c: Buffer) => (output += c.toString()));
    child.stderr!.on('data', (c: Buffer) => (output += c.toString()));
    const exited = new Promise<number | null>((resolve) => child!.once('exit', resolve));
    const url = await Promise.race([
      new Promise<string>((resolve) => {
        const look = (): void => {
          const m = /Open (http:\/\/127\.0\.0\.1:[0-9]+) in a browser/.exec(output);
          if (m) resolve(m[1]!);
          else setTimeout(look, 100);
        };
        look();
      }),
      exited.then((code) => `exited ${code}`),
    ]);
    expect(url, output.slice(-3000)).toMatch(/^http:/);
    expect(existsSync(join(dataDir, 'PG_VERSION'))).toBe(true);
    const res = await fetch(`${url}/api/status`);
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ database: 'pglite', activeMiners: 0 });
    expect(output).not.toMatch(/could not create the database folder|ERR_MODULE_NOT_FOUND/);
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
  });
});
