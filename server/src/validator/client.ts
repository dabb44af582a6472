import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { FastifyBaseLogger } from 'fastify';
import type { RunConfig } from '../run-config';
import { tsxExecArgv } from '../tsx-loader';
import { ValidatorError } from './compute';
import type { ValidatorJob } from './jobs';

const ENTRY = fileURLToPath(new URL('./process.ts', import.meta.url));

/**
 * The validator process's entry and Node flags: process.ts through tsx, or, where the coordinator runs
 * bundled (scripts/device-swarm-bundle.sh), the bundled entry TAH_VALIDATOR_ENTRY names, run as it is.
 */
export function validatorEntry(env: NodeJS.ProcessEnv = process.env): { entry: string; execArgv: string[] } {
  const bundled = env.TAH_VALIDATOR_ENTRY;
  return bundled ? { entry: bundled, execArgv: [] } : { entry: ENTRY, execArgv: tsxExecArgv() };
}
/**
 * A job the validator has not answered this long after it began running fails (the process is then
 * restarted). Counted from the job's start, not from when it was sent: a job waiting behind a queue
 * of audits is not a wedged validator.
 */
export const VALIDATOR_JOB_TIMEOUT_MS = 120_000;
/** After the process exits unasked, it is started again after this pause… */
export const VALIDATOR_RESTART_MS = 500;
/** …doubled each time it died before it was ready, up to this. */
export const VALIDATOR_MAX_RESTART_MS = 30_000;

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  /** Armed when the process says the job began (`started`). */
  timer?: ReturnType<typeof setTimeout>;
  arm: () => void;
  kind: ValidatorJob['kind'];
  /** When the process said it began. */
  startedAt?: number;
}

/**
 * The coordinator's handle on its validator process: starts it on the first
 * job (Node with tsx, like the miners, or the bundled entry TAH_VALIDATOR_ENTRY names), sends jobs and matches answers, fails every job in
 * flight by name when the process dies, and starts it again. Nothing the
 * validator computes blocks the coordinator's event loop.
 */
export class ValidatorProcess {
  private child?: ChildProcess;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private closed = false;
  private ready!: Promise<void>;
  /** Releases whoever waits on `ready` (also when the process dies first: they then wait for the next one). */
  private release?: () => void;
  /** Stage weights (by stage and hash) this process has been sent: not sent again. */
  readonly known = new Set<string>();
  private isReady: () => boolean = () => false;
  /** Whether a validator process is up and answering now (not starting or restarting). */
  get up(): boolean {
    return this.isReady();
  }
  private restartMs = VALIDATOR_RESTART_MS;
  /** Called as each job is sent (for operators' metrics, and tests that kill the validator mid-job). */
  onJob?: (kind: ValidatorJob['kind'], pid: number | undefined) => void;
  /**
   * Milliseconds the process spent on each kind of job since the coordinator started, from each job's start to its
   * answer (it runs one at a time: their sum is the time it was busy). The operator's status line reads it.
   */
  readonly busyMs: Partial<Record<ValidatorJob['kind'], number>> = {};
  /** How many times the process was (re)started. */
  starts = 0;

  constructor(
    private readonly run: RunConfig,
    private readonly log: FastifyBaseLogger,
    /** Where the run's dataset is prepared (the coordinator's data root); unset: ./data (DATA_DIR). */
    private readonly dataRoot?: string,
  ) {}

