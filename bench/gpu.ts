/**
 * npm run bench:gpu — training speed per backend: WebGPU through Dawn (the
 * npm package `webgpu`, tfjs-backend-webgpu, our WGSL codec kernels: what a
 * GPU tab runs) against WASM, for the `small` preset and the GPU-sized `gpu`
 * preset, whole model (every stage in one process, boundaries through the
 * codec) and one middle stage of `gpu` alone, with the time of a step split
 * into forward, backward (the VJP, which recomputes the forward) and
 * optimizer, and the memory the backend holds.
 *
 *   npm run bench:gpu                      (the budget below)
 *   npm run bench:gpu -- --steps 20        (more steps per measurement)
 *
 * Each backend runs in a process of its own (tfjs has one backend per
 * process). Where WebGPU cannot start (no adapter: these CI machines), its
 * figures are absent and the reason is in the output. On a machine without a
 * GPU, the `gpu` preset on WASM is measured over STEPS_GPU_WASM steps only
 * (tens of seconds a step), as stated in the output.
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { parseArgs } from 'node:util';
import * as tf from '@tensorflow/tfjs';
import { AdamW, BatchSampler, LocalTrainer, PRESETS, Stage, clipByGlobalNorm, countParameters, stageSpecs, type BackendName } from '@train-at-home/model';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { join } from 'node:path';
import { finish, machine } from './lib';

const { values } = parseArgs({ options: { backend: { type: 'string' }, steps: { type: 'string', default: '6' } } });
const STEPS = Number(values.steps);
/** The `gpu` preset on WASM: a step takes tens of seconds on a CPU. */
const STEPS_GPU_WASM = 2;
const BATCH = 8;
const LAYOUTS: Record<'small' | 'gpu', { stages: number; bottleneck: number; int8: boolean }> = {
  small: { stages: 3, bottleneck: 64, int8: true },
  gpu: { stages: 4, bottleneck: 192, int8: true },
};

interface StageTiming {
  tokensPerSec: number;
  forwardMs: number;
  backwardMs: number;
  optimizerMs: number;
}

interface BackendResult {
  backend: string;
  error?: string;
  adapter?: string;
  tokensPerSec?: Partial<Record<'small' | 'gpu', number>>;
  stepsMeasured?: Partial<Record<'small' | 'gpu', number>>;
  gpuStage?: StageTiming;
  memoryBytes?: number;
}

/** Whole-model training speed: every stage in this process, boundaries through the codec, after one warm-up step. */
async function wholeModel(preset: 'small' | 'gpu', steps: number): Promise<number> {
  const config = PRESETS[preset];
  const dir = join(DATA_DIR, datasetName(config.vocabSize));
  // Prepared here when missing; a bundle for the device carries the prepared shards (and no corpora).
  if (!existsSync(join(dir, 'manifest.json'))) prepareData({ outDir: DATA_DIR, vocabSize: config.vocabSize });
  const data = loadDataset(dir);
  const trainer = new LocalTrainer({ config, layout: LAYOUTS[preset], seed: 1, peakLr: 0.001, warmupSteps: 1, totalSteps: steps + 1 });
  const sampler = new BatchSampler(data.train, BATCH, config.contextLength, 2);
  trainer.trainStep(sampler.next()); // warm-up: shaders compiled, memory allocated
  const t0 = performance.now();
  for (let i = 0; i < steps; i++) trainer.trainStep(sampler.next());
  const seconds = (performance.now() - t0) / 1000;
  trainer.dispose();
  return (steps * BATCH * config.contextLength) / seconds;
}

/** One middle stage of `gpu` alone: forward, backward and optimizer timed apart (each read back before the clock stops). */
async function gpuStage(steps: number): Promise<StageTiming> {
  const config = PRESETS.gpu;
  const spec = stageSpecs(config, LAYOUTS.gpu)[1]!;
  const stage = new Stage(spec, 1);
  const adam = new AdamW(stage.params, stage.specs);
  const rows = BATCH * config.contextLength;
  const x = tf.randomNormal([rows, spec.inputWidth]) as tf.Tensor2D;
  const g = tf.randomNormal([rows, spec.outputWidth]).mul(1e-3) as tf.Tensor2D;
  const input = { batch: BATCH, time: config.contextLength, x };
  const t = { forward: 0, backward: 0, optimizer: 0 };
  for (let i = 0; i <= steps; i++) {
    let t0 = performance.now();
    const out = stage.forward(input);
    await out.data();
    out.dispose();
    const forward = performance.now() - t0;
    t0 = performance.now();
    const r = await stage.backwardAsync(input, g);
    await r.inputGrad!.data();
    const backward = performance.now() - t0;
    t0 = performance.now();
    const clipped = clipByGlobalNorm(r.grads, 1);
    adam.apply(clipped.grads, 1e-4);
    await stage.params[stage.names[0]!]!.data();
    const optimizer = performance.now() - t0;
    tf.dispose([r.inputGrad!, clipped.norm, ...Object.values(clipped.grads), ...Object.values(r.grads)]);
    if (i > 0) {
      // step 0 warms up
      t.forward += forward;
      t.backward += backward;
      t.optimizer += optimizer;
    }
  }
  tf.dispose([x, g]);
  stage.dispose();
  adam.dispose();
  // A pipeline stage's step is its VJP (which recomputes the forward) and its optimizer step.
  const stepMs = (t.backward + t.optimizer) / steps;
  return { tokensPerSec: (rows / stepMs) * 1000, forwardMs: t.forward / steps, backwardMs: t.backward / steps, optimizerMs: t.optimizer / steps };
}

