import * as tf from '@tensorflow/tfjs';
import { AdamW, PRESETS, Stage, mulberry32, stageSpecs, type PresetName } from '@train-at-home/model';
import type { GpuCounts } from '@train-at-home/model/webgpu';
import { syntheticStage, type BoundaryDeviceCodec, type SyntheticStageOptions } from '@train-at-home/swarm';

export interface LocalBenchOptions {
  preset: PresetName;
  /** Measured steps (after one warm-up step that compiles shaders). */
  steps: number;
  batch: number;
}

export interface LocalBenchResult {
  backend: string;
  preset: PresetName;
  batch: number;
  steps: number;
  tokensPerSec: number;
  msPerStep: number;
  warmupMs: number;
  loss: number;
}

/**
 * The whole model as one stage on the current backend: forward, backward,
 * clipping and an AdamW step per microbatch, as a tab's miner does them
 * (reads back asynchronously). Tokens are random: this measures speed only.
 */
export async function benchLocalTraining(o: LocalBenchOptions): Promise<LocalBenchResult> {
  const config = PRESETS[o.preset];
  const stage = new Stage(stageSpecs(config, { stages: 1, bottleneck: config.dModel, int8: false })[0]!, 1);
  const optimizer = new AdamW(stage.params, stage.specs);
  const rand = mulberry32(7);
  const T = config.contextLength;
  let loss = NaN;
  const step = async (): Promise<void> => {
    const ids = Int32Array.from({ length: o.batch * (T + 1) }, () => Math.floor(rand() * config.vocabSize));
    const inputs = new Int32Array(o.batch * T);
    const targets = new Int32Array(o.batch * T);
    for (let b = 0; b < o.batch; b++) {
      inputs.set(ids.subarray(b * (T + 1), b * (T + 1) + T), b * T);
      targets.set(ids.subarray(b * (T + 1) + 1, (b + 1) * (T + 1)), b * T);
    }
    const x = tf.tensor2d(inputs, [o.batch, T], 'int32');
    const y = tf.tensor2d(targets, [o.batch, T], 'int32');
    const result = await stage.backwardAsync({ batch: o.batch, time: T, x, targets: y });
    optimizer.applyClipped(result.grads, 1e-3, 1).dispose();
    tf.dispose([x, y]);
    // Wait for the step itself, not just its recording: read one parameter back.
    await stage.params[stage.specs[0]!.name]!.data();
    loss = result.loss ?? NaN;
  };
  const w0 = performance.now();
  await step();
  const warmupMs = performance.now() - w0;
  const t0 = performance.now();
  for (let i = 0; i < o.steps; i++) await step();
  const ms = performance.now() - t0;
  stage.dispose();
  optimizer.dispose();
  return { backend: tf.getBackend(), preset: o.preset, batch: o.batch, steps: o.steps, tokensPerSec: (o.steps * o.batch * T) / (ms / 1000), msPerStep: ms / o.steps, warmupMs, loss };
}

export interface StageStepsResult {
  backend: string;
  options: SyntheticStageOptions;
  warmup: number;
  steps: number;
  msPerStep: number;
  tokensPerSec: number;
  /** WebGPU only: the GPU calls of each warm-up step, then of each measured step (countGpuWork). */
  warmupCounts?: GpuCounts[];
  stepCounts?: GpuCounts[];
  /** WebGPU only: the programs the last measured step ran, by kind. */
  kernels?: Record<string, number>;
  /** WebGPU only: the tab's kernel checks (codec, fused optimizer, fused layer norm), as the worker installed them. */
  kernelCheck?: import('./messages').KernelCheck;
}

/**
 * A stage's microbatches on random inputs (swarm's syntheticStage: the
 * pipeline worker's arithmetic, frames through this tab's codec), `warmup`
 * steps first (shader compilation, the buffer pool filling), then `steps`
 * timed ones; on WebGPU every step's device calls are counted.
 */
export async function benchStageSteps(o: { options: SyntheticStageOptions; warmup: number; steps: number }, deviceCodec?: BoundaryDeviceCodec): Promise<StageStepsResult> {
  const stage = syntheticStage(o.options, deviceCodec);
  const counter = tf.getBackend() === 'webgpu' ? (await import('@train-at-home/model/webgpu')).countGpuWork() : undefined;
  const warmupCounts: GpuCounts[] = [];
  const stepCounts: GpuCounts[] = [];
  try {
    for (let i = 0; i < o.warmup; i++) {
      counter?.reset();
      await stage.step();
      if (counter) warmupCounts.push(counter.read());
    }
    let ms = 0;
    for (let i = 0; i < o.steps; i++) {
      counter?.reset();
      const t0 = performance.now();
      await stage.step();
      ms += performance.now() - t0;
      if (counter) stepCounts.push(counter.read());
    }
    const result: StageStepsResult = { backend: tf.getBackend(), options: o.options, warmup: o.warmup, steps: o.steps, msPerStep: ms / o.steps, tokensPerSec: (o.steps * stage.tokens) / (ms / 1000) };
    return counter ? { ...result, warmupCounts, stepCounts, kernels: counter.kernels() } : result;
  } finally {
    counter?.uninstall();
    stage.dispose();
  }
}

export interface LossCurveOptions {
  preset: PresetName;
  /** The run's layout; the curve is its last stage's (the one with the loss). */
  layout: { stages: number; bottleneck: number; int8: boolean };
  batch: number;
  steps: number;
  lr: number;
}

/**
 * The last stage of a run trained alone on one fixed microbatch (seeded
 * activations in, seeded targets): its loss after each AdamW step. The same
 * options give the same curve on the same arithmetic, so two curves on one
 * backend, with and without our fused programs, say what fusion changes.
 */
export async function stageLossCurve(o: LossCurveOptions): Promise<number[]> {
  const config = PRESETS[o.preset];
  const spec = stageSpecs(config, o.layout).at(-1)!;
  const stage = new Stage(spec, 1);
  const optimizer = new AdamW(stage.params, stage.specs);
  const rand = mulberry32(11);
  const T = config.contextLength;
  const rows = o.batch * T;
  const activations = Float32Array.from({ length: rows * spec.inputWidth }, () => rand() * 2 - 1);
  const targets = Int32Array.from({ length: rows }, () => Math.floor(rand() * config.vocabSize));
  const losses: number[] = [];
  try {
    for (let i = 0; i < o.steps; i++) {
      const x = tf.tensor2d(activations, [rows, spec.inputWidth]);
      const y = tf.tensor2d(targets, [o.batch, T], 'int32');
      const result = await stage.backwardAsync({ batch: o.batch, time: T, x, targets: y });
      optimizer.applyClipped(result.grads, o.lr, 1).dispose();
      result.inputGrad?.dispose();
      tf.dispose([x, y]);
      losses.push(result.loss ?? NaN);
    }
    return losses;
  } finally {
    stage.dispose();
    optimizer.dispose();
  }
}

export interface FusionCurveResult {
  backend: string;
  options: LossCurveOptions;
  /** tfjs's composite programs (nothing of ours installed). */
  unfused: number[];
  /** The same, after the tab's fused programs were checked and installed (kernelCheck). */
  fused: number[];
  /** The largest |fused − unfused| over the steps, in nats. */
  maxAbsDiff: number;
  kernelCheck?: import('./messages').KernelCheck;
}
