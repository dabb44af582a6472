import { hostMesh, type MeshHost } from '@train-at-home/swarm';
import { useCallback, useEffect, useRef, useState } from 'react';
import type { FromTabWorker, KernelCheck, ProbeOutcome, TabBackend, TabStatus, ToTabWorker } from './messages';

export interface TabState {
  joined: boolean;
  paused: boolean;
  probing?: { backend: TabBackend; done: number; total: number };
  probe?: ProbeOutcome;
  status?: TabStatus;
  kernelCheck?: { result?: KernelCheck; error?: string };
  notices: string[];
  error?: string;
}

/** This tab's identity seed: one miner per tab (sessionStorage), kept across reloads of the tab. */
function tabSeed(): string {
  let seed = sessionStorage.getItem('tah-seed');
  if (!seed) {
    seed = Array.from(crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, '0')).join('');
    sessionStorage.setItem('tah-seed', seed);
  }
  return seed;
}

const BACKENDS: TabBackend[] = ['webgpu', 'webgl', 'wasm'];

/**
 * The page's side of the tab miner: starts the worker, hosts its WebRTC mesh
 * and turns the worker's reports into state for the page.
 */
export function useTab(): TabState & { join(): void; pause(): void; resume(): void; leave(): void; setUploadCap(mbPerSec: number): void; loseDevice(): void } {
  const [state, setState] = useState<TabState>({ joined: false, paused: false, notices: [] });
  const worker = useRef<Worker | undefined>(undefined);
  const host = useRef<MeshHost | undefined>(undefined);
  const cap = useRef(0);
  const send = (m: ToTabWorker): void => worker.current?.postMessage(m);

  const join = useCallback(() => {
    if (worker.current) return;
    const w = new Worker(new URL('./worker.ts', import.meta.url), { type: 'module' });
    worker.current = w;
    host.current = hostMesh(w, { uploadBytesPerSec: cap.current * 1e6 });
    w.addEventListener('message', (event: MessageEvent<FromTabWorker>) => {
      const m = event.data;
      if (!m || typeof m !== 'object' || !('ev' in m)) return;
      setState((s) => {
        switch (m.ev) {
          case 'probing':
            return { ...s, probing: m };
          case 'probe':
            return { ...s, probing: undefined, probe: m.outcome };
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
    setState((s) => ({ ...s, joined: true, paused: false, error: undefined }));
  }, []);

  const leave = useCallback(() => {
    send({ cmd: 'leave' });
    host.current?.close();
    host.current = undefined;
    worker.current = undefined;
    setState({ joined: false, paused: false, notices: [] });
  }, []);

  useEffect(() => () => worker.current?.terminate(), []);

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
  };
}