if (values.backend) {
  // Worker mode: one backend, printed as JSON for the parent.
  const asked = values.backend as BackendName;
  const lines: string[] = [];
  const backend = await initNodeBackend(asked, (l) => lines.push(l));
  const result: BackendResult = { backend: asked };
  if (backend !== asked) {
    result.error = lines.join('; ') || `${asked} did not start (${backend} did)`;
  } else {
    result.adapter = lines.find((l) => l.startsWith('backend webgpu on '))?.slice('backend webgpu on '.length);
    const gpuSteps = asked === 'wasm' ? STEPS_GPU_WASM : STEPS;
    result.tokensPerSec = { small: await wholeModel('small', STEPS), gpu: await wholeModel('gpu', gpuSteps) };
    result.stepsMeasured = { small: STEPS, gpu: gpuSteps };
    result.gpuStage = await gpuStage(gpuSteps);
    result.memoryBytes = tf.memory().numBytes;
  }
  console.log(JSON.stringify(result));
  process.exit(0);
}

const results: BackendResult[] = [];
for (const backend of ['webgpu', 'wasm']) {
  const out = await new Promise<string>((resolve, reject) => {
    // This script again (through tsx, or as the bundle scripts/device-bundle.sh makes), for one backend.
    const child = spawn(process.execPath, [...process.execArgv, process.argv[1]!, '--backend', backend, '--steps', String(STEPS)], { stdio: ['ignore', 'pipe', 'inherit'] });
    let text = '';
    child.stdout.on('data', (c) => (text += c));
    child.on('exit', (code) => (code === 0 ? resolve(text) : reject(new Error(`${backend} exited ${code}`))));
  });
  const r = JSON.parse(out.trim().split('\n').pop()!) as BackendResult;
  console.log(r.error ? `${backend}: not measured: ${r.error}` : `${backend}: small ${r.tokensPerSec!.small!.toFixed(0)} tok/s, gpu ${r.tokensPerSec!.gpu!.toFixed(0)} tok/s, one gpu stage ${r.gpuStage!.tokensPerSec.toFixed(0)} tok/s (forward ${r.gpuStage!.forwardMs.toFixed(0)} ms, backward ${r.gpuStage!.backwardMs.toFixed(0)} ms, optimizer ${r.gpuStage!.optimizerMs.toFixed(0)} ms)`);
  results.push(r);
}

const by = (b: string) => results.find((r) => r.backend === b);
const presets = ['small', 'gpu'] as const;
const tokensPerSec = Object.fromEntries(presets.map((p) => [p, Object.fromEntries(results.filter((r) => r.tokensPerSec).map((r) => [r.backend, Math.round(r.tokensPerSec![p]!)]))]));
const webgpu = by('webgpu');
const wasm = by('wasm');
finish('gpu', {
  device: webgpu?.adapter ?? `no WebGPU adapter here (${webgpu?.error ?? 'not run'})`,
  tokensPerSec,
  gpuStageTokensPerSec: Object.fromEntries(results.filter((r) => r.gpuStage).map((r) => [r.backend, Math.round(r.gpuStage!.tokensPerSec)])),
  stepMs: Object.fromEntries(results.filter((r) => r.gpuStage).map((r) => [r.backend, { forward: +r.gpuStage!.forwardMs.toFixed(1), backward: +r.gpuStage!.backwardMs.toFixed(1), optimizer: +r.gpuStage!.optimizerMs.toFixed(1) }])),
  memoryBytes: Object.fromEntries(results.filter((r) => r.memoryBytes !== undefined).map((r) => [r.backend, r.memoryBytes])),
  webgpuOverWasm: webgpu?.tokensPerSec && wasm?.tokensPerSec ? { small: +(webgpu.tokensPerSec.small! / wasm.tokensPerSec.small!).toFixed(2) } : null,
  goals: { webgpuOverWasmSmall: 20, gpuStageTokensPerSec: 10_000 },
  budget: { batch: BATCH, steps: STEPS, gpuPresetStepsOnWasm: STEPS_GPU_WASM, layouts: LAYOUTS, gpuParameters: countParameters(PRESETS.gpu), note: 'gpu preset on WASM measured over 2 steps only (tens of seconds each on a CPU)' },
  machine: machine(results.map((r) => `${r.backend}${r.error ? ' (unavailable)' : ''}`).join(', ')),
});

