import type { MeshHost, PeerPathStats } from '@train-at-home/swarm';
import { useCallback, useEffect, useRef, useState } from 'react';
import { tabSeed } from './key';
import type { FromTabWorker, KernelCheck, ProbeOutcome, TabBackend, TabStatus, ToTabWorker } from './messages';

export interface TabState {
  joined: boolean;
  paused: boolean;
  probing?: { backend: TabBackend; done: number; total: number };
  probe?: ProbeOutcome;
  status?: TabStatus;
  /** This tab's miner identity (sr25519 public key, 0x hex, and its SS58 address), once the worker made it. */
  identity?: { publicKey: string; address: string };
  kernelCheck?: { result?: KernelCheck; error?: string };
  /** Each peer of this tab's mesh: whether it is reached directly, through TURN or through the coordinator, and the bytes each way. */
  paths?: Array<[string, PeerPathStats]>;
  notices: string[];
  error?: string;
}

const BACKENDS: TabBackend[] = ['webgpu', 'webgl', 'wasm'];

/**
 * The page's side of the tab miner: starts the worker, hosts its WebRTC mesh
 * and turns the worker's reports into state for the page.
 */
export interface Tab extends TabState {
  join(): void;
  pause(): void;
  resume(): void;
  leave(): void;
  setUploadCap(mbPerSec: number): void;
  loseDevice(): void;
  /** The miner identity's signature of a payout-link message (identity.sign('payout-link', { message })), made in the worker. */
  signPayoutLink(message: string): Promise<string>;
}

type Pending = { resolve(signature: string): void; reject(error: Error): void };

export function useTab(): Tab {
  const [state, setState] = useState<TabState>({ joined: false, paused: false, notices: [] });
  const worker = useRef<Worker | undefined>(undefined);
  const host = useRef<MeshHost | undefined>(undefined);
  const cap = useRef(0);
  const pending = useRef(new Map<number, Pending>());
  const nextRequest = useRef(1);
  /** Join was pressed and the mesh code is loading; cleared by Leave. */
  const starting = useRef(false);
  const send = (m: ToTabWorker): void => worker.current?.postMessage(m);

  const start = useCallback((hostMesh: typeof import('@train-at-home/swarm').hostMesh) => {
    const w = new Worker(new URL('./worker.ts', import.meta.url), { type: 'module' });
    worker.current = w;
    host.current = hostMesh(w, { uploadBytesPerSec: cap.current * 1e6 });
    w.addEventListener('message', (event: MessageEvent<FromTabWorker>) => {
      const m = event.data;
      if (!m || typeof m !== 'object' || !('ev' in m)) return;
      if (m.ev === 'payout-link-signed') {
        const p = pending.current.get(m.requestId);
        pending.current.delete(m.requestId);
        if (m.signature) p?.resolve(m.signature);
        else p?.reject(new Error(m.error ?? 'the tab could not sign'));
        return;
      }
      setState((s) => {
        switch (m.ev) {
          case 'probing':
            return { ...s, probing: m };
          case 'probe':
            return { ...s, probing: undefined, probe: m.outcome };
          case 'identity':
            return { ...s, identity: { publicKey: m.publicKey, address: m.address } };
          case 'status':
            return { ...s, status: m.status };
          case 'kernel-check':
            return { ...s, kernelCheck: m };
          case 'device-lost':
            return { ...s, notices: [...s.notices, `GPU device lost (${m.message}); now training on ${m.fallback}`].slice(-5) };
          case 'log':
            return { ...s, notices: [...s.notices, m.line].slice(-5) };
          case 'error':
            return { ...s, error: m.message };
          default:
            return s;
        }
      });
    });
    w.addEventListener('error', (e) => setState((s) => ({ ...s, error: e.message || 'the training worker failed' })));
    const asked = new URLSearchParams(location.search).get('backend') as TabBackend | null;
    send({ cmd: 'start', coordinatorUrl: location.origin, seed: tabSeed(), ...(asked && BACKENDS.includes(asked) ? { backend: asked } : {}) });
  }, []);

  const join = useCallback(() => {
    if (worker.current || starting.current) return;
    starting.current = true;
    setState((s) => ({ ...s, joined: true, paused: false, error: undefined }));
    // The page hosts the worker's WebRTC mesh; that code (the swarm package, tfjs with it) loads on Join, not with every page.
    import('@train-at-home/swarm').then(
      ({ hostMesh }) => {
        if (!starting.current) return; // left meanwhile
        starting.current = false;
        start(hostMesh);
      },
      (e: Error) => {
        starting.current = false;
        setState((s) => ({ ...s, joined: false, error: `could not load the miner: ${e.message}` }));
      },
    );
  }, [start]);

  const leave = useCallback(() => {
    starting.current = false;
    send({ cmd: 'leave' });
    host.current?.close();
    host.current = undefined;
    worker.current = undefined;
    for (const p of pending.current.values()) p.reject(new Error('the tab left the run'));
    pending.current.clear();
    // The identity stays known: the tab's seed does too, so joining again brings back the same miner (and its payout link).
    setState((s) => ({ joined: false, paused: false, notices: [], identity: s.identity }));
  }, []);

  useEffect(() => () => worker.current?.terminate(), []);

  // The page holds the mesh: its per-peer paths are read here every 2 s while the tab trains (as hostMesh tells its worker).
  useEffect(() => {
    if (!state.joined) return;
    const timer = setInterval(() => {
      const paths = host.current?.mesh?.paths();
      if (paths) setState((s) => ({ ...s, paths: [...paths] }));
    }, 2_000);
    return () => clearInterval(timer);
  }, [state.joined]);

  return {
    ...state,
    join,
    leave,
    pause: () => {
      send({ cmd: 'pause' });
      setState((s) => ({ ...s, paused: true }));
    },
    resume: () => {
      send({ cmd: 'resume' });
      setState((s) => ({ ...s, paused: false }));
    },
    setUploadCap: (mbPerSec) => {
      cap.current = mbPerSec;
      host.current?.setUploadCap(mbPerSec * 1e6);
    },
    loseDevice: () => send({ cmd: 'lose-device' }),
    signPayoutLink: (message) =>
      new Promise<string>((resolve, reject) => {
        if (!worker.current) return reject(new Error('this tab is not training: press Join on the Train page first'));
        const requestId = nextRequest.current++;
        pending.current.set(requestId, { resolve, reject });
        send({ cmd: 'sign-payout-link', requestId, message });
      }),
  };
}
