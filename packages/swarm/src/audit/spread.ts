import * as tf from '@tensorflow/tfjs';
import { PRESETS, Stage, exportStageWeights, importStageWeights, stageSpecs, type PresetName, type RunLayout, type StageInput } from '@train-at-home/model';
import { StageCompute, type BoundaryDeviceCodec, type InnerTraining } from '../stage-compute';

/**
 * One stage's round, as a miner runs it, on whatever backend is current: from
 * given weights and optimizer state, each microbatch's forward and backward
 * with an inner step, on the very inputs a miner of that stage received (the
 * token windows on stage 0, the activation frames off it, the targets on the
 * last stage, the output-gradient frames off it). The arithmetic is the
 * pipeline worker's own (StageCompute), so on the validator's backend this is
 * what an audit's replay computes, bit for bit.
 *
 * Run on two backends with the same inputs, the two rounds differ only by the
 * backends' arithmetic: bench/backend-spread.ts measures that honest spread
 * (what an honest tab on WebGL or WebGPU sends and ends with, against the
 * validator's WASM replay of it), step by step, to set the tolerances a
 * replay of another backend's round needs.
 */
export interface StageRoundInputs {
  preset: PresetName;
  layout: RunLayout;
  /** Which stage (0-based), and the seed its fresh weights would take (the start weights replace them). */
  stage: number;
  seed: number;
  training: InnerTraining;
  /** The stage's weights at the round's start (exportStageWeights), and its optimizer state then (StageCompute.exportState; absent: fresh). */
  startWeights: Uint8Array;
  startState?: Uint8Array;
  microbatches: StageRoundMicrobatch[];
  /** After how many inner steps the weights are kept (1-based). */
  keepWeightsAt: number[];
}

export interface StageRoundMicrobatch {
  batch: number;
  /** Stage 0: the token ids (batch × time). */
  tokens?: Int32Array;
  /** Off stage 0: the activation frame received. */
  input?: Uint8Array;
  /** The last stage: the targets (batch × time). */
  targets?: Int32Array;
  /** Off the last stage: the gradient frame received for its output. */
  outputGrad?: Uint8Array;
}

export interface StageRound {
  backend: string;
  /** Per microbatch: the activation frame it sent on (off the last stage), the gradient frame it sent back (off stage 0), its loss (last stage). */
  sent: Array<{ activation?: Uint8Array; gradient?: Uint8Array; loss?: number }>;
  /** The weights after the steps named in keepWeightsAt. */
  weights: Array<{ step: number; bytes: Uint8Array }>;
  /** The optimizer state at the end (StageCompute.exportState). */
  state: Uint8Array;
  ms: number;
}

export async function runStageRound(o: StageRoundInputs, deviceCodec?: BoundaryDeviceCodec): Promise<StageRound> {
  const started = performance.now();
  const config = PRESETS[o.preset];
  const spec = stageSpecs(config, o.layout)[o.stage];
  if (!spec) throw new RangeError(`stage ${o.stage} of a ${o.layout.stages}-stage run`);
  const stage = new Stage(spec, o.seed);
  importStageWeights(stage, o.startWeights);
  const compute = new StageCompute(stage, o.training, deviceCodec);
  const T = config.contextLength;
  const sent: StageRound['sent'] = [];
  const weights: StageRound['weights'] = [];
  try {
    if (o.startState) compute.importState(o.startState);
    for (const mb of o.microbatches) {
      const input: StageInput = spec.isFirst
        ? { batch: mb.batch, time: T, x: tf.tensor2d(need(mb.tokens, 'tokens'), [mb.batch, T], 'int32') }
        : { batch: mb.batch, time: T, x: compute.decode(need(mb.input, 'input'), mb.batch * T, spec.inputWidth) };
      if (spec.isLast) input.targets = tf.tensor2d(need(mb.targets, 'targets'), [mb.batch, T], 'int32');
      const out: StageRound['sent'][number] = {};
      let outputGrad: tf.Tensor2D | undefined;
      try {
        if (!spec.isLast) {
          const y = compute.forward(input);
          out.activation = await compute.encode(y);
          y.dispose();
          outputGrad = compute.decode(need(mb.outputGrad, 'outputGrad'), mb.batch * T, spec.outputWidth);
        }
        const result = await compute.backward(input, outputGrad, true);
        if (result.inputGrad) {
          out.gradient = await compute.encode(result.inputGrad);
          result.inputGrad.dispose();
        }
        if (result.loss !== undefined) out.loss = result.loss;
      } finally {
        tf.dispose([input.x, ...(input.targets ? [input.targets] : []), ...(outputGrad ? [outputGrad] : [])]);
      }
      sent.push(out);
      if (o.keepWeightsAt.includes(sent.length)) weights.push({ step: sent.length, bytes: await exportStageWeights(stage) });
    }
    return { backend: tf.getBackend(), sent, weights, state: await compute.exportState(), ms: performance.now() - started };
  } finally {
    compute.dispose();
    stage.dispose();
  }
}

function need<T>(x: T | undefined, what: string): T {
  if (x === undefined) throw new TypeError(`this stage's microbatches need ${what}`);
  return x;
}
