import type { StageSpec } from '../config';
import { boundaryCodec } from '../config';
import { paramSpecs } from '../params';
import { EOT, type TokenizerJSON } from '../tokenizer/bpe';
import type { NamedTensor } from '../weights';
import { huggingFaceTokenizer } from './hf-tokenizer';
import { ONNX_OPSET, OnnxExportError, buildOnnxModel } from './onnx';
import { writeSafetensors } from './safetensors';

/** What the model card says of the run the weights come from. */
export interface ModelCard {
  run: string;
  /** The merge round every stage's weights are the agreed result of. */
  round: number;
  /** Each stage's agreed weights hash at that round (sha-256 of its weights blob), in stage order. */
  stageHashes: string[];
  tokensTrained?: number;
  heldOutLoss?: number;
  bigramLoss?: number;
  /** The data: its dataset name and where its text came from. */
  data: { dataset: string; source: string; licence: string };
  /** The coordinator's address, when exported from one. */
  coordinator?: string;
}

export interface ModelFile {
  path: string;
  bytes: Uint8Array;
}

/** Where transformers.js looks for the graph (its `subfolder` 'onnx', file `model.onnx` for fp32). */
export const ONNX_PATH = 'onnx/model.onnx';

/**
 * A model folder that other tools load: `config.json` (GPT-2's keys, so transformers.js drives the graph with
 * its text generation), `generation_config.json`, `model.safetensors` (every stage's weights under this project's
 * parameter names), `tokenizer.json` and `tokenizer_config.json` (Hugging Face tokenizers), `onnx/model.onnx`
 * (onnx.ts: the whole stage chain) and `README.md`, the model card. `tensors` are every stage's weights, each
 * checked against the stage's parameter list by the caller (checkStageWeights).
 */
export function modelFolder(specs: readonly StageSpec[], tensors: readonly NamedTensor[], tokenizer: TokenizerJSON, card: ModelCard): ModelFile[] {
  const { config, layout } = specs[0]!;
  if (tokenizer.vocabSize !== config.vocabSize) throw new OnnxExportError(`the tokenizer has ${tokenizer.vocabSize} tokens, the model ${config.vocabSize}`);
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const order = specs.flatMap((s) => paramSpecs(s).map((p) => p.name));
  for (const name of order) if (!byName.has(name)) throw new OnnxExportError(`no weights for ${name}`);
  const encoder = new TextEncoder();
  const json = (value: unknown): Uint8Array => encoder.encode(`${JSON.stringify(value, null, 2)}\n`);
  const runInfo = {
    run: card.run,
    round: card.round,
    stages: specs.map((s) => ({ layers: [s.firstLayer, s.endLayer], hash: card.stageHashes[s.index] })),
    bottleneck: layout.bottleneck,
    boundaryCodec: boundaryCodec(layout),
    boundaryCodecInGraph: false,
  };
  const configJson = {
    architectures: ['TrainAtHomeForCausalLM'],
    model_type: 'gpt2',
    vocab_size: config.vocabSize,
    n_positions: config.contextLength,
    n_ctx: config.contextLength,
    n_embd: config.dModel,
    n_layer: config.nLayer,
    n_head: config.nHead,
    activation_function: 'gelu',
    layer_norm_epsilon: 1e-5,
    bos_token_id: tokenizer.eotId,
    eos_token_id: tokenizer.eotId,
    use_cache: true,
    train_at_home: runInfo,
  };
  const hf = huggingFaceTokenizer(tokenizer);
  const tokenizerConfig = {
    tokenizer_class: 'GPT2Tokenizer',
    bos_token: EOT,
    eos_token: EOT,
    unk_token: null,
    add_prefix_space: false,
    clean_up_tokenization_spaces: false,
    model_max_length: config.contextLength,
  };
  const generation = { bos_token_id: tokenizer.eotId, eos_token_id: tokenizer.eotId, max_length: config.contextLength };
  const ordered = order.map((n) => byName.get(n)!);
  return [
    { path: 'config.json', bytes: json(configJson) },
    { path: 'generation_config.json', bytes: json(generation) },
    { path: 'model.safetensors', bytes: writeSafetensors(ordered, { format: 'pt', run: card.run, round: String(card.round) }) },
    { path: 'tokenizer.json', bytes: json(hf) },
    { path: 'tokenizer_config.json', bytes: json(tokenizerConfig) },
    { path: ONNX_PATH, bytes: buildOnnxModel(specs, byName, `${card.run}, merge round ${card.round}`) },
    { path: 'README.md', bytes: encoder.encode(modelCard(specs, card)) },
  ];
}

