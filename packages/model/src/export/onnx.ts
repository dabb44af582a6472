import onnxProto from 'onnx-proto';
import type { StageSpec } from '../config';
import type { NamedTensor } from '../weights';

const { onnx } = onnxProto;
type INode = onnxProto.onnx.INodeProto;
type IAttr = onnxProto.onnx.IAttributeProto;
type ITensor = onnxProto.onnx.ITensorProto;
type IValueInfo = onnxProto.onnx.IValueInfoProto;

/** The operator set the graph is written in: LayerNormalization is 17's; IR version 8 is what onnx-proto's schema has. */
export const ONNX_OPSET = 17;
const IR_VERSION = 8;
const { FLOAT, INT64 } = onnx.TensorProto.DataType;
const LN_EPS = 1e-5;

export class OnnxExportError extends Error {
  override name = 'OnnxExportError';
}

/** Builds a graph node by node; names are unique by construction. */
class GraphBuilder {
  readonly nodes: INode[] = [];
  readonly initializers: ITensor[] = [];
  private n = 0;

  op(opType: string, inputs: string[], attrs: IAttr[] = [], outputs = 1, name?: string): string[] {
    const id = `${opType}_${this.n++}`;
    const out = Array.from({ length: outputs }, (_, i) => (name && outputs === 1 ? name : `${id}_out${i}`));
    this.nodes.push({ opType, input: inputs, output: out, name: id, attribute: attrs });
    return out;
  }

  /** One output: the usual case. */
  one(opType: string, inputs: string[], attrs: IAttr[] = [], name?: string): string {
    return this.op(opType, inputs, attrs, 1, name)[0]!;
  }

  floats(name: string, shape: number[], data: Float32Array): string {
    this.initializers.push({ name, dims: shape, dataType: FLOAT, rawData: new Uint8Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength)) });
    return name;
  }

  ints(values: number[], shape = [values.length]): string {
    const name = `const_${this.n++}`;
    const raw = new BigInt64Array(values.map(BigInt));
    this.initializers.push({ name, dims: shape, dataType: INT64, rawData: new Uint8Array(raw.buffer) });
    return name;
  }

  scalar(value: number): string {
    const name = `const_${this.n++}`;
    this.initializers.push({ name, dims: [], dataType: FLOAT, rawData: new Uint8Array(Float32Array.of(value).buffer) });
    return name;
  }
}

const int = (name: string, i: number): IAttr => ({ name, type: onnx.AttributeProto.AttributeType.INT, i });
const float = (name: string, f: number): IAttr => ({ name, type: onnx.AttributeProto.AttributeType.FLOAT, f });
const ints = (name: string, values: number[]): IAttr => ({ name, type: onnx.AttributeProto.AttributeType.INTS, ints: values });
const tensorAttr = (name: string, t: ITensor): IAttr => ({ name, type: onnx.AttributeProto.AttributeType.TENSOR, t });

function valueInfo(name: string, elemType: number, dims: Array<number | string>): IValueInfo {
  return {
    name,
    type: { tensorType: { elemType, shape: { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) } } },
  };
}

/**
 * The whole model, every stage in order, as one ONNX graph that computes next-token logits: what transformers.js
 * and onnxruntime run. Its interface is GPT-2's as ONNX exports write it (optimum's `text-generation-with-past`):
 * inputs `input_ids`, `attention_mask`, `position_ids` (int64) and, per layer, `past_key_values.{l}.key|value`
 * [batch, heads, past, head size]; outputs `logits` [batch, sequence, vocabulary] and `present.{l}.key|value`. A
 * first call passes an empty past (its length 0); each later one the presents of the last.
 *
 * The arithmetic is stage.ts's, op for op: pre-norm blocks with exact GELU, the bottleneck encoder at the end
 * of each stage but the last (the stream's first b channels as the lane, plus a learned projection of its
 * normalised stream) and the decoder at the start of the next (the lane back in the first b channels, plus a
 * projection to the full width). What crosses a boundary is kept in fp32: the run's wire codec (int8 and the
 * like) is a transport's rounding, not part of the model, and is not applied.
 */
