import * as tf from '@tensorflow/tfjs';
import { boundaryCodec, stageSpecs, type ModelConfig, type RunLayout } from './config';
import { decodeBoundary, encodeBoundary, type Precision } from './codec';
import type { TokenBatch } from './data/sampler';
import { AdamW, cosineSchedule, type AdamWOptions } from './optim';
import { Stage, type StageInput } from './stage';

export interface LocalTrainerOptions {
  config: ModelConfig;
  layout: RunLayout;
  seed: number;
  peakLr: number;
  warmupSteps: number;
  totalSteps: number;
  minLrRatio?: number;
  clipNorm?: number;
  adamw?: AdamWOptions;
  /** How gradients are rounded to their codes (activations always to the nearest); stochastic is seeded per step and stage. */
  gradientRounding?: 'nearest' | 'stochastic';
}

/** A computation that yields each tensor it reads back and resumes with its values. */
type Reads<T> = Generator<tf.Tensor, T, Float32Array>;

function readSync<T>(g: Reads<T>): T {
  let r = g.next();
  while (!r.done) r = g.next(r.value.dataSync() as Float32Array);
  return r.value;
}

async function readAsync<T>(g: Reads<T>): Promise<T> {
  let r = g.next();
  while (!r.done) r = g.next((await r.value.data()) as Float32Array);
  return r.value;
}

/** Bytes that crossed stage boundaries, as encoded frames. */
export interface WireStats {
  forwardBytes: number;
  backwardBytes: number;
  /** Tokens whose activations crossed each boundary (B·T per microbatch). */
  tokens: number;
}

/**
 * All S stages in one process, connected exactly as in the swarm: every
 * boundary tensor is encoded to bytes (bottleneck + int8 when the layout says
 * so), counted, and decoded on the other side, forward and backward. The
 * path of one microbatch: stage 0 forward → encode → decode → stage 1 … →
 * loss → last stage backward → encode gradient → decode → … → stage 0.
 */
export class LocalTrainer {
  readonly stages: Stage[];
  readonly optimizers: AdamW[];
  readonly precision: Precision;
  readonly wire: WireStats = { forwardBytes: 0, backwardBytes: 0, tokens: 0 };
  private readonly lr: (step: number) => number;
  step = 0;

  constructor(readonly options: LocalTrainerOptions) {
    this.stages = stageSpecs(options.config, options.layout).map((spec) => new Stage(spec, options.seed));
    this.optimizers = this.stages.map((s) => new AdamW(s.params, s.specs, options.adamw));
    this.precision = boundaryCodec(options.layout);
    this.lr = cosineSchedule({ peakLr: options.peakLr, warmupSteps: options.warmupSteps, totalSteps: options.totalSteps, minRatio: options.minLrRatio });
  }

  /**
   * Sends a boundary tensor through the codec, as a peer would receive it.
   * The steps below are generators that yield each tensor they must read back
   * and resume with its values: `trainStep` reads synchronously (CPU and WASM),
   * `trainStepAsync` awaits (WebGPU, where a synchronous read is slow and, in
   * Node, impossible). One body, two drivers.
   */
  private *cross(t: tf.Tensor, direction: 'forwardBytes' | 'backwardBytes' | 'evaluation', boundary = 0): Reads<tf.Tensor2D> {
    const [rows, cols] = t.shape as [number, number];
    const stochastic = direction === 'backwardBytes' && this.options.gradientRounding === 'stochastic';
    const data = yield t;
    const bytes = encodeBoundary({ rows, cols, data }, this.precision, stochastic ? { rounding: 'stochastic', seed: this.step * 64 + boundary } : {});
    // Training traffic only: evaluation runs where the model is, it is not sent between miners.
    if (direction !== 'evaluation') this.wire[direction] += bytes.length;
    const decoded = decodeBoundary(bytes, { rows, cols, precision: this.precision });
    return tf.tensor2d(decoded.data, [rows, cols]);
  }

  /** Forward through every stage; returns each stage's input (kept for the backward recompute). */
  private *forwardInputs(batch: TokenBatch, direction: 'forwardBytes' | 'evaluation' = 'forwardBytes'): Reads<StageInput[]> {
    const ids = tf.tensor2d(batch.inputs, [batch.batch, batch.time], 'int32');
    const inputs: StageInput[] = [{ batch: batch.batch, time: batch.time, x: ids }];
    for (const stage of this.stages.slice(0, -1)) {
      const out = stage.forward(inputs[inputs.length - 1]!);
      inputs.push({ batch: batch.batch, time: batch.time, x: yield* this.cross(out, direction) });
      out.dispose();
    }
    const last = inputs[inputs.length - 1]!;
    last.targets = tf.tensor2d(batch.targets, [batch.batch, batch.time], 'int32');
    return inputs;
  }

  private *stepWork(batch: TokenBatch): Reads<{ loss: number; lr: number; gradNorms: number[] }> {
    const inputs = yield* this.forwardInputs(batch);
    this.wire.tokens += batch.batch * batch.time;
    const lr = this.lr(this.step);
    const gradNorms: number[] = new Array(this.stages.length);
    let loss = NaN;
    let outputGrad: tf.Tensor | undefined;
    for (let s = this.stages.length - 1; s >= 0; s--) {
      const stage = this.stages[s]!;
      const result = stage.vjp(inputs[s]!, outputGrad);
      outputGrad?.dispose();
      if (stage.spec.isLast) loss = (yield result.value)[0]!;
      result.value.dispose();
      outputGrad = result.inputGrad ? yield* this.cross(result.inputGrad, 'backwardBytes', s) : undefined;
      result.inputGrad?.dispose();
      const norm = this.optimizers[s]!.applyClipped(result.grads, lr, this.options.clipNorm ?? 1);
      gradNorms[s] = (yield norm)[0]!;
      norm.dispose();
    }
    for (const i of inputs) tf.dispose([i.x, ...(i.targets ? [i.targets] : [])]);
    this.step++;
    return { loss, lr, gradNorms };
  }

  private *evaluation(batches: TokenBatch[]): Reads<number> {
    let sum = 0;
    for (const batch of batches) {
      const inputs = yield* this.forwardInputs(batch, 'evaluation');
      const loss = this.stages[this.stages.length - 1]!.forward(inputs[inputs.length - 1]!);
      sum += (yield loss)[0]!;
      loss.dispose();
      for (const i of inputs) tf.dispose([i.x, ...(i.targets ? [i.targets] : [])]);
    }
    return sum / batches.length;
  }

  /** One optimizer step on one microbatch; returns its training loss. */
  trainStep(batch: TokenBatch): { loss: number; lr: number; gradNorms: number[] } {
    return readSync(this.stepWork(batch));
  }

  /** The same step, every read awaited (GPU backends). */
  trainStepAsync(batch: TokenBatch): Promise<{ loss: number; lr: number; gradNorms: number[] }> {
    return readAsync(this.stepWork(batch));
  }

  /** Mean loss over fixed batches (through the same codec, as the model is used). */
  evaluate(batches: TokenBatch[]): number {
    return readSync(this.evaluation(batches));
  }

  /** The same, every read awaited. */
  evaluateAsync(batches: TokenBatch[]): Promise<number> {
    return readAsync(this.evaluation(batches));
  }

  dispose(): void {
    this.stages.forEach((s) => s.dispose());
    this.optimizers.forEach((o) => o.dispose());
  }
}
