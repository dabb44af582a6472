import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import { App } from './App';
import type { LocalBenchResult } from './tab/bench';
import type { FromTabWorker, TabBackend } from './tab/messages';
import type { StageRound, StageRoundInputs } from '@train-at-home/swarm';
import './style.css';

/** bench/browser drives this: the whole model in a fresh worker on one backend. */
function benchLocal(o: { backend: TabBackend; preset: 'tiny' | 'small'; steps: number; batch: number }): Promise<LocalBenchResult> {
  const worker = new Worker(new URL('./tab/worker.ts', import.meta.url), { type: 'module' });
  return new Promise<LocalBenchResult>((resolve, reject) => {
    worker.addEventListener('message', (e: MessageEvent<FromTabWorker>) => {
      if (e.data?.ev !== 'bench') return;
      worker.terminate();
      if (e.data.result) resolve(e.data.result);
      else reject(new Error(e.data.error));
    });
    worker.postMessage({ cmd: 'bench', ...o });
  });
}
/** bench/backend-spread drives this: one stage's round on given inputs, in a fresh worker on one backend (audit/spread.ts). */
function stageRound(backend: TabBackend, inputs: StageRoundInputs): Promise<StageRound> {
  const worker = new Worker(new URL('./tab/worker.ts', import.meta.url), { type: 'module' });
  return new Promise<StageRound>((resolve, reject) => {
    worker.addEventListener('message', (e: MessageEvent<FromTabWorker>) => {
      if (e.data?.ev !== 'stage-round') return;
      worker.terminate();
      if (e.data.result) resolve(e.data.result);
      else reject(new Error(e.data.error));
    });
    worker.postMessage({ cmd: 'stage-round', backend, inputs });
  });
}
(window as unknown as { trainAtHomeBench?: object }).trainAtHomeBench = { benchLocal, stageRound };

createRoot(document.getElementById('root')!).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
