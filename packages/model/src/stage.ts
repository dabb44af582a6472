import * as tf from '@tensorflow/tfjs';
import type { StageSpec } from './config';
import { addLayerNorm, attention, bottleneckDown, crossEntropy, embed, layerNorm, mlp, mm } from './layers';
import { initParams, paramSpecs, type ParamSpec, type Params } from './params';

/**
 * What flows into a stage. The first stage takes token ids [B, T] (int32);
 * the others take the previous stage's boundary tensor [B*T, b]. The last
 * stage also needs the target ids [B, T] to compute its loss.
 */
export interface StageInput {
  batch: number;
  time: number;
  /** Token ids [B, T] for the first stage, boundary activations [B*T, b] otherwise. */
  x: tf.Tensor;
  /** Next-token targets [B, T], last stage only. */
  targets?: tf.Tensor;
}

export interface StageBackward {
  /** Gradient of the loss with respect to this stage's input [B*T, b]; absent on the first stage. */
  inputGrad?: tf.Tensor2D;
  /** Gradient for each parameter, by name. */
  grads: Record<string, tf.Tensor>;
  /** The microbatch's mean loss, last stage only. */
  loss?: number;
}

export class StageError extends Error {
  override name = 'StageError';
}

/**
 * The stage's forward as a pure function of (parameters, input): blocks, plus
 * the embedding on the first stage, the bottleneck ends at its boundaries, and
 * the final norm, head and loss on the last. Returns [B*T, b] or the loss.
 *
 * Pre-norm blocks, x + attn(ln1(x)), then + mlp(ln2(x)), walked as a residual
 * stream: each residual add is taken together with the layer norm that reads
 * its sum next (addLayerNorm: the next ln1 or ln2, the bottleneck's norm or the
 * final one), which a backend may fuse; the arithmetic is the same.
 */
export function stageForward(spec: StageSpec, p: Params, input: StageInput, x: tf.Tensor, logitsOnly = false): tf.Tensor {
  const { batch, time } = input;
  const { dModel, nHead } = spec.config;
  // The layer norms along the stream, in the order they read it.
  const norms: Array<[tf.Tensor, tf.Tensor]> = [];
  for (let l = spec.firstLayer; l < spec.endLayer; l++) norms.push([p[`h.${l}.ln1.g`]!, p[`h.${l}.ln1.b`]!], [p[`h.${l}.ln2.g`]!, p[`h.${l}.ln2.b`]!]);
  if (spec.isLast) norms.push([p['lnf.g']!, p['lnf.b']!]);
  else if (spec.hasDown) norms.push([p[`bneck.${spec.index}.down.ln.g`]!, p[`bneck.${spec.index}.down.ln.b`]!]);
  let next = 0;
  // The bottleneck's norm is the last; before it the stream's first b channels are taken as the lane.
  const laneAt = spec.hasDown ? norms.length - 1 : -1;
  let lane: tf.Tensor2D | undefined;
  /** The residual add h + a, with the next norm of it when there is one. */
  const add = (h: tf.Tensor2D, a: tf.Tensor2D): [tf.Tensor2D, tf.Tensor2D | undefined] => {
    if (next === norms.length) return [tf.add(h, a) as tf.Tensor2D, undefined];
    const at = next++;
    const [g, b] = norms[at]!;
    const r = addLayerNorm(h, a, g, b, at === laneAt ? spec.layout.bottleneck : undefined);
    lane = r.lane;
    return [r.sum ?? h, r.normed];
  };
  const norm = (h: tf.Tensor2D): tf.Tensor2D | undefined => {
    if (next === norms.length) return undefined;
    const at = next++;
    if (at === laneAt) lane = tf.slice(h, [0, 0], [-1, spec.layout.bottleneck]) as tf.Tensor2D;
    const [g, b] = norms[at]!;
    return layerNorm(h, g, b);
  };

  let h: tf.Tensor2D; // the residual stream [B*T, d]
  let n: tf.Tensor2D | undefined; // its next norm
  if (spec.isFirst) {
    const ids = tf.reshape(x, [batch * time]) as tf.Tensor1D;
    const pos = tf.slice(p.wpe!, [0, 0], [time, dModel]); // [T, d]
    const tok = tf.reshape(embed(p.wte as tf.Tensor2D, ids), [batch, time, dModel]);
    h = tf.reshape(tf.add(tok, pos), [batch * time, dModel]) as tf.Tensor2D; // [B*T, d]
    n = norm(h);
  } else if (spec.hasUp) {
    // Bottleneck decoder: b → d; the lane returns to the first b channels.
    const z = x as tf.Tensor2D; // [B*T, b]
    [h, n] = add(z, mm(z, p[`bneck.${spec.index - 1}.up`]!));
  } else {
    h = x as tf.Tensor2D;
    n = norm(h);
  }
  for (let l = spec.firstLayer; l < spec.endLayer; l++) {
    [h, n] = add(h, attention(n!, p, `h.${l}.attn`, batch, time, nHead));
    [h, n] = add(h, mlp(n!, p, `h.${l}.mlp`));
  }
  if (!spec.isLast) return spec.hasDown ? bottleneckDown(lane!, n!, p, spec.index) : h;
  const logits = mm(n!, p.head!); // [B*T, V]
  if (logitsOnly) return logits;
  if (!input.targets) throw new StageError('the last stage needs targets');
  return crossEntropy(logits, tf.reshape(input.targets, [batch * time]) as tf.Tensor1D);
}

