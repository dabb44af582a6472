import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { App } from '@train-at-home/server/app';
import { pollUntil } from './poll';

export { localMiner } from './local-miner';
export { listeningCoordinator } from './coordinator';

const MINER_CLI = fileURLToPath(new URL('../../apps/miner/src/main.ts', import.meta.url));

export interface MinerProcess {
  child: ChildProcess;
  output: string;
}

/** Real miner processes (the CLI) for integration tests, killed at the end. */
export class MinerProcesses {
  readonly all: MinerProcess[] = [];

  constructor(private readonly app: () => App) {}

  async activeMiners(): Promise<number> {
    return (await this.app().fastify.inject({ method: 'GET', url: '/api/status' })).json().activeMiners;
  }

  /** Starts one miner process and waits until the coordinator counts it. */
  async start(port: number, extraArgs: string[] = []): Promise<MinerProcess> {
    return (await this.startMany(port, 1, extraArgs))[0]!;
  }

  /**
   * Starts `count` miner processes at once (each takes seconds to load its code and backend: one after another, that
   * was most of a test's set-up) and waits until the coordinator counts all of them; which stage each took is in its output.
   */
  async startMany(port: number, count: number, extraArgs: string[] = []): Promise<MinerProcess[]> {
    const before = await this.activeMiners();
    const started = Array.from({ length: count }, () => {
      const child = spawn(process.execPath, ['--import', 'tsx', MINER_CLI, '--coordinator', `http://127.0.0.1:${port}`, ...extraArgs], {
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      const proc: MinerProcess = { child, output: '' };
      child.stdout!.on('data', (c: Buffer) => (proc.output += c.toString()));
      this.all.push(proc);
      return proc;
    });
    await pollUntil(`the coordinator to count ${before + count} active miners`, () => this.activeMiners(), (n) => n === before + count, { timeoutMs: 50_000 + 10_000 * count, intervalMs: 200 });
    return started;
  }

  killAll(): void {
    for (const p of this.all) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  }
}

/** Training-loss reports the coordinator recorded: how many, and whether any microbatch was counted twice. */
export async function lossReports(app: App): Promise<{ values: number[]; reports: number; microbatches: number }> {
  const rows = await app.db.query<{ value: number; activation_id: string }>(
    `SELECT value, activation_id FROM metrics WHERE run_id = $1 AND name = 'train_loss' ORDER BY created_at`,
    [app.coordinator.runId],
  );
  return { values: rows.map((r) => r.value), reports: rows.length, microbatches: new Set(rows.map((r) => r.activation_id)).size };
}

export const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
