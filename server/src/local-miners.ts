import { fork, type ChildProcess } from 'node:child_process';
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { UNSUITABLE_BACKENDS } from '@train-at-home/model';
import { MINER_EXIT_REFUSED } from '@train-at-home/swarm';
import type { Coordinator } from './coordinator';
import { tsxExecArgv } from './tsx-loader';

const MINER_CLI = fileURLToPath(new URL('../../apps/miner/src/main.ts', import.meta.url));

export interface LocalMinerOptions {
  /** Local miners at most (0: never start one, as a hosted coordinator should be). */
  max: number;
  /** With no other miner in the run for this long, local miners are stopped (nobody needs them). */
  idleStopMs: number;
  /**
   * Where the local miners' process ids and miner ids are kept (main.ts: beside the database), so
   * that a restarted coordinator takes over the ones still running instead of starting new ones.
   */
  stateFile?: string;
}

export const DEFAULT_LOCAL_MINERS: LocalMinerOptions = { max: 0, idleStopMs: 60_000 };

/** A local miner whose stage someone else holds this long is stopped (see `stopSurplus`). */
export const SURPLUS_STOP_MS = 10_000;

/**
 * So that one person with one tab sees the run train: while anyone else
 * (a tab, a Node miner) is in the run and a stage has nobody, the coordinator
 * starts headless Node miners (the miner CLI) on its own machine, one per
 * empty stage, up to `max`. They register like any miner and are paid like
 * one. When nobody else has been in the run for `idleStopMs`, they are
 * stopped. A hosted deployment starts the coordinator with --local-miners 0.
 *
 * A coordinator restart keeps them: they run in process groups of their own
 * (Ctrl-C on the coordinator does not reach them), the coordinator's own
 * shutdown leaves them (`close(true)`), and each reconnects to the restarted
 * coordinator with its weights, stage and WebRTC peers, like any miner. The
 * restarted coordinator reads who they are from `stateFile` and takes them
 * over. Measured in e2e/newcomer.test.ts: killed and started afresh, local
 * miners took 15-20 s (process start, registration, checkpoint, new WebRTC
 * links) before the first microbatch went through again. A local miner whose
 * coordinator does not come back exits on its own (apps/miner: ORPHAN_GRACE_MS).
 */
export class LocalMiners {
  private readonly children = new Set<ChildProcess>();
  /** Miner ids of the local miners that registered. */
  private readonly ids = new Map<ChildProcess, string>();
  /** Local miners a previous coordinator process started and that still run: process id → miner id. */
  private readonly adopted = new Map<number, string>();
  private url?: string;
  private lastVisitorAt = Date.now();
  private busy = false;
  /** A local miner was refused for good (this machine cannot train the run's preset): none is started again. */
  refused = false;

  constructor(
    private readonly c: Coordinator,
    readonly options: LocalMinerOptions,
  ) {}

  /** Begins filling stages, now that the coordinator listens at `url` (a loopback address for its own machine), with up to `max` miners. */
  start(url: string, max = this.options.max): void {
    this.url = url;
    this.options.max = max;
    this.adopt();
  }

  get running(): number {
    return this.children.size + this.adopted.size;
  }

  /** Miner ids of the local miners now registered. */
  get minerIds(): string[] {
    return [...this.ids.values(), ...this.adopted.values()];
  }

  /** Takes over the local miners of the previous coordinator process that still run. */
  private adopt(): void {
    if (!this.options.stateFile) return;
    let saved: Array<{ pid: number; minerId: string }> = [];
    try {
      saved = JSON.parse(readFileSync(this.options.stateFile, 'utf8')) as typeof saved;
    } catch (err) {
      this.c.log.info({ err: (err as Error).message }, 'no local miners recorded by a previous coordinator process');
      return;
    }
    const recorded = Array.isArray(saved) ? saved : [];
    for (const { pid, minerId } of recorded) {
      if (Number.isSafeInteger(pid) && typeof minerId === 'string' && isLocalMiner(pid)) this.adopted.set(pid, minerId);
    }
    this.c.log.info({ recorded: recorded.length, running: this.adopted.size }, 'taking over the local miners still running from before the restart');
    this.save();
  }

  /** What `save` last wrote. */
  private saved?: string;

  /**
   * Records the local miners that registered (pid and miner id) for the next coordinator process. Written
   * whole or not at all (a new file renamed over the old): the coordinator's shutdown writes it, and a
   * process killed mid-write (a second signal, a service manager's SIGKILL) left an empty file, so the
   * restarted coordinator took over none and started new miners beside the old ones.
   */
  private save(): void {
    if (!this.options.stateFile) return;
    const entries = [...[...this.ids].map(([child, minerId]) => ({ pid: child.pid!, minerId })), ...[...this.adopted].map(([pid, minerId]) => ({ pid, minerId }))];
    const text = JSON.stringify(entries);
    if (text === this.saved) return;
    try {
      writeFileSync(`${this.options.stateFile}.new`, text);
      renameSync(`${this.options.stateFile}.new`, this.options.stateFile);
      this.saved = text;
    } catch (err) {
      this.c.log.warn({ err }, 'could not record the local miners');
    }
  }

