/**
 * The Try page's model, off the main thread: every stage of the run loaded from the coordinator's latest agreed
 * checkpoints into one chain (packages/model), on WASM, and continued token by token with the same code the
 * validator writes the Dashboard's samples with (continueTokens), through the run's boundary codec as the run's
 * own pipeline does.
 */
import * as tf from '@tensorflow/tfjs';
import { setWasmPaths } from '@tensorflow/tfjs-backend-wasm';
import wasmPlain from '@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm.wasm?url';
import wasmSimd from '@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm-simd.wasm?url';
import wasmThreaded from '@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm-threaded-simd.wasm?url';
import {
  DATASET_NAME,
  PRESETS,
  Stage,
  Tokenizer,
  boundaryCodec,
  continueTokens,
  countStageParameters,
  importStageWeights,
  installWasmBatchMatMul,
  runDataset,
  seededRandom,
  stageSpecs,
  type DataManifest,
  type PresetName,
  type RunLayout,
  type TokenizerJSON,
} from '@train-at-home/model';
import type { FromTryWorker, ToTryWorker } from './messages';

setWasmPaths({ 'tfjs-backend-wasm.wasm': wasmPlain, 'tfjs-backend-wasm-simd.wasm': wasmSimd, 'tfjs-backend-wasm-threaded-simd.wasm': wasmThreaded });
installWasmBatchMatMul();

const scope = self as unknown as { postMessage(m: FromTryWorker): void; onmessage: ((e: MessageEvent<ToTryWorker>) => void) | null };
const post = (m: FromTryWorker): void => scope.postMessage(m);

/**
 * What the chain needs in memory per parameter: its fp32 value, a copy while a blob is read into it, and the
 * activations of a forward at full context (small beside them). A tab is allowed at most half the device's memory.
 */
const BYTES_PER_PARAMETER = 8;

let model: { stages: Stage[]; tokenizer: Tokenizer; contextLength: number; codec: ReturnType<typeof boundaryCodec> } | undefined;

async function fetchOk(url: string): Promise<Response> {
  const res = await fetch(url);
  if (!res.ok) {
    const body = (await res.json().catch(() => ({}))) as { message?: string };
    throw new Error(`${url.replace(/^https?:\/\/[^/]+/, '')}: HTTP ${res.status}${body.message ? ` (${body.message})` : ''}`);
  }
  return res;
}

async function load(url: string, memoryBytes: number): Promise<void> {
  const status = (await (await fetchOk(`${url}/api/status`)).json()) as { run: RunLayout & { preset: PresetName; dataset?: string } };
  const run = status.run;
  const config = PRESETS[run.preset];
  const specs = stageSpecs(config, run);
  const parameters = specs.reduce((n, s) => n + countStageParameters(s), 0);
  if (parameters * BYTES_PER_PARAMETER > memoryBytes / 2) {
    post({ ev: 'too-large', needBytes: parameters * BYTES_PER_PARAMETER * 2, haveBytes: memoryBytes, parameters, preset: run.preset });
    return;
  }
  await tf.setBackend('wasm');
  await tf.ready();
  const dataset = runDataset({ dataset: run.dataset, vocabSize: config.vocabSize });
  if (!DATASET_NAME.test(dataset)) throw new Error(`the run names no dataset this page can read (${dataset})`);
  post({ ev: 'loading', done: 0, total: specs.length + 1, what: 'tokenizer' });
  const manifest = (await (await fetchOk(`${url}/data/${dataset}/manifest.json`)).json()) as DataManifest;
  const tokenizer = new Tokenizer((await (await fetchOk(`${url}/data/${dataset}/${manifest.tokenizer.file}`)).json()) as TokenizerJSON);
  const stages: Stage[] = [];
  const rounds: number[] = [];
  try {
    for (const spec of specs) {
      post({ ev: 'loading', done: 1 + spec.index, total: specs.length + 1, what: `stage ${spec.index + 1} of ${specs.length}` });
      const res = await fetchOk(`${url}/api/checkpoints/${spec.index}/latest`);
      const stage = new Stage(spec, 1); // its initial values are replaced at once
      stages.push(stage);
      importStageWeights(stage, new Uint8Array(await res.arrayBuffer()));
      rounds.push(Number(res.headers.get('x-round')));
    }
  } catch (e) {
    stages.forEach((s) => s.dispose());
    throw e;
  }
  model?.stages.forEach((s) => s.dispose());
  model = { stages, tokenizer, contextLength: config.contextLength, codec: boundaryCodec(run) };
  const metrics = (await (await fetchOk(`${url}/api/metrics`)).json().catch(() => ({}))) as { latest?: { heldOutLoss?: { value: number } | null } };
  post({ ev: 'ready', rounds, heldOutLoss: metrics.latest?.heldOutLoss?.value ?? null, parameters, backend: tf.getBackend(), preset: run.preset, stages: specs.length, codec: model.codec });
}

async function generate(m: Extract<ToTryWorker, { cmd: 'generate' }>): Promise<void> {
  if (!model) throw new Error('the model is not loaded yet');
  const { tokenizer } = model;
  const decoder = tokenizer.decoder();
  const started = performance.now();
  let tokens = 0;
  let text = '';
  const sampling = { temperature: m.temperature, topK: m.topK, random: seededRandom(m.seed) };
  for await (const id of continueTokens(model.stages, tokenizer.encode(m.prompt), { maxTokens: m.maxTokens, contextLength: model.contextLength, eotId: tokenizer.eotId, sampling, codec: model.codec })) {
    tokens++;
    if (id !== tokenizer.eotId) text += decoder.push(id);
    post({ ev: 'text', text, tokens, ms: performance.now() - started });
  }
  text += decoder.end();
  post({ ev: 'text', text, tokens, ms: performance.now() - started });
  post({ ev: 'done', tokens, ms: performance.now() - started });
}

scope.onmessage = (e) => {
  const m = e.data;
  const run = m.cmd === 'load' ? load(m.url, m.memoryBytes) : generate(m);
  run.catch((err: unknown) => post({ ev: 'error', message: (err as Error).message }));
};
