import { join } from 'node:path';
import { bigramBaseline } from '../bigram';
import type { BackendName } from '../backend';
import type { Precision } from '../codec';
import { PRESETS, type ModelConfig, type PresetName, type RunLayout } from '../config';
import { BatchSampler, evaluationBatches } from '../data/sampler';
import { LocalTrainer, type WireStats } from '../trainer';
import { initNodeBackend } from './backend';
import { DATA_DIR } from './paths';
import { datasetName, prepareData } from './prepare';
import { loadDataset } from './shards';

export interface LocalRunOptions {
  preset: PresetName;
  /** Overrides of the preset (for reduced benchmark budgets); vocabSize follows the dataset. */
  configOverrides?: Partial<Omit<ModelConfig, 'vocabSize'>>;
  stages: number;
  /** Boundary width b; defaults to dModel (no bottleneck). */
  bottleneck?: number;
  int8: boolean;
  /** The boundary codec (codec.ts); absent: int8 or fp32 as `int8` says. */
  codec?: Precision;
  gradientRounding?: 'nearest' | 'stochastic';
  /** 'webgpu' runs on a GPU through Dawn (falling back to WASM, saying why); default WASM. */
  backend?: BackendName;
  steps: number;
  batchSize: number;
  peakLr: number;
  warmupSteps?: number;
  seed?: number;
  /** Evaluate on the held-out split every this many steps (and at the end). */
  evalEvery?: number;
  /** Held-out batches of batchSize windows per evaluation. */
  evalBatches?: number;
  log?: (line: string) => void;
}

export interface LocalRunResult {
  config: ModelConfig;
  layout: RunLayout;
  heldOutLoss: number;
  bigramLoss: number;
  evaluations: Array<{ step: number; tokens: number; heldOutLoss: number }>;
  trainTokens: number;
  trainSeconds: number;
  tokensPerSec: number;
  wire: WireStats;
  backend: string;
}

/** Trains one model on the prepared data, all stages in this process, and reports held-out loss. */
export async function runLocalTraining(o: LocalRunOptions): Promise<LocalRunResult> {
  const log = o.log ?? (() => {});
  const backend = await initNodeBackend(o.backend ?? 'wasm', log);
  const preset = PRESETS[o.preset];
  prepareData({ outDir: DATA_DIR, vocabSize: preset.vocabSize, log });
  const data = loadDataset(join(DATA_DIR, datasetName(preset.vocabSize)));
  const config: ModelConfig = { ...preset, ...o.configOverrides, vocabSize: data.manifest.vocabSize };
  const layout: RunLayout = { stages: o.stages, bottleneck: o.bottleneck ?? config.dModel, int8: o.int8, ...(o.codec ? { codec: o.codec } : {}) };
  const bigram = bigramBaseline(data.train, data.heldOut, config.vocabSize);
  log(`bigram baseline (held-out): ${bigram.loss.toFixed(4)} nats/token`);

  const seed = o.seed ?? 1;
  const trainer = new LocalTrainer({
    config,
    layout,
    seed,
    peakLr: o.peakLr,
    // Short warm-ups (5 steps) leave a small model permanently worse at these learning rates.
    warmupSteps: o.warmupSteps ?? Math.max(20, Math.round(o.steps / 20)),
    totalSteps: o.steps,
    gradientRounding: o.gradientRounding,
  });
  const sampler = new BatchSampler(data.train, o.batchSize, config.contextLength, seed + 1);
  const evalSet = evaluationBatches(data.heldOut, o.batchSize, config.contextLength, o.evalBatches ?? 8);
  const evaluations: LocalRunResult['evaluations'] = [];
  const evaluate = async (step: number): Promise<number> => {
    const heldOutLoss = await trainer.evaluateAsync(evalSet);
    evaluations.push({ step, tokens: step * o.batchSize * config.contextLength, heldOutLoss });
    log(`step ${step}: held-out loss ${heldOutLoss.toFixed(4)} (bigram ${bigram.loss.toFixed(4)})`);
    return heldOutLoss;
  };

  let trainMs = 0;
  for (let step = 0; step < o.steps; step++) {
    const batch = sampler.next();
    const started = performance.now();
    const { loss, lr } = await trainer.trainStepAsync(batch);
    trainMs += performance.now() - started;
    if (step % 10 === 0) log(`step ${step}: loss ${loss.toFixed(4)} lr ${lr.toExponential(2)} ${(((step + 1) * o.batchSize * config.contextLength) / (trainMs / 1000)).toFixed(0)} tok/s`);
    if (o.evalEvery && step > 0 && step % o.evalEvery === 0) await evaluate(step);
  }
  const heldOutLoss = await evaluate(o.steps);
  const trainTokens = o.steps * o.batchSize * config.contextLength;
  const result: LocalRunResult = {
    config,
    layout,
    heldOutLoss,
    bigramLoss: bigram.loss,
    evaluations,
    trainTokens,
    trainSeconds: trainMs / 1000,
    tokensPerSec: trainTokens / (trainMs / 1000),
    wire: { ...trainer.wire },
    backend,
  };
  trainer.dispose();
  return result;
}
