import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { initNodeBackend } from '@train-at-home/model/node';
import type { Miner } from '@train-at-home/swarm';
import { afterAll, describe, expect, it } from 'vitest';
import { localMiner } from '@train-at-home/testkit/miner-processes';
import { freePort } from '@train-at-home/testkit/ports';

/**
 * The coordinator's command line as an operator runs it (server/src/main.ts, what `npm start` ends in), on the
 * embedded database in a folder of the test's, with one miner of the test's joining: the lines the operator reads.
 */
const MAIN = fileURLToPath(new URL('../src/main.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const STATUS_SECONDS = 10;

const dir = mkdtempSync(join(tmpdir(), 'tah-cli-'));
let child: ChildProcess | undefined;
let miner: Miner | undefined;
let output = '';

afterAll(async () => {
  miner?.stop();
  if (child && child.exitCode === null) child.kill('SIGKILL');
  // Its local miners outlive a stop (for a restart to take them over): this test ends them.
  try {
    for (const { pid } of JSON.parse(readFileSync(join(dir, 'local-miners.json'), 'utf8')) as Array<{ pid: number }>) process.kill(pid, 'SIGTERM');
  } catch {
    // none recorded, or gone
  }
  rmSync(dir, { recursive: true, force: true });
});

/** This environment without the operator's switches the test means to leave at their defaults (or the database's). */
function defaults(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const name of ['LOG_LEVEL', 'TAH_STATUS_SECONDS', 'DATABASE_URL', 'REDIS_URL', 'TAH_LOCAL_MINERS']) delete env[name];
  return env;
}


describe("the coordinator's command line", () => {
  it('says where to open the run, prints a status line a minute (here every 10 s) and no line per request, and stops cleanly, saying so', async () => {
    const port = await freePort();
    const url = `http://127.0.0.1:${port}`;
    child = spawn(
      process.execPath,
      ['--import', 'tsx', MAIN, '--port', String(port), '--host', '127.0.0.1', '--preset', 'tiny', '--stages', '2', '--data-dir', dir, '--status-seconds', String(STATUS_SECONDS)],
      { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: defaults() },
    );
    child.stdout!.on('data', (c: Buffer) => (output += c.toString()));
    child.stderr!.on('data', (c: Buffer) => (output += c.toString()));
    let exitCode: number | null | undefined;
    const exited = new Promise<number | null>((resolve) => child!.once('exit', (code) => resolve((exitCode = code))));
    const alive = (): void => {
      if (exitCode !== undefined) throw new Error(`the coordinator exited (${exitCode}):\n${output.slice(-3000)}`);
    };

    // Start-up: what it opens first, then the address to open and the dashboard's.
    await expect.poll(() => (alive(), output), { timeout: 120_000, interval: 250 }).toMatch(/dashboard is /);
    expect(output).toMatch(/^Train at Home: starting the coordinator: run "default", the embedded database in .*, then the validator/m);
    expect(output).toMatch(/^Train at Home: ready in [\d.]+ s\.$/m);
    expect(output).toMatch(/^Train at Home: run "default" \(tiny, 2 stages\) is up\.$/m);
    expect(output).toContain(`Open ${url} in a browser and press Join to train; the dashboard is ${url}/dashboard.`);
    expect(output).toContain('A status line follows every 10 s; Ctrl-C stops the coordinator.');

    // One miner joins; the coordinator fills the other stage with a local miner of its own, and the two train.
    await initNodeBackend('wasm'); // the in-process miner's (no coordinator in this process sets one up)
    miner = localMiner(url);
    await miner.start();
    // The requests a tab and a dashboard make, answered all along: none of them is a line of the log.
    const poll = setInterval(() => {
      for (const path of ['/api/status', '/api/metrics', '/api/stages']) void fetch(`${url}${path}`).catch(() => {});
    }, 1000);
    try {
      // A status line that saw training: both stages held, microbatches and a loss in its window, nothing failing.
      await expect
        .poll(() => (alive(), output), { timeout: 240_000, interval: 1000 })
        .toMatch(/^status: miners by stage 1 \/ 1 · last 10 s [1-9]\d* microbatch(es)?, [\d,]+ tokens\/s, loss \d+\.\d{3} · epoch \d+, (none settled yet|settled through \d+) · validator busy \d+%( \((audits|spot checks|held-out loss|samples|scoring) \d+%(, (audits|spot checks|held-out loss|samples|scoring) \d+%)*\))? · nothing failing$/m);
    } finally {
      clearInterval(poll);
    }
    miner.stop();

    // Ctrl-C's signal: a line that it stops, one that it stopped, exit 0.
    child.kill('SIGINT');
    expect(await exited).toBe(0);
    console.log(`operator-cli: the coordinator's output:\n${output}`);
    expect(output).toMatch(/^Train at Home: stopping \(SIGINT\)…$/m);
    expect(output).toMatch(/^Train at Home: stopped\. The run's state is kept/m);
    // At the default level: no request log, no warning or error, no stack trace.
    expect(output).not.toMatch(/incoming request|request completed/);
    expect(output).not.toMatch(/"level":(40|50|60)/);
    expect(output).not.toMatch(/^\s+at /m);
  });
});
