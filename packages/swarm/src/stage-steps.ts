import * as tf from '@tensorflow/tfjs';
import { PRESETS, Stage, encodeBoundary, mulberry32, stageSpecs, type PresetName, type RunLayout, type StageInput, type StageSpec } from '@train-at-home/model';
import { StageCompute, type BoundaryDeviceCodec, type InnerTraining } from './stage-compute';

export interface SyntheticStageOptions {
  preset: PresetName;
  layout: RunLayout;
  /** 0-based stage index. */
  stage: number;
  /** Sequences per microbatch. */
  batch: number;
  seed?: number;
  training?: InnerTraining;
}

/** One stage that trains on fixed random inputs, one microbatch per `step()`. */
export interface SyntheticStage {
  spec: StageSpec;
  /** Its weights (they move every step). */
  stage: Stage;
  /** Tokens per microbatch (batch × context). */
  tokens: number;
  /**
   * One microbatch as a pipeline worker handles it: the input frame decoded
   * (token ids on stage 0), the forward and its activation encoded to a frame
   * (not on the last stage), the gradient frame from downstream decoded, the
   * backward with its inner AdamW step, and the input's gradient encoded (not
   * on stage 0); the loss read back on the last stage. Resolves when the
   * frames have been read back, as the worker's sends wait for them.
   */
  step(): Promise<void>;
  dispose(): void;
}

/**
 * A stage of a run's layout training on random inputs through StageCompute,
 * the arithmetic a miner runs (so a count or a timing of `step()` is one of a
 * miner's microbatches): bench:webgpu-dispatch and bench:gpu measure it. The
 * frames are made once, by the JS codec, before any step.
 */
export function syntheticStage(o: SyntheticStageOptions, deviceCodec?: BoundaryDeviceCodec): SyntheticStage {
  const config = PRESETS[o.preset];
  const spec = stageSpecs(config, o.layout)[o.stage];
  if (!spec) throw new RangeError(`stage ${o.stage} of a ${o.layout.stages}-stage run`);
  const seed = o.seed ?? 1;
  const compute = new StageCompute(new Stage(spec, seed), o.training ?? { peakLr: 1e-3, warmupSteps: 0, totalSteps: 1_000_000, clipNorm: 1 }, deviceCodec);
  const T = config.contextLength;
  const rows = o.batch * T;
  const random = mulberry32(seed + 1);
  const normal = (n: number): Float32Array => Float32Array.from({ length: n }, () => (random() + random() + random() - 1.5) * 2);
  const ids = (): Int32Array => Int32Array.from({ length: rows }, () => Math.floor(random() * config.vocabSize));
  const inputFrame = spec.isFirst ? undefined : encodeBoundary({ rows, cols: spec.inputWidth, data: normal(rows * spec.inputWidth) }, compute.precision);
  const gradFrame = spec.isLast ? undefined : encodeBoundary({ rows, cols: spec.outputWidth, data: normal(rows * spec.outputWidth).map((x) => x * 1e-3) }, compute.precision);
  const tokens = spec.isFirst ? ids() : undefined;
  const targets = spec.isLast ? ids() : undefined;

  return {
    spec,
    stage: compute.stage,
    tokens: rows,
    async step() {
      const input: StageInput = tokens ? { batch: o.batch, time: T, x: tf.tensor2d(tokens, [o.batch, T], 'int32') } : { batch: o.batch, time: T, x: compute.decode(inputFrame!, rows, spec.inputWidth) };
      if (targets) input.targets = tf.tensor2d(targets, [o.batch, T], 'int32');
      let outputGrad: tf.Tensor2D | undefined;
      try {
        if (!spec.isLast) {
          const y = compute.forward(input);
          await compute.encode(y);
          y.dispose();
          outputGrad = compute.decode(gradFrame!, rows, spec.outputWidth);
        }
        const result = await compute.backward(input, outputGrad, true);
        if (result.inputGrad) {
          await compute.encode(result.inputGrad);
          result.inputGrad.dispose();
        }
      } finally {
        tf.dispose([input.x, ...(input.targets ? [input.targets] : []), ...(outputGrad ? [outputGrad] : [])]);
      }
    },
    dispose() {
      compute.dispose();
      compute.stage.dispose();
    },
  };
}
