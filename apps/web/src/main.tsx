import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import { App } from './App';
import type { FusionCurveResult, LocalBenchResult, LossCurveOptions, StageStepsResult } from './tab/bench';
import type { FromTabWorker, TabBackend, ToTabWorker } from './tab/messages';
import type { StageRound, StageRoundInputs, SyntheticStageOptions } from '@train-at-home/swarm';
import './style.css';

/** One command in a fresh tab worker (the benchmarks' way in): resolves with the result its answer carries. */
function inFreshWorker<T>(command: ToTabWorker, answer: 'bench' | 'stage-round' | 'stage-steps' | 'fusion-curve'): Promise<T> {
  const worker = new Worker(new URL('./tab/worker.ts', import.meta.url), { type: 'module' });
  return new Promise<T>((resolve, reject) => {
    worker.addEventListener('message', (e: MessageEvent<FromTabWorker>) => {
      if (e.data?.ev !== answer) return;
      worker.terminate();
      const { result, error } = e.data as { result?: T; error?: string };
      if (result) resolve(result);
      else reject(new Error(error));
    });
    worker.postMessage(command);
  });
}

/** bench/browser drives this: the whole model in a fresh worker on one backend. */
const benchLocal = (o: { backend: TabBackend; preset: 'tiny' | 'small'; steps: number; batch: number }): Promise<LocalBenchResult> => inFreshWorker({ cmd: 'bench', ...o }, 'bench');
/** bench/backend-spread drives this: one stage's round on given inputs, in a fresh worker on one backend (audit/spread.ts). */
const stageRound = (backend: TabBackend, inputs: StageRoundInputs): Promise<StageRound> => inFreshWorker({ cmd: 'stage-round', backend, inputs }, 'stage-round');
/** bench/webgpu-dispatch drives this: a stage's microbatches in a fresh worker, GPU calls counted per step. */
const stageSteps = (backend: TabBackend, options: SyntheticStageOptions, warmup: number, steps: number): Promise<StageStepsResult> =>
  inFreshWorker({ cmd: 'stage-steps', backend, options, warmup, steps }, 'stage-steps');
/** e2e/webgpu.test.ts drives this: a stage's loss curve on WebGPU without, then with, the tab's fused programs. */
const fusionCurve = (options: LossCurveOptions): Promise<FusionCurveResult> => inFreshWorker({ cmd: 'fusion-curve', options }, 'fusion-curve');
(window as unknown as { trainAtHomeBench?: object }).trainAtHomeBench = { benchLocal, stageRound, stageSteps, fusionCurve };

createRoot(document.getElementById('root')!).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
