/**
 * bench/local-validator: how much of a newcomer's machine the validator takes in a local run, and on what.
 *
 * For each configuration in BENCH_CONFIGS (name=coordinator flags, ';' between; by default "before", the local
 * settings before this figure: audits at 0.2, held-out loss every 30 s; and "after", the command line's local
 * defaults now), a local run as `npm start` makes it: the coordinator's command line (server/src/main.ts: the default
 * run, `small` on 3 stages, LOCAL_INCENTIVES, local miners filling the stages nobody holds) on a fresh embedded
 * database, and one Chromium tab that presses Join. Over the first BENCH_MINUTES (default 10) minutes after the
 * coordinator answers, every 5 s, the CPU time of each process (from /proc: the validator's own process, the
 * coordinator, the local miners, Chromium) and of the machine; each minute the operator's status line, which says
 * what the validator spent its time on. Then, from the run's database: audits drawn and how they ended, spot checks,
 * held-out evaluations, microbatches trained, epochs settled and when the first was.
 *
 * `npm run bench:local-validator` (inside its own network namespace, as the browser tests run).
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { openDatabase } from '../server/src/db/database';
import { HOST, launchBrowser, stopCoordinator, tabView } from '../e2e/lib';
import { freePort } from '@train-at-home/testkit/ports';
import { finish, machine } from './lib';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const MAIN = join(ROOT, 'server/src/main.ts');
const minutes = Number(process.env.BENCH_MINUTES ?? 10);
const configs = (process.env.BENCH_CONFIGS ?? 'before=--audit-rate 0.2 --unproven-audit-rate 0.2 --evaluate-seconds 30;after=')
  .split(';')
  .map((c) => {
    const [name, flags = ''] = c.split('=');
    return { name: name!.trim(), flags: flags.split(' ').filter(Boolean) };
  });
/** Clock ticks per second of /proc's CPU times (USER_HZ: 100 on Linux). */
const HZ = 100;
const SAMPLE_MS = 5_000;

type Group = 'validator' | 'coordinator' | 'localMiners' | 'chromium' | 'other';

/** Each process's CPU ticks (user + system) and what it is, read from /proc. */
function processes(): Map<number, { ticks: number; group: Group }> {
  const out = new Map<number, { ticks: number; group: Group }>();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const cmd = readFileSync(`/proc/${name}/cmdline`, 'utf8').replace(/\0/g, ' ');
      // The fields after the command's name (in parentheses, which may hold spaces): utime and stime are the 12th and 13th.
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const ticks = Number(fields[11]) + Number(fields[12]);
      const group: Group = cmd.includes('validator/process.ts')
        ? 'validator'
        : cmd.includes('server/src/main.ts')
          ? 'coordinator'
          : cmd.includes('apps/miner/src/main.ts')
            ? 'localMiners'
            : /chromium/.test(cmd)
              ? 'chromium'
              : 'other';
      out.set(Number(name), { ticks, group });
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** The machine's busy and total CPU ticks, all cores (/proc/stat's first line). */
function machineTicks(): { busy: number; total: number } {
  const [, ...f] = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/);
  const n = f.map(Number);
  const idle = n[3]! + n[4]!;
  const total = n.slice(0, 8).reduce((a, b) => a + b, 0);
  return { busy: total - idle, total };
}