function modelCard(specs: readonly StageSpec[], card: ModelCard): string {
  const { config, layout } = specs[0]!;
  const params = specs.reduce((n, s) => n + paramSpecs(s).reduce((m, p) => m + p.shape.reduce((a, b) => a * b, 1), 0), 0);
  const fmt = (x: number | undefined, digits = 3): string => (x === undefined ? 'not measured' : x.toFixed(digits));
  return `---
library_name: transformers.js
pipeline_tag: text-generation
---

# ${card.run}, merge round ${card.round}

A language model trained by a Train at Home swarm: browser tabs and headless miners, each training a slice of its
layers (a pipeline stage), their replicas merged every round. These are the weights every stage's replicas agreed
on at merge round ${card.round}${card.coordinator ? `, exported from ${card.coordinator}` : ''}.

| | |
|---|---|
| parameters | ${params.toLocaleString('en')} |
| shape | ${config.nLayer} layers, width ${config.dModel}, ${config.nHead} heads, context ${config.contextLength} tokens, vocabulary ${config.vocabSize} |
| stages | ${specs.map((s) => `${s.index + 1}: layers ${s.firstLayer}–${s.endLayer - 1}, weights ${card.stageHashes[s.index]?.slice(0, 16) ?? '?'}…`).join('; ')} |
| bottleneck | ${layout.bottleneck < config.dModel ? `${layout.bottleneck} channels between stages` : 'none (full width between stages)'} |
| tokens trained | ${card.tokensTrained === undefined ? 'not recorded' : card.tokensTrained.toLocaleString('en')} |
| held-out loss | ${fmt(card.heldOutLoss)} nats per token (a bigram model of the training split: ${fmt(card.bigramLoss)}) |
| data | ${card.data.dataset}: ${card.data.source} |
| licence of the data | ${card.data.licence} |

## Files

- \`model.safetensors\`: the weights, fp32, under this project's names (\`wte\`, \`wpe\`, \`h.{layer}.attn.wqkv\`, …,
  \`bneck.{boundary}.down\` and \`.up\`, \`lnf\`, \`head\`; matrices stored [in, out]).
- \`onnx/model.onnx\`: the whole chain of stages as one graph (ONNX opset ${ONNX_OPSET}), next-token \`logits\` from
  \`input_ids\`, with GPT-2's key/value cache inputs and outputs. Between stages the graph keeps fp32: the run's
  wire codec (${boundaryCodec(layout)}) rounds what crosses a boundary in transport and is not applied here.
- \`tokenizer.json\`: the run's byte-level BPE in the Hugging Face tokenizers format; \`${EOT}\` (id ${config.vocabSize - 1})
  ends a document.
- \`config.json\` names GPT-2's keys so that transformers.js's text generation drives the graph; the architecture is
  this project's (a GPT-2 block with bottleneck lanes between stages), not GPT-2's, and Python's
  \`transformers\` cannot build it from the safetensors file.

## Use

\`\`\`js
import { AutoModelForCausalLM, AutoTokenizer, env } from '@huggingface/transformers';
env.allowRemoteModels = false;
env.localModelPath = '/path/to/parent';
const tokenizer = await AutoTokenizer.from_pretrained('${card.run}-round-${card.round}');
const model = await AutoModelForCausalLM.from_pretrained('${card.run}-round-${card.round}', { dtype: 'fp32' });
const out = await model.generate({ ...tokenizer('The '), max_new_tokens: 40, do_sample: false });
console.log(tokenizer.decode(out[0], { skip_special_tokens: true }));
\`\`\`

or with onnxruntime: \`InferenceSession.create('onnx/model.onnx')\`, feeding an empty past (length 0) first.
`;
}