  private start(): void {
    this.starts++;
    this.known.clear();
    const { entry, execArgv } = validatorEntry();
    const child = fork(entry, [], {
      execArgv,
      // A process group of its own: Ctrl-C in the operator's terminal reaches the coordinator, which stops it (and a
      // coordinator that dies leaves it its IPC channel's disconnect, on which it exits), not both at once, which
      // failed the job under way as if the validator had crashed.
      detached: true,
      env: { ...process.env, TAH_VALIDATOR_RUN: JSON.stringify(this.run), ...(this.dataRoot ? { TAH_VALIDATOR_DATA_ROOT: this.dataRoot } : {}) },
      serialization: 'advanced',
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    this.child = child;
    let isReady = false;
    this.ready = new Promise<void>((resolve) => {
      this.release = resolve;
      const onReady = (m: { ready?: boolean }): void => {
        if (m?.ready) {
          child.off('message', onReady);
          isReady = true;
          this.restartMs = VALIDATOR_RESTART_MS;
          resolve();
        }
      };
      child.on('message', onReady);
    });
    this.isReady = () => isReady && this.child === child;
    child.on('message', (m: { id?: number; started?: boolean; ok?: boolean; result?: unknown; error?: { code: string; message: string } }) => {
      if (typeof m?.id !== 'number') return;
      const p = this.pending.get(m.id);
      if (!p) return;
      if (m.started) {
        p.startedAt = Date.now();
        return p.arm();
      }
      this.pending.delete(m.id);
      clearTimeout(p.timer);
      if (p.startedAt !== undefined) this.busyMs[p.kind] = (this.busyMs[p.kind] ?? 0) + Date.now() - p.startedAt;
      if (m.ok) p.resolve(m.result);
      else p.reject(new ValidatorError((m.error?.code ?? 'BAD_JOB') as ValidatorError['code'], m.error?.message ?? 'failed'));
    });
    child.once('exit', (code, signal) => {
      if (this.child !== child) return;
      this.child = undefined;
      this.release?.();
      for (const [id, p] of this.pending) {
        clearTimeout(p.timer);
        if (p.startedAt !== undefined) this.busyMs[p.kind] = (this.busyMs[p.kind] ?? 0) + Date.now() - p.startedAt;
        p.reject(
          this.closed
            ? new ValidatorError('VALIDATOR_CLOSED', `the validator was stopped with the coordinator during job ${id}`)
            : new ValidatorError('VALIDATOR_EXITED', `the validator process exited (${signal ?? code}) during job ${id}`),
        );
      }
      this.pending.clear();
      if (this.closed) return;
      this.log.warn({ code, signal, restartMs: this.restartMs }, 'validator process exited; starting it again');
      setTimeout(() => !this.closed && this.start(), this.restartMs).unref();
      if (!isReady) this.restartMs = Math.min(VALIDATOR_MAX_RESTART_MS, this.restartMs * 2);
    });
  }

  /** Sends a job and waits for its answer; a rejection names why (VALIDATOR_EXITED, VALIDATOR_TIMEOUT, or the job's own error). */
  async request<T>(job: ValidatorJob, timeoutMs = VALIDATOR_JOB_TIMEOUT_MS): Promise<T> {
    if (this.closed) throw new ValidatorError('VALIDATOR_CLOSED', 'the validator is closed');
    await this.whenReady();
    const child = this.child;
    if (!child?.connected) throw new ValidatorError('VALIDATOR_EXITED', 'the validator process is restarting');
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const p: Pending = {
        kind: job.kind,
        resolve: resolve as (v: unknown) => void,
        reject,
        arm: () => {
          clearTimeout(p.timer);
          p.timer = setTimeout(() => {
            this.pending.delete(id);
            reject(new ValidatorError('VALIDATOR_TIMEOUT', `no answer to job ${id} (${job.kind}) ${timeoutMs} ms after it began`));
            child.kill('SIGKILL'); // a wedged validator is restarted
          }, timeoutMs);
        },
      };
      this.pending.set(id, p);
      child.send({ id, job });
      this.onJob?.(job.kind, child.pid);
    });
  }

  /** Resolves once the current process has loaded its data (restarted processes included); starts it on first use. */
  async whenReady(): Promise<void> {
    if (this.starts === 0) this.start();
    for (;;) {
      if (this.closed) throw new ValidatorError('VALIDATOR_CLOSED', 'the validator is closed');
      await this.ready;
      if (this.isReady()) return;
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** For tests and drills: kills the process as a crash would; it is started again. */
  kill(): void {
    this.child?.kill('SIGKILL');
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  async close(): Promise<void> {
    this.closed = true;
    const child = this.child;
    if (!child) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    await Promise.race([exited, new Promise((r) => setTimeout(r, 3000))]);
    if (child.exitCode === null) child.kill('SIGKILL');
  }
}
