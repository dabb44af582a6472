import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { relative } from 'node:path';
import type { Reporter, SerializedError, TestModule } from 'vitest/node';
import { NATIVE_CRASH } from '../testkit/src/crash';

/** The largest resident memory (MiB) among this process's children (the test workers), from /proc (Linux; elsewhere 0). */
function largestChildRss(): number {
  let largest = 0;
  let pids: string[];
  try {
    pids = readdirSync('/proc').filter((d) => /^\d+$/.test(d));
  } catch {
    return largest;
  }
  for (const pid of pids) {
    try {
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      if (Number(/^PPid:\s+(\d+)/m.exec(status)?.[1]) !== process.pid) continue;
      largest = Math.max(largest, Math.round(Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1] ?? 0) / 1024));
    } catch {
      // gone meanwhile
    }
  }
  return largest;
}

/** The machine's CPU time so far, busy and in all, in clock ticks, from /proc/stat (Linux; elsewhere undefined). */
function cpuTicks(): { busy: number; total: number } | undefined {
  try {
    const fields = /^cpu\s+(.*)$/m.exec(readFileSync('/proc/stat', 'utf8'))![1]!.trim().split(/\s+/).map(Number);
    const total = fields.reduce((a, b) => a + b, 0);
    // idle and iowait are the 4th and 5th fields.
    return { busy: total - fields[3]! - (fields[4] ?? 0), total };
  } catch {
    return undefined;
  }
}

/**
 * Every file's wall time, slowest first, as a block of lines (what a run's time went to), with how busy the whole
 * machine's cores were meanwhile: a long file at a low figure waits on clocks, one near 100% computes.
 */
function wallTimes(wallMs: ReadonlyMap<string, number>, busy: ReadonlyMap<string, number>): string {
  if (wallMs.size === 0) return '';
  const rows = [...wallMs].sort((a, b) => b[1] - a[1]);
  const total = rows.reduce((sum, [, ms]) => sum + ms, 0);
  const width = Math.max(...rows.map(([id]) => relative(process.cwd(), id).length));
  const cpu = (id: string): string => (busy.has(id) ? `  cpu ${String(Math.round(100 * busy.get(id)!)).padStart(3)}%` : '');
  return (
    `\nwall time per file (${rows.length} files, ${(total / 1000).toFixed(1)} s added up; cpu: the machine's cores busy meanwhile):\n` +
    rows.map(([id, ms]) => `  ${relative(process.cwd(), id).padEnd(width)}  ${(ms / 1000).toFixed(1).padStart(7)} s${cpu(id)}`).join('\n') +
    '\n'
  );
}

/** Vitest's error when a test worker's process died under it (its cause, as the run's unhandled error carries it). */
const WORKER_EXITED = 'Worker exited unexpectedly';

/**
 * A failed file whose every error, of its tests and its own, is a test kit child's native crash (testkit/src/crash.ts:
 * a miner process that died of SIGSEGV under @roamhq/wrtc): no assertion of it failed.
 */
function onlyNativeCrashes(module: TestModule): boolean {
  const errors = [...module.errors(), ...[...module.children.allTests()].flatMap((t) => t.result().errors ?? [])];
  return errors.length > 0 && errors.every((e) => e.message.startsWith(NATIVE_CRASH));
}

/**
 * Names, as the very last lines of a run, each test file that did not pass, and how far it got.
 *
 * The default reporter prints a failed assertion beside its file, but an error outside any test
 * (a test worker that exited: a native crash, memory) only as "Worker exited unexpectedly", with no
 * file, and CI keeps only the tail of the output. Here the file is named where the tail shows it,
 * with the largest resident memory its worker process was seen at (sampled every 5 s), which tells
 * a worker that ran out of memory from one that crashed.
 */