/** One pipeline stage: its own variables, forward from its input, and backward as a VJP. */
export class Stage {
  readonly specs: ParamSpec[];
  readonly params: Record<string, tf.Variable>;

  constructor(
    readonly spec: StageSpec,
    seed: number,
  ) {
    this.specs = paramSpecs(spec);
    this.params = initParams(spec, seed);
  }

  get names(): string[] {
    return this.specs.map((s) => s.name);
  }

  /** Runs the stage: the boundary tensor [B*T, b] to send on, or the scalar loss on the last stage. */
  forward(input: StageInput): tf.Tensor {
    this.checkInput(input);
    return tf.tidy(() => stageForward(this.spec, this.params, input, input.x));
  }

  /** The last stage's next-token logits [B*T, V] (sampling text from the model; no targets needed). */
  logits(input: StageInput): tf.Tensor2D {
    if (!this.spec.isLast) throw new StageError('only the last stage has logits');
    this.checkInput(input);
    return tf.tidy(() => stageForward(this.spec, this.params, input, input.x, true)) as tf.Tensor2D;
  }

  /**
   * Vector-Jacobian product. Recomputes the forward from the stored input, then
   * takes `outputGrad` (the gradient of the loss with respect to this stage's
   * output; omitted on the last stage, whose output is the loss) back to the
   * gradient of the input and of every parameter.
   */
  backward(input: StageInput, outputGrad?: tf.Tensor): StageBackward {
    const result = this.vjp(input, outputGrad);
    const loss = this.spec.isLast ? (result.value.dataSync()[0] as number) : undefined;
    result.value.dispose();
    return { inputGrad: result.inputGrad, grads: result.grads, loss };
  }

  /** The same, reading the loss back asynchronously (what GPU backends want). */
  async backwardAsync(input: StageInput, outputGrad?: tf.Tensor): Promise<StageBackward> {
    const result = this.vjp(input, outputGrad);
    const loss = this.spec.isLast ? ((await result.value.data())[0] as number) : undefined;
    result.value.dispose();
    return { inputGrad: result.inputGrad, grads: result.grads, loss };
  }

  /** The VJP with the forward's value (the loss on the last stage) as a tensor: nothing is read back. */
  vjp(input: StageInput, outputGrad?: tf.Tensor): { value: tf.Tensor; inputGrad?: tf.Tensor2D; grads: Record<string, tf.Tensor> } {
    this.checkInput(input);
    if (this.spec.isLast === (outputGrad !== undefined)) {
      throw new StageError(this.spec.isLast ? 'the last stage takes no output gradient' : 'an output gradient is required');
    }
    const names = this.names;
    const withInput = !this.spec.isFirst;
    const result = tf.tidy(() => {
      const f = (...args: tf.Tensor[]): tf.Tensor => {
        const p: Params = {};
        const offset = withInput ? 1 : 0;
        names.forEach((n, i) => (p[n] = args[i + offset]!));
        return stageForward(this.spec, p, input, withInput ? args[0]! : input.x);
      };
      const args = [...(withInput ? [input.x] : []), ...names.map((n) => this.params[n]!)];
      const { value, grads } = tf.valueAndGrads(f)(args, outputGrad);
      const out: Record<string, tf.Tensor> = {};
      names.forEach((n, i) => (out[n] = grads[i + (withInput ? 1 : 0)]!));
      return { value, inputGrad: withInput ? grads[0] : undefined, grads: out };
    });
    return { value: result.value, inputGrad: result.inputGrad as tf.Tensor2D | undefined, grads: result.grads };
  }

  private checkInput(input: StageInput): void {
    const { batch, time, x } = input;
    if (time > this.spec.config.contextLength) throw new StageError(`time ${time} exceeds context ${this.spec.config.contextLength}`);
    const want = this.spec.isFirst ? [batch, time] : [batch * time, this.spec.inputWidth];
    if (x.shape.length !== want.length || x.shape.some((s, i) => s !== want[i])) {
      throw new StageError(`stage ${this.spec.index} expects input [${want}], got [${x.shape}]`);
    }
  }

  dispose(): void {
    for (const v of Object.values(this.params)) v.dispose();
  }
}