  /** Called every second by the app. */
  async tick(): Promise<void> {
    if (!this.url || this.options.max <= 0 || this.busy || this.refused) return;
    this.busy = true;
    try {
      for (const pid of this.adopted.keys()) if (!alive(pid)) (this.adopted.delete(pid), this.save());
      const map = await this.c.stageMap();
      const local = new Set(this.minerIds);
      const visitors = map.flatMap((s) => s.miners).filter((m) => !local.has(m.id));
      if (visitors.length > 0) this.lastVisitorAt = Date.now();
      else {
        if (this.children.size > 0 && Date.now() - this.lastVisitorAt > this.options.idleStopMs) this.stopAll();
        return;
      }
      this.stopSurplus(map, local);
      const empty = map.filter((s) => s.miners.length === 0).length;
      // Started and not registered yet, or taken over after a restart and not back in the map yet:
      // each will hold a stage that looks empty now.
      const inMap = new Set(map.flatMap((s) => s.miners.map((m) => m.id)));
      const pending = this.children.size - this.ids.size + [...this.adopted.values()].filter((id) => !inMap.has(id)).length;
      const start = Math.min(empty - pending, this.options.max - this.running);
      for (let i = 0; i < start; i++) this.spawn();
    } finally {
      this.busy = false;
    }
  }

  /** Local miners found surplus, and since when (ms). */
  private readonly surplusSince = new Map<string, number>();

  /**
   * Local miners only fill stages nobody else holds. One on a stage that another
   * miner also holds (a visitor came back to it after a coordinator restart, or
   * two were started for one gap) mostly idles beside it, since between merges
   * each upstream miner keeps one partner: it is stopped once that has lasted
   * SURPLUS_STOP_MS (a visitor merely reconnecting is not a reason). Of several
   * local miners on one stage the first registered stays.
   */
  private stopSurplus(map: Array<{ miners: Array<{ id: string }> }>, local: Set<string>): void {
    const order = this.minerIds;
    const surplus = new Set<string>();
    for (const s of map) {
      const locals = s.miners.filter((m) => local.has(m.id)).sort((a, b) => order.indexOf(a.id) - order.indexOf(b.id));
      const othersHold = s.miners.length > locals.length;
      for (const m of othersHold ? locals : locals.slice(1)) surplus.add(m.id);
    }
    const now = Date.now();
    for (const id of this.surplusSince.keys()) if (!surplus.has(id)) this.surplusSince.delete(id);
    for (const id of surplus) {
      const since = this.surplusSince.get(id) ?? now;
      this.surplusSince.set(id, since);
      if (now - since < SURPLUS_STOP_MS) continue;
      this.c.log.info({ miner: id.slice(0, 8) }, 'stopping a local miner: another miner holds its stage');
      this.surplusSince.delete(id);
      this.stopMiner(id);
    }
  }

  private spawn(): void {
    // A run that WASM cannot train (the gpu preset) is filled from this machine's GPU, if it has one.
    const backend = UNSUITABLE_BACKENDS[this.c.run.preset]?.includes('wasm') ? 'webgpu' : 'wasm';
    // A process group of its own: Ctrl-C on the coordinator's terminal does not reach it (see the class comment).
    const child = fork(MINER_CLI, ['--coordinator', this.url!, '--backend', backend], { execArgv: tsxExecArgv(), stdio: ['ignore', 'ignore', 'inherit', 'ipc'], detached: true });
    this.children.add(child);
    this.c.log.info({ pid: child.pid }, 'starting a local miner for a stage nobody holds');
    child.on('message', (m: { registered?: unknown }) => {
      if (typeof m?.registered === 'string') {
        this.ids.set(child, m.registered);
        this.save();
      }
    });
    child.once('exit', (code) => {
      this.children.delete(child);
      if (this.ids.delete(child)) this.save();
      if (code === MINER_EXIT_REFUSED && !this.refused) {
        this.refused = true;
        this.c.log.warn(`a local miner was refused (its stderr says why): no more are started; stages wait for participants (${this.c.run.preset} preset)`);
      }
    });
  }

  stopAll(): void {
    for (const child of this.children) child.kill('SIGTERM');
    for (const pid of this.adopted.keys()) signal(pid);
    this.adopted.clear();
    this.save();
  }

  private stopMiner(id: string): void {
    const child = [...this.ids].find(([, mid]) => mid === id)?.[0];
    if (child) child.kill('SIGTERM');
    for (const [pid, mid] of this.adopted) if (mid === id) (signal(pid), this.adopted.delete(pid), this.save());
  }

  /**
   * The coordinator stops. `keep`: its local miners stay, for a restarted coordinator to take
   * over (main.ts on SIGINT/SIGTERM); otherwise they are stopped and waited for (up to 5 s).
   */
  async close(keep = false): Promise<void> {
    if (keep) {
      this.save();
      for (const child of this.children) {
        child.disconnect?.(); // its IPC channel: this process may now exit
        child.unref();
      }
      return;
    }
    const exits = [...this.children].map((c) => new Promise((r) => c.once('exit', r)));
    this.stopAll();
    await Promise.race([Promise.all(exits), new Promise((r) => setTimeout(r, 5000))]);
  }
}

/**
 * Whether `pid` is still one of our miner CLI processes: a process id is reused once its process
 * is gone, and a stranger must never be signalled. Linux only (/proc); elsewhere none is taken over.
 */
function isLocalMiner(pid: number): boolean {
  try {
    return alive(pid) && readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes(MINER_CLI);
  } catch {
    return false;
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function signal(pid: number): void {
  try {
    process.kill(pid, 'SIGTERM');
  } catch {
    // already gone
  }
}
