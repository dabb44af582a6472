import * as tf from '@tensorflow/tfjs';
import { AdamW, boundaryCodec, cosineSchedule, decodeBoundary, encodeBoundary, type Precision, type Stage, type StageInput } from '@train-at-home/model';

/**
 * The int8 boundary codec on the backend's own device (the tab's WGSL
 * kernels on WebGPU): encodes a tensor to the same frame bytes as
 * encodeBoundary, and decodes a frame straight to a tensor. Absent: the JS
 * codec on downloaded values.
 */
export interface BoundaryDeviceCodec {
  encode(x: tf.Tensor2D): Promise<Uint8Array>;
  decode(frame: Uint8Array, rows: number, cols: number): tf.Tensor2D;
}

export interface InnerTraining {
  peakLr: number;
  warmupSteps: number;
  totalSteps: number;
  clipNorm?: number;
}

/**
 * A stage's arithmetic for one miner: forward, the vector-Jacobian product,
 * the inner AdamW step at the schedule's learning rate, and the boundary
 * codec. The pipeline worker runs it on live microbatches; an audit
 * (audit/replay.ts) runs the very same code over a recorded round, so an
 * honest round on the same backend replays bit for bit.
 */
export class StageCompute {
  readonly optimizer: AdamW;
  private readonly lr: (step: number) => number;
  readonly precision: Precision;
  /** Backward passes so far (each an inner step, or a skipped one for a gradient from before a merge): the schedule's step. */
  step = 0;

  constructor(
    readonly stage: Stage,
    private readonly training: InnerTraining,
    private readonly deviceCodec?: BoundaryDeviceCodec,
  ) {
    this.optimizer = new AdamW(stage.params, stage.specs);
    this.lr = cosineSchedule({ peakLr: training.peakLr, warmupSteps: training.warmupSteps, totalSteps: training.totalSteps });
    this.precision = boundaryCodec(stage.spec.layout);
  }

  /** A boundary tensor to frame bytes: on the device when it has a codec (int8 only), else in JS. */
  async encode(x: tf.Tensor2D): Promise<Uint8Array> {
    if (this.deviceCodec && this.precision === 'int8') return this.deviceCodec.encode(x);
    const [rows, cols] = x.shape;
    return encodeBoundary({ rows, cols, data: (await x.data()) as Float32Array }, this.precision);
  }

  /** Frame bytes (checked: header, shape, precision, finite scales) to a tensor. */
  decode(bytes: Uint8Array, rows: number, cols: number): tf.Tensor2D {
    if (this.deviceCodec && this.precision === 'int8') return this.deviceCodec.decode(bytes, rows, cols);
    const frame = decodeBoundary(bytes, { rows, cols, precision: this.precision });
    return tf.tensor2d(frame.data, [rows, cols]);
  }

  /** The stage's boundary tensor for an input (not on the last stage). */
  forward(input: StageInput): tf.Tensor2D {
    return this.stage.forward(input) as tf.Tensor2D;
  }

  /**
   * Recomputes the forward, takes the gradient back, and steps the weights
   * when `applied` (the schedule's step counts either way). Returns the
   * input's gradient (not on stage 0) and the loss (last stage).
   */
  async backward(input: StageInput, outputGrad: tf.Tensor | undefined, applied: boolean): Promise<{ inputGrad?: tf.Tensor2D; loss?: number }> {
    const full = await this.stage.backwardAsync(input, outputGrad);
    if (applied) this.optimizer.applyClipped(full.grads, this.lr(this.step), this.training.clipNorm ?? 1).dispose();
    else tf.dispose(Object.values(full.grads));
    this.step++;
    return { inputGrad: full.inputGrad, loss: full.loss };
  }

  /** Step count and AdamW's moments as one blob (what a round starts from and ends with: audits replay from it). */
  async exportState(): Promise<Uint8Array> {
    const optimizer = await this.optimizer.exportState();
    const out = new Uint8Array(4 + optimizer.length);
    new DataView(out.buffer).setUint32(0, this.step, true);
    out.set(optimizer, 4);
    return out;
  }

  importState(blob: Uint8Array): void {
    if (blob.length < 8) throw new RangeError('optimizer state too short');
    this.optimizer.importState(blob.subarray(4));
    this.step = new DataView(blob.buffer, blob.byteOffset, 4).getUint32(0, true);
  }

  dispose(): void {
    this.optimizer.dispose();
  }
}