export function buildOnnxModel(specs: readonly StageSpec[], weights: ReadonlyMap<string, NamedTensor>, docString = ''): Uint8Array {
  if (specs.length === 0) throw new OnnxExportError('no stages');
  const { config, layout } = specs[0]!;
  const { dModel: d, nHead: H, vocabSize: V } = config;
  const hd = d / H;
  const b = layout.bottleneck;
  const g = new GraphBuilder();
  const w = (name: string): string => {
    const t = weights.get(name);
    if (!t) throw new OnnxExportError(`no weights for ${name}`);
    return g.floats(name, t.shape, t.data);
  };
  const layerNorm = (x: string, prefix: string): string => g.one('LayerNormalization', [x, w(`${prefix}.g`), w(`${prefix}.b`)], [int('axis', -1), float('epsilon', LN_EPS)]);

  const inputs: IValueInfo[] = [
    valueInfo('input_ids', INT64, ['batch_size', 'sequence_length']),
    valueInfo('attention_mask', INT64, ['batch_size', 'total_sequence_length']),
    valueInfo('position_ids', INT64, ['batch_size', 'sequence_length']),
  ];
  const outputs: IValueInfo[] = [valueInfo('logits', FLOAT, ['batch_size', 'sequence_length', V])];
  for (let l = 0; l < config.nLayer; l++) {
    for (const kind of ['key', 'value']) {
      inputs.push(valueInfo(`past_key_values.${l}.${kind}`, FLOAT, ['batch_size', H, 'past_sequence_length', hd]));
      outputs.push(valueInfo(`present.${l}.${kind}`, FLOAT, ['batch_size', H, 'total_sequence_length', hd]));
    }
  }

  // The attention's additive mask [batch, 1, sequence, total]: a query at absolute position past + i sees keys
  // 0…past + i (Trilu keeps j ≤ i + past) and none that attention_mask marks as padding; -1e9 elsewhere, as
  // layers.ts's causal mask.
  const shapeOf = (x: string, axis: number): string => g.one('Gather', [g.one('Shape', [x]), g.ints([axis], [])]);
  const seq = shapeOf('input_ids', 1);
  const total = shapeOf('attention_mask', 1);
  const past = shapeOf('past_key_values.0.key', 2);
  const square = g.one('Concat', [g.one('Unsqueeze', [seq, g.ints([0])]), g.one('Unsqueeze', [total, g.ints([0])])], [int('axis', 0)]);
  const ones = g.one('ConstantOfShape', [square], [tensorAttr('value', { dims: [1], dataType: FLOAT, rawData: new Uint8Array(Float32Array.of(1).buffer) })]);
  const causal = g.one('Trilu', [ones, past], [int('upper', 0)]); // [sequence, total]
  const padding = g.one('Unsqueeze', [g.one('Cast', ['attention_mask'], [int('to', FLOAT)]), g.ints([1, 2])]); // [batch, 1, 1, total]
  const allowed = g.one('Mul', [causal, padding]); // [batch, 1, sequence, total]
  const mask = g.one('Mul', [g.one('Sub', [g.scalar(1), allowed]), g.scalar(-1e9)]);

  let h = '';
  let z = '';
  for (const spec of specs) {
    if (spec.isFirst) {
      const tok = g.one('Gather', [w('wte'), 'input_ids'], [int('axis', 0)]);
      const pos = g.one('Gather', [w('wpe'), 'position_ids'], [int('axis', 0)]);
      h = g.one('Add', [tok, pos]); // [batch, sequence, d]
    } else if (spec.hasUp) {
      const padded = g.one('Pad', [z, g.ints([0, 0, 0, 0, 0, d - b])], [], undefined);
      h = g.one('Add', [padded, g.one('MatMul', [z, w(`bneck.${spec.index - 1}.up`)])]);
    } else h = z;
    for (let l = spec.firstLayer; l < spec.endLayer; l++) {
      // Attention, its key and value appended to the past ones.
      const n1 = layerNorm(h, `h.${l}.ln1`);
      const qkv = g.one('MatMul', [n1, w(`h.${l}.attn.wqkv`)]); // [batch, sequence, 3d]
      const [q, k, v] = g.op('Split', [qkv, g.ints([d, d, d])], [int('axis', 2)], 3);
      const heads = (x: string): string => g.one('Transpose', [g.one('Reshape', [x, g.ints([0, 0, H, hd])])], [ints('perm', [0, 2, 1, 3])]);
      const keys = g.one('Concat', [`past_key_values.${l}.key`, heads(k!)], [int('axis', 2)], `present.${l}.key`);
      const values = g.one('Concat', [`past_key_values.${l}.value`, heads(v!)], [int('axis', 2)], `present.${l}.value`);
      const scores = g.one('Mul', [g.one('MatMul', [heads(q!), g.one('Transpose', [keys], [ints('perm', [0, 1, 3, 2])])]), g.scalar(1 / Math.sqrt(hd))]);
      const attn = g.one('Softmax', [g.one('Add', [scores, mask])], [int('axis', -1)]);
      const y = g.one('Reshape', [g.one('Transpose', [g.one('MatMul', [attn, values])], [ints('perm', [0, 2, 1, 3])]), g.ints([0, 0, d])]);
      h = g.one('Add', [h, g.one('MatMul', [y, w(`h.${l}.attn.wo`)])]);
      // The MLP, with exact GELU: 0.5·x·(1 + erf(x/√2)).
      const n2 = layerNorm(h, `h.${l}.ln2`);
      const fc = g.one('MatMul', [n2, w(`h.${l}.mlp.wfc`)]);
      const gelu = g.one('Mul', [g.one('Mul', [fc, g.scalar(0.5)]), g.one('Add', [g.one('Erf', [g.one('Mul', [fc, g.scalar(Math.SQRT1_2)])]), g.scalar(1)])]);
      h = g.one('Add', [h, g.one('MatMul', [gelu, w(`h.${l}.mlp.wproj`)])]);
    }
    if (spec.isLast) {
      g.one('MatMul', [layerNorm(h, 'lnf'), w('head')], [], 'logits');
    } else if (spec.hasDown) {
      const lane = g.one('Slice', [h, g.ints([0]), g.ints([b]), g.ints([2])]);
      z = g.one('Add', [lane, g.one('MatMul', [layerNorm(h, `bneck.${spec.index}.down.ln`), w(`bneck.${spec.index}.down`)])]);
    } else z = h;
  }

  const model = onnx.ModelProto.create({
    irVersion: IR_VERSION,
    producerName: 'train-at-home',
    docString,
    opsetImport: [{ domain: '', version: ONNX_OPSET }],
    graph: { name: 'train-at-home', node: g.nodes, initializer: g.initializers, input: inputs, output: outputs },
  });
  return onnx.ModelProto.encode(model).finish();
}
