/**
 * The NAT lab, started (scripts/nat-lab.sh): a public namespace with Debian's coturn and a coordinator
 * (nat-coordinator.ts), two homes behind their own NATs, and miners' meshes started in the
 * homes (nat-peer.ts). For server/test/nat.test.ts and bench/paths.ts. Needs root.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { IceConfig } from '@train-at-home/protocol';
import type { NetworkSettings } from '@train-at-home/server/network';
import { forkInNetns, nextMessage } from './netns';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
/** Where the coordinator and coturn listen, in the public namespace. */
export const PUBLIC = '100.64.0.1';

export type NatMode = 'eim' | 'symmetric' | 'udp-blocked';

export interface LabPeer {
  child: ChildProcess;
  minerId: string;
  ice: IceConfig;
}

export interface NatLab {
  /** The namespaces' prefix: `${prefix}-home1`, … */
  prefix: string;
  url: string;
  secret: string;
  coordinator: ChildProcess;
  /** Sets the NAT of home `n`. */
  nat(n: 1 | 2, mode: NatMode): void;
  /** A registered miner's mesh in home `n` (all frames through the coordinator with relayOnly). */
  peer(home: 1 | 2, options?: { relayOnly?: boolean }): Promise<LabPeer>;
  close(): void;
}

/** `webRoot`: the built web app, served by the lab's coordinator for browser tabs (e2e/nat.test.ts). */
export async function startNatLab(prefix: string, network: Partial<NetworkSettings> = {}, options: { webRoot?: string } = {}): Promise<NatLab> {
  const lab = (...args: string[]): void => void execFileSync('bash', [`${ROOT}scripts/nat-lab.sh`, ...args], { stdio: 'inherit' });
  const secret = `lab-secret-${process.pid}`;
  const children: ChildProcess[] = [];
  lab('up', prefix);
  const close = (): void => {
    for (const c of children) c.kill('SIGKILL');
    lab('down', prefix);
  };
  try {
    const coturn = spawn('ip', ['netns', 'exec', `${prefix}-pub`, 'bash', `${ROOT}scripts/coturn.sh`, PUBLIC, '3478', '49160-49260'], {
      env: { ...process.env, TURN_SECRET: secret },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    children.push(coturn);
    let log = '';
    await new Promise<void>((resolve, reject) => {
      coturn.stdout!.on('data', (d: Buffer) => {
        log += d.toString();
        if (log.includes('Relay ports initialization done')) resolve();
      });
      coturn.once('exit', (code) => reject(new Error(`coturn exited (${code}): ${log.slice(-2000)}`)));
    });
    const coordinator = forkInNetns(`${prefix}-pub`, fileURLToPath(new URL('./nat-coordinator.ts', import.meta.url)), {
      TAH_NAT_COORDINATOR: JSON.stringify({
        host: PUBLIC,
        ...(options.webRoot ? { webRoot: options.webRoot } : {}),
        network: {
          stun: [`stun:${PUBLIC}:3478`],
          turn: [`turn:${PUBLIC}:3478?transport=udp`, `turn:${PUBLIC}:3478?transport=tcp`],
          turnSecret: secret,
          turnTtlSeconds: 600,
          relay: { enabled: true, bytesPerMinute: 1024 * 1024 * 1024 },
          ...network,
        },
      }),
    });
    children.push(coordinator);
    const url = (await nextMessage<{ ready: string }>(coordinator, 'ready', 120_000)).ready;
    return {
      prefix,
      url,
      secret,
      coordinator,
      nat: (n, mode) => lab('nat', prefix, String(n), mode),
      async peer(home, options = {}) {
        const child = forkInNetns(`${prefix}-home${home}`, fileURLToPath(new URL('./nat-peer.ts', import.meta.url)), { TAH_NAT_PEER: JSON.stringify({ url, ...options }) });
        children.push(child);
        const { ready } = await nextMessage<{ ready: { minerId: string; ice: IceConfig } }>(child, 'ready', 60_000);
        return { child, ...ready };
      },
      close,
    };
  } catch (e) {
    close();
    throw e;
  }
}