async function measure({ name, flags }: { name: string; flags: string[] }) {
  const dir = mkdtempSync(join(tmpdir(), 'tah-bench-local-'));
  const dataDir = join(dir, 'db');
  const port = await freePort(HOST);
  const url = `http://${HOST}:${port}`;
  const coordinator = spawn(process.execPath, ['--import', 'tsx', MAIN, '--port', String(port), '--data-dir', dataDir, ...flags, '--status-seconds', '60'], {
    cwd: ROOT,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  // The operator's status lines, one a minute: what the validator spent its time on, by kind of job.
  const busy: Array<Record<string, number>> = [];
  let partial = '';
  coordinator.stdout!.on('data', (c: Buffer) => {
    log = (log + c.toString()).slice(-8000);
    const lines = (partial + c.toString()).split('\n');
    partial = lines.pop() ?? '';
    for (const line of lines) {
      const m = /validator busy (\d+)%(?: \(([^)]*)\))?/.exec(line);
      if (!m) continue;
      const row: Record<string, number> = { all: Number(m[1]) / 100 };
      for (const part of (m[2] ?? '').split(', ').filter(Boolean)) {
        const [, kind, pct] = /^(.*) (\d+)%$/.exec(part) ?? [];
        if (kind) row[kind] = Number(pct) / 100;
      }
      busy.push(row);
    }
  });
  coordinator.stderr!.on('data', (c: Buffer) => (log = (log + c.toString()).slice(-8000)));
  const deadline = Date.now() + 180_000;
  while ((await fetch(`${url}/api/status`).then((r) => r.status, () => 0)) !== 200) {
    if (Date.now() > deadline || coordinator.exitCode !== null) throw new Error(`the coordinator did not answer: ${log}`);
    await new Promise((r) => setTimeout(r, 500));
  }
  const upAt = Date.now();
  const browser = await launchBrowser();
  const tab = await browser.context.newPage();
  await tab.goto(url);
  await tab.getByTestId('join').click();

  // CPU ticks per group, summed over every process seen (a process that exits keeps what it used until its last sample).
  const first = processes();
  const last = new Map(first);
  const m0 = machineTicks();
  let m1 = m0;
  while (Date.now() - upAt < minutes * 60_000) {
    await new Promise((r) => setTimeout(r, SAMPLE_MS));
    for (const [pid, p] of processes()) last.set(pid, p);
    m1 = machineTicks();
  }
  const seconds = (Date.now() - upAt) / 1000;
  const cpu: Record<Group, number> = { validator: 0, coordinator: 0, localMiners: 0, chromium: 0, other: 0 };
  for (const [pid, p] of last) cpu[p.group] += (p.ticks - (first.get(pid)?.ticks ?? 0)) / HZ;
  const view = await tabView(tab);
  await browser.close();
  await stopCoordinator(coordinator);
  // Its local miners outlive it (a restart takes them over): ended here.
  try {
    for (const { pid } of JSON.parse(readFileSync(join(dataDir, 'local-miners.json'), 'utf8')) as Array<{ pid: number }>) process.kill(pid, 'SIGTERM');
  } catch {
    // none recorded, or gone
  }

  const db = await openDatabase({ dataDir });
  const audits = Object.fromEntries(
    (await db.query<{ status: string; n: number }>(`SELECT status || coalesce(':' || reason, '') AS status, count(*)::int AS n FROM audits GROUP BY 1 ORDER BY 1`)).map((r) => [r.status, r.n]),
  );
  const [trained] = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE name = 'train_loss'`);
  const settled = await db.query<{ epoch: number; settled_at: Date }>('SELECT epoch, settled_at FROM settlements ORDER BY epoch');
  const [flagged] = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM flags');
  const [spot] = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM spot_checks');
  const [heldOut] = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE name = 'heldout_loss'`);
  await db.close();
  rmSync(dir, { recursive: true, force: true });

  const cores = availableParallelism();
  const row = {
    name,
    flags: flags.join(' '),
    seconds: Math.round(seconds),
    // Seconds of CPU per second of wall time: 1 is one core busy the whole time.
    validatorCores: +(cpu.validator / seconds).toFixed(3),
    validatorShareOfMachine: +(cpu.validator / seconds / cores).toFixed(3),
    cores: Object.fromEntries(Object.entries(cpu).map(([k, v]) => [k, +(v / seconds).toFixed(3)])),
    machineBusy: +((m1.busy - m0.busy) / (m1.total - m0.total)).toFixed(3),
    // The validator's time by kind of job, averaged over the run's status lines (one a minute, as the operator reads them).
    validatorBusyBy: Object.fromEntries(
      [...new Set(busy.flatMap((b) => Object.keys(b)))].map((k) => [k, +(busy.reduce((a, b) => a + (b[k] ?? 0), 0) / Math.max(1, busy.length)).toFixed(3)]),
    ),
    spotChecks: spot!.n,
    heldOutEvaluations: heldOut!.n,
    audits,
    microbatches: trained!.n,
    tabMicrobatches: view.microbatches,
    tabBackend: view.backend,
    epochsSettled: settled.length,
    firstSettledAfterS: settled[0] ? Math.round((settled[0].settled_at.getTime() - upAt) / 1000) : null,
    flagsRaised: flagged!.n,
  };
  console.log(JSON.stringify(row));
  return row;
}

const runs: Array<Awaited<ReturnType<typeof measure>>> = [];
for (const config of configs) runs.push(await measure(config));
finish('local-validator', {
  machine: machine('wasm (Node validator and local miners; the tab on WASM)'),
  budget: `${minutes} minutes of each local run after the coordinator answered, one Chromium tab joined`,
  validatorCoresBefore: runs[0]?.validatorCores,
  validatorCoresAfter: runs.at(-1)?.validatorCores,
  runs,
});
process.exit(0);