export default class OutcomesReporter implements Reporter {
  private readonly started = new Map<string, number>();
  /** The machine's CPU ticks when each file started, and the share of them busy while it ran. */
  private readonly ticksAtStart = new Map<string, { busy: number; total: number }>();
  private readonly busy = new Map<string, number>();
  /** Each file's wall time (ms), from its start to its end as this process saw them. */
  private readonly wallMs = new Map<string, number>();
  /** Largest worker RSS seen while each file ran (files run one at a time: fileParallelism false). */
  private readonly peakRss = new Map<string, number>();
  private running: string | undefined;
  private timer: NodeJS.Timeout | undefined;

  onTestRunStart(): void {
    this.timer = setInterval(() => this.sample(), 5_000);
    this.timer.unref();
  }

  /** Called as a file's worker begins to import it: its wall time counts its imports too. */
  onTestModuleQueued(module: TestModule): void {
    this.started.set(module.moduleId, Date.now());
    const ticks = cpuTicks();
    if (ticks) this.ticksAtStart.set(module.moduleId, ticks);
  }

  onTestModuleStart(module: TestModule): void {
    if (!this.started.has(module.moduleId)) this.onTestModuleQueued(module);
    this.running = module.moduleId;
  }

  onTestModuleEnd(module: TestModule): void {
    this.sample();
    const since = this.started.get(module.moduleId);
    if (since !== undefined) this.wallMs.set(module.moduleId, Date.now() - since);
    const [from, to] = [this.ticksAtStart.get(module.moduleId), cpuTicks()];
    if (from && to && to.total > from.total) this.busy.set(module.moduleId, (to.busy - from.busy) / (to.total - from.total));
    if (this.running === module.moduleId) this.running = undefined;
  }

  private sample(): void {
    if (this.running === undefined) return;
    this.peakRss.set(this.running, Math.max(this.peakRss.get(this.running) ?? 0, largestChildRss()));
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<SerializedError> = []): void {
    clearInterval(this.timer);
    const lines: string[] = [];
    /** Files cut short by their worker's death or a child's native crash, no assertion of theirs failed (scripts/vitest-run.sh runs them once more). */
    const crashed: string[] = [];
    let otherwise = false;
    let workerDied = false;
    for (const module of modules) {
      const state = module.state();
      if (state === 'passed' || state === 'skipped') continue;
      const counts = new Map<string, number>();
      for (const t of module.children.allTests()) counts.set(t.result().state, (counts.get(t.result().state) ?? 0) + 1);
      if (state === 'pending' && !counts.has('failed') && module.errors().length === 0) {
        crashed.push(relative(process.cwd(), module.moduleId));
        workerDied = true;
      } else if (state === 'failed' && onlyNativeCrashes(module)) crashed.push(relative(process.cwd(), module.moduleId));
      else otherwise = true;
      const byState = [...counts].map(([s, n]) => `${n} ${s}`).join(', ') || 'none collected';
      const errors = module.errors().map((e) => e.message.split('\n')[0]);
      const since = this.started.get(module.moduleId);
      const peak = this.peakRss.get(module.moduleId);
      lines.push(
        `not passed: ${relative(process.cwd(), module.moduleId)} (${state}; tests: ${byState}` +
          (since === undefined ? '; never started' : `; started ${Math.round((Date.now() - since) / 1000)} s before the run ended`) +
          (peak === undefined ? '' : `; worker RSS peak ${peak} MiB`) +
          ')' +
          (errors.length > 0 ? `; errors: ${errors.join(' | ')}` : ''),
      );
    }
    process.stdout.write(wallTimes(this.wallMs, this.busy));
    if (lines.length > 0) process.stdout.write(`\n${lines.join('\n')}\n`);
    // Only a run whose every unpassed file was cut short by a worker that exited or failed only by a child's native
    // crash (NATIVE_CRASH), and whose every unhandled error is a worker's exit, names them for scripts/vitest-run.sh:
    // a failed assertion, or any other error, is never run again.
    const workerExits = unhandledErrors.every((e) => [e.message, (e as { cause?: { message?: string } }).cause?.message].some((m) => m?.includes(WORKER_EXITED)));
    const file = process.env.TAH_VITEST_CRASHED;
    if (file) writeFileSync(file, !otherwise && workerExits && (!workerDied || unhandledErrors.length > 0) ? crashed.join('\n') : '');
  }
}
