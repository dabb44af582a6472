import { fork, type ChildProcess } from 'node:child_process';
import { exitedBefore } from './crash';

/**
 * A TypeScript module in a child process inside network namespace `ns` (made by scripts/nat-lab.sh),
 * with an IPC channel: fork() runs `ip netns exec <ns> node --import tsx <entry>`, and the channel's
 * descriptor survives the exec.
 */
export function forkInNetns(ns: string, entry: string, env: Record<string, string>): ChildProcess {
  return fork(entry, [], {
    execPath: 'ip',
    execArgv: ['netns', 'exec', ns, process.execPath, '--import', 'tsx'],
    env: { ...process.env, ...env },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
}

/** The next IPC message of `child` that has `key`; rejects if the child exits first or `timeoutMs` passes. */
export function nextMessage<T>(child: ChildProcess, key: string, timeoutMs = 60_000): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => done(new Error(`no '${key}' from the child within ${timeoutMs} ms`)), timeoutMs);
    const onMessage = (m: Record<string, unknown>): void => {
      if (m && typeof m === 'object' && key in m) done(undefined, m as T);
    };
    const onExit = (code: number | null, signal: NodeJS.Signals | null): void => done(exitedBefore('the child', child, key, code, signal));
    const done = (e?: Error, value?: T): void => {
      clearTimeout(timer);
      child.off('message', onMessage);
      child.off('exit', onExit);
      if (e) reject(e);
      else resolve(value!);
    };
    child.on('message', onMessage);
    child.once('exit', onExit);
  });
}

/** Sends a request and waits for the answer under the same key. */
export async function ask<T>(child: ChildProcess, key: string, body: unknown = true, timeoutMs?: number): Promise<T> {
  const answer = nextMessage<Record<string, T>>(child, key, timeoutMs);
  child.send({ [key]: body });
  return (await answer)[key]!;
}
