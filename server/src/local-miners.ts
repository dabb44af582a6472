import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { UNSUITABLE_BACKENDS } from '@train-at-home/model';
import { MINER_EXIT_REFUSED } from '@train-at-home/swarm';
import type { Coordinator } from './coordinator';

const MINER_CLI = fileURLToPath(new URL('../../apps/miner/src/main.ts', import.meta.url));

export interface LocalMinerOptions {
  /** Local miners at most (0: never start one, as a hosted coordinator should be). */
  max: number;
  /** With no other miner in the run for this long, local miners are stopped (nobody needs them). */
  idleStopMs: number;
}

export const DEFAULT_LOCAL_MINERS: LocalMinerOptions = { max: 0, idleStopMs: 60_000 };

/**
 * So that one person with one tab sees the run train: while anyone else
 * (a tab, a Node miner) is in the run and a stage has nobody, the coordinator
 * starts headless Node miners (the miner CLI) on its own machine, one per
 * empty stage, up to `max`. They register like any miner and are paid like
 * one. When nobody else has been in the run for `idleStopMs`, they are
 * stopped. A hosted deployment starts the coordinator with --local-miners 0.
 */
export class LocalMiners {
  private readonly children = new Set<ChildProcess>();
  /** Miner ids of the local miners that registered. */
  private readonly ids = new Map<ChildProcess, string>();
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
  }

  get running(): number {
    return this.children.size;
  }

  /** Miner ids of the local miners now registered. */
  get minerIds(): string[] {
    return [...this.ids.values()];
  }

  /** Called every second by the app. */
  async tick(): Promise<void> {
    if (!this.url || this.options.max <= 0 || this.busy || this.refused) return;
    this.busy = true;
    try {
      const map = await this.c.stageMap();
      const local = new Set(this.ids.values());
      const visitors = map.flatMap((s) => s.miners).filter((m) => !local.has(m.id));
      if (visitors.length > 0) this.lastVisitorAt = Date.now();
      else {
        if (this.children.size > 0 && Date.now() - this.lastVisitorAt > this.options.idleStopMs) this.stopAll();
        return;
      }
      const empty = map.filter((s) => s.miners.length === 0).length;
      const pending = this.children.size - this.ids.size; // started, not registered yet
      const start = Math.min(empty - pending, this.options.max - this.children.size);
      for (let i = 0; i < start; i++) this.spawn();
    } finally {
      this.busy = false;
    }
  }

  private spawn(): void {
    // A run that WASM cannot train (the gpu preset) is filled from this machine's GPU, if it has one.
    const backend = UNSUITABLE_BACKENDS[this.c.run.preset]?.includes('wasm') ? 'webgpu' : 'wasm';
    const child = fork(MINER_CLI, ['--coordinator', this.url!, '--backend', backend], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
    this.children.add(child);
    this.c.log.info({ pid: child.pid }, 'starting a local miner for a stage nobody holds');
    child.on('message', (m: { registered?: unknown }) => {
      if (typeof m?.registered === 'string') this.ids.set(child, m.registered);
    });
    child.once('exit', (code) => {
      this.children.delete(child);
      this.ids.delete(child);
      if (code === MINER_EXIT_REFUSED && !this.refused) {
        this.refused = true;
        this.c.log.warn(`a local miner was refused (its stderr says why): no more are started; stages wait for participants (${this.c.run.preset} preset)`);
      }
    });
  }

  stopAll(): void {
    for (const child of this.children) child.kill('SIGTERM');
  }

  async close(): Promise<void> {
    const exits = [...this.children].map((c) => new Promise((r) => c.once('exit', r)));
    this.stopAll();
    await Promise.race([Promise.all(exits), new Promise((r) => setTimeout(r, 5000))]);
  }
}
