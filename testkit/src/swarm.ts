import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { exitedBefore } from './crash';
import { forkInNetns } from './netns';
import type { PeerPathStats } from '@train-at-home/swarm';
import type { CheatName } from './cheats';

const ENTRY = fileURLToPath(new URL('./swarm-process.ts', import.meta.url));

export interface SwarmMinerStats {
  minerId: string;
  microbatches: number;
  computeMs: number;
  merges: number;
  flagged?: { kind: string; reason: string };
  /** Each peer's path and bytes (PeerMesh.paths). */
  paths: Array<[string, PeerPathStats]>;
}

/** Miners in child processes (swarm-process.ts), several per process, for tests at a scale one process cannot run. */
export class MinerSwarm {
  private readonly children: ChildProcess[] = [];
  private stopping = false;

  /**
   * Starts `counts[i]` miners in process i (inside network namespace `netns[i]` where one is named: netns.ts);
   * resolves with every miner's id and stage once all registered. `preferDirectPeers: false` turns path quality off (bench:paths' "before").
   */
  async start(url: string, counts: number[], netns: Array<string | undefined> = [], options: { preferDirectPeers?: boolean } = {}): Promise<Array<{ minerId: string; stage: number }>> {
    const ready = counts.map((count, i) => {
      const env = { TAH_SWARM: JSON.stringify({ url, count, ...options }) };
      const ns = netns[i];
      const child = ns ? forkInNetns(ns, ENTRY, env) : fork(ENTRY, [], { execArgv: ['--import', 'tsx'], env: { ...process.env, ...env }, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      this.children.push(child);
      // A miner process that dies before stop() says how (a native crash shows as a signal), for the log of the test that loses it.
      child.once('exit', (code, signal) => {
        if (!this.stopping) console.error(`miner swarm: process ${i} (pid ${child.pid}) exited with ${signal ? `signal ${signal}` : `code ${code}`} before the swarm was stopped`);
      });
      return this.next<{ ready: Array<{ minerId: string; stage: number }> }>(child, 'ready');
    });
    return (await Promise.all(ready)).flatMap((r) => r.ready);
  }

  /** Turns miners into cheats (by id), from now on. */
  async assign(cheats: Record<string, CheatName>): Promise<void> {
    await Promise.all(this.children.map((c) => { const done = this.next(c, 'assigned'); c.send({ assign: cheats }); return done; }));
  }

  async stats(): Promise<SwarmMinerStats[]> {
    const all = await Promise.all(this.children.map((c) => { const done = this.next<{ stats: SwarmMinerStats[] }>(c, 'stats'); c.send({ stats: true }); return done; }));
    return all.flatMap((a) => a.stats);
  }

  private next<T>(child: ChildProcess, key: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const onMessage = (m: Record<string, unknown>): void => {
        if (!(key in m)) return;
        child.off('message', onMessage);
        child.off('exit', onExit);
        resolve(m as T);
      };
      const onExit = (code: number | null, signal: NodeJS.Signals | null): void => reject(exitedBefore('a miner swarm process', child, key, code, signal));
      child.on('message', onMessage);
      child.once('exit', onExit);
    });
  }

  stop(): void {
    this.stopping = true;
    for (const c of this.children) if (c.exitCode === null) c.kill('SIGTERM');
  }
}
