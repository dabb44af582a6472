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
import { AdamW, BatchSampler, LocalTrainer, PRESETS, Stage, countParameters, countStageParameters, stageSpecs, stageTflops, type BackendName } from '@train-at-home/model';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { join } from 'node:path';
import { finish, machine } from './lib';

const { values } = parseArgs({ options: { backend: { type: 'string' }, steps: { type: 'string', default: '6' }, only: { type: 'string' } } });
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
  /** The stage's parameters. */
  parameters: number;
  /** Achieved model arithmetic: 6 FLOPs per parameter per token (forward 2, backward 4; the backward's recomputed forward and attention's T² terms not counted), in TFLOP/s. */
  tflops: number;
}

/** WebGPU calls in one step of a `gpu` middle stage (VJP and optimizer) after warm-up (countGpuWork), with the programs by kind. */
interface StageCounts {
  batch: number;
  dispatches: number;
  buffersCreated: number;
  submits: number;
  passes: number;
  kernels: Record<string, number>;
}

/** GPU time per tfjs kernel over one step of the stage (timestamp queries), heaviest first. */
type KernelProfile = Array<{ kernel: string; ms: number; calls: number }>;

interface BackendResult {
  backend: string;
  error?: string;
  adapter?: string;
  tokensPerSec?: Partial<Record<'small' | 'gpu', number>>;
  stepsMeasured?: Partial<Record<'small' | 'gpu', number>>;
  gpuStage?: StageTiming;
  memoryBytes?: number;
  /** tf.memory(): on WebGPU, the bytes of GPU buffers held and allocated. */
  memory?: Record<string, unknown>;
  codecCheckOk?: boolean;
  optimizerCheck?: unknown;
  layerNormCheck?: unknown;
  geluCheck?: unknown;
  attentionCheck?: unknown;
  addLayerNormCheck?: unknown;
  matMulCheck?: unknown;
  /** One gpu stage with the composite optimizer (before the fused kernels are installed). */
  gpuStageComposite?: StageTiming;
  /** One gpu stage with command buffers submitted every 15 dispatches (tfjs's default) instead of 128. */
  gpuStageSubmit15?: StageTiming;
  /** One gpu stage at larger microbatches (sequences per step). */
  gpuStageByBatch?: Record<number, StageTiming>;
  /** Measurements that failed, with why. */
  failures?: string[];
  profile?: StageProfile[];
  gpuStageCounts?: StageCounts;
}

interface StageProfile {
  stage: number;
  forward: KernelProfile;
  backward: KernelProfile;
  optimizer: KernelProfile;
  wallMs: { forward: number; backward: number; optimizer: number };
  /** The listed (heaviest) kernels' GPU time summed, per phase. */
  topKernelsGpuMs: { forward: number; backward: number; optimizer: number };
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
  await trainer.trainStepAsync(sampler.next()); // warm-up: shaders compiled, memory allocated
  const t0 = performance.now();
  for (let i = 0; i < steps; i++) await trainer.trainStepAsync(sampler.next());
  const seconds = (performance.now() - t0) / 1000;
  trainer.dispose();
  return (steps * BATCH * config.contextLength) / seconds;
}

/** One middle stage of `gpu` with its optimizer, random input and output gradient: what gpuStage and gpuStageCounts step. */
function middleStage(batch: number) {
  const config = PRESETS.gpu;
  const spec = stageSpecs(config, LAYOUTS.gpu)[1]!;
  const stage = new Stage(spec, 1);
  const adam = new AdamW(stage.params, stage.specs);
  const rows = batch * config.contextLength;
  const x = tf.randomNormal([rows, spec.inputWidth]) as tf.Tensor2D;
  const g = tf.randomNormal([rows, spec.outputWidth]).mul(1e-3) as tf.Tensor2D;
  return {
    spec,
    stage,
    adam,
    rows,
    g,
    input: { batch, time: config.contextLength, x },
    dispose: () => {
      tf.dispose([x, g]);
      stage.dispose();
      adam.dispose();
    },
  };
}

/** One middle stage of `gpu` alone: forward, backward and optimizer timed apart (each read back before the clock stops). */
async function gpuStage(steps: number, batch = BATCH): Promise<StageTiming> {
  const { spec, stage, adam, rows, g, input, dispose } = middleStage(batch);
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
    adam.applyClipped(r.grads, 1e-4, 1).dispose();
    await stage.params[stage.names[0]!]!.data();
    const optimizer = performance.now() - t0;
    r.inputGrad!.dispose();
    if (i > 0) {
      // step 0 warms up
      t.forward += forward;
      t.backward += backward;
      t.optimizer += optimizer;
    }
  }
  dispose();
  // A pipeline stage's step is its VJP (which recomputes the forward) and its optimizer step.
  const stepMs = (t.backward + t.optimizer) / steps;
  const tokensPerSec = (rows / stepMs) * 1000;
  return { tokensPerSec, forwardMs: t.forward / steps, backwardMs: t.backward / steps, optimizerMs: t.optimizer / steps, parameters: countStageParameters(spec), tflops: +stageTflops(spec, tokensPerSec).toFixed(3) };
}

/** The WebGPU calls of one step of a `gpu` middle stage after a warm-up step: what bounds it on a fast GPU. */
async function gpuStageCounts(batch = BATCH): Promise<StageCounts> {
  const { countGpuWork } = await import('@train-at-home/model/webgpu');
  const { stage, adam, g, input, dispose } = middleStage(batch);
  const step = async () => {
    const r = await stage.backwardAsync(input, g);
    await r.inputGrad!.data();
    adam.applyClipped(r.grads, 1e-4, 1).dispose();
    await stage.params[stage.names[0]!]!.data();
    r.inputGrad!.dispose();
  };
  await step();
  const counter = countGpuWork();
  try {
    await step();
    const c = counter.read();
    return { batch, dispatches: c.dispatches, buffersCreated: c.buffersCreated, submits: c.submits, passes: c.passes, kernels: counter.kernels() };
  } finally {
    counter.uninstall();
    dispose();
  }
}

/**
 * Where a step of each `gpu` stage spends GPU time, per tfjs kernel
 * (tf.profile; on WebGPU each program is timed with timestamp queries, so
 * the figures are GPU time, and the wall clock beside them shows what
 * launches and readbacks add).
 */
async function profileGpuStages(): Promise<StageProfile[]> {
  const config = PRESETS.gpu;
  const rows = BATCH * config.contextLength;
  const summarise = async (info: Awaited<ReturnType<typeof tf.profile>>): Promise<KernelProfile> => {
    const by = new Map<string, { ms: number; calls: number }>();
    for (const k of info.kernels) {
      const ms = Number(await (k as unknown as { kernelTimeMs: number | Promise<number> }).kernelTimeMs) || 0;
      const e = by.get(k.name) ?? { ms: 0, calls: 0 };
      e.ms += ms;
      e.calls++;
      by.set(k.name, e);
    }
    return [...by].map(([kernel, e]) => ({ kernel, ms: +e.ms.toFixed(2), calls: e.calls })).sort((a, b) => b.ms - a.ms).slice(0, 12);
  };
  const out: StageProfile[] = [];
  for (const spec of stageSpecs(config, LAYOUTS.gpu)) {
    const stage = new Stage(spec, 1);
    const adam = new AdamW(stage.params, stage.specs);
    const x = spec.isFirst ? tf.randomUniform([BATCH, config.contextLength], 0, config.vocabSize, 'int32') : tf.randomNormal([rows, spec.inputWidth]);
    const targets = spec.isLast ? tf.randomUniform([BATCH, config.contextLength], 0, config.vocabSize, 'int32') : undefined;
    const g = spec.isLast ? undefined : tf.randomNormal([rows, spec.outputWidth]).mul(1e-3);
    const input = { batch: BATCH, time: config.contextLength, x, targets };
    for (let i = 0; i < 2; i++) {
      // the first pass compiles shaders; the second is measured
      let t0 = performance.now();
      // tf.profile returns the engine's one profile object, refilled by the next call: summarise each at once.
      const fwd = await summarise(
        await tf.profile(async () => {
          const o = stage.forward(input);
          await o.data();
          o.dispose();
        }),
      );
      const forwardWall = performance.now() - t0;
      let r!: Awaited<ReturnType<Stage['backwardAsync']>>;
      t0 = performance.now();
      const bwd = await summarise(
        await tf.profile(async () => {
          r = await stage.backwardAsync(input, g);
          if (r.inputGrad) await r.inputGrad.data();
          else await stage.params[stage.names[0]!]!.data();
        }),
      );
      const backwardWall = performance.now() - t0;
      t0 = performance.now();
      const opt = await summarise(
        await tf.profile(async () => {
          adam.applyClipped(r.grads, 1e-4, 1).dispose();
          await stage.params[stage.names[0]!]!.data();
        }),
      );
      const optimizerWall = performance.now() - t0;
      r.inputGrad?.dispose();
      if (i === 1) {
        const gpuMs = (p: KernelProfile) => +p.reduce((a, k) => a + k.ms, 0).toFixed(1);
        const [f, b, o] = [fwd, bwd, opt];
        out.push({
          stage: spec.index,
          forward: f,
          backward: b,
          optimizer: o,
          wallMs: { forward: +forwardWall.toFixed(1), backward: +backwardWall.toFixed(1), optimizer: +optimizerWall.toFixed(1) },
          topKernelsGpuMs: { forward: gpuMs(f), backward: gpuMs(b), optimizer: gpuMs(o) },
        });
        console.error(`profile stage ${spec.index}: ${JSON.stringify(out.at(-1))}`);
      }
    }
    tf.dispose([x, ...(targets ? [targets] : []), ...(g ? [g] : [])]);
    stage.dispose();
    adam.dispose();
  }
  return out;
}

if (values.backend) {
  // Worker mode: one backend, printed as JSON for the parent after every measurement (a later one
  // may fail, or abort the process: the `gpu` preset whole on WASM can run out of its heap).
  const asked = values.backend as BackendName;
  const lines: string[] = [];
  const backend = await initNodeBackend(asked, (l) => {
    lines.push(l);
    console.error(l);
  });
  const result: BackendResult = { backend: asked };
  const report = () => console.log(JSON.stringify(result));
  const attempt = async (what: string, fn: () => Promise<void>) => {
    try {
      await fn();
    } catch (e) {
      result.failures = [...(result.failures ?? []), `${what}: ${(e as Error).message}`];
    }
    report();
  };
  if (backend !== asked) {
    result.error = lines.join('; ') || `${asked} did not start (${backend} did)`;
    report();
  } else if (values.only === 'stage') {
    // One measurement alone (to run under a CPU profiler): the gpu stage, fused optimizer where it checks out.
    if (asked === 'webgpu') {
      const gpu = await import('@train-at-home/model/webgpu');
      await gpu.useFusedOptimizer();
      await gpu.useFusedLayerNorm();
      await gpu.useFusedGelu();
      await gpu.useTransposedMatMul();
      await gpu.useFusedAttention();
      await gpu.useFusedAddLayerNorm();
      gpu.useSteadyStateWebGPU();
    }
    await attempt('gpu stage', async () => void (result.gpuStage = await gpuStage(STEPS)));
  } else {
    result.adapter = lines.find((l) => l.startsWith('backend webgpu on '))?.slice('backend webgpu on '.length);
    const gpuSteps = asked === 'wasm' ? STEPS_GPU_WASM : STEPS;
    result.tokensPerSec = {};
    result.stepsMeasured = { small: STEPS, gpu: gpuSteps };
    if (asked === 'webgpu') {
      // As the miner and the tab do: the WGSL kernels are checked against the JS/WASM arithmetic before use.
      const gpu = await import('@train-at-home/model/webgpu');
      await attempt('codec kernel check', async () => void (result.codecCheckOk = (await gpu.codecKernelCheck()).ok));
      // The stage step with the composite optimizer first, then with the fused WGSL optimizer.
      await attempt('gpu stage, composite optimizer', async () => void (result.gpuStageComposite = await gpuStage(gpuSteps)));
      await attempt('fused optimizer check', async () => void (result.optimizerCheck = await gpu.useFusedOptimizer()));
      await attempt('fused layer norm check', async () => void (result.layerNormCheck = await gpu.useFusedLayerNorm()));
      await attempt('fused GELU check', async () => void (result.geluCheck = await gpu.useFusedGelu()));
      await attempt('transposed matmul check', async () => void (result.matMulCheck = await gpu.useTransposedMatMul()));
      await attempt('fused attention check', async () => void (result.attentionCheck = await gpu.useFusedAttention()));
      await attempt('fused add and layer norm check', async () => void (result.addLayerNormCheck = await gpu.useFusedAddLayerNorm()));
      gpu.useSteadyStateWebGPU();
    }
    await attempt('small', async () => void (result.tokensPerSec!.small = await wholeModel('small', STEPS)));
    // WASM's heap (XNNPACK) may not hold a gpu stage at 8 sequences: one sequence first.
    if (asked === 'wasm') await attempt('gpu stage, batch 1', async () => void ((result.gpuStageByBatch ??= {})[1] = await gpuStage(gpuSteps, 1)));
    await attempt('gpu stage', async () => void (result.gpuStage = await gpuStage(gpuSteps)));
    if (asked === 'webgpu') {
      await attempt('gpu stage counts', async () => void (result.gpuStageCounts = await gpuStageCounts()));
      // The Node adapter submits command buffers every 128 dispatches (initNodeBackend); tfjs's default is 15.
      await attempt('gpu stage, submit every 15', async () => {
        const was = tf.env().get('WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE');
        tf.env().set('WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE', 15);
        result.gpuStageSubmit15 = await gpuStage(gpuSteps);
        tf.env().set('WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE', was);
      });
      for (const batch of [32, 64]) {
        await attempt(`gpu stage, batch ${batch}`, async () => void ((result.gpuStageByBatch ??= {})[batch] = await gpuStage(gpuSteps, batch)));
      }
    }
    await attempt('gpu', async () => void (result.tokensPerSec!.gpu = await wholeModel('gpu', gpuSteps)));
    result.memoryBytes = tf.memory().numBytes;
    result.memory = tf.memory() as unknown as Record<string, unknown>;
    if (asked === 'webgpu') await attempt('profile', async () => void (result.profile = await profileGpuStages()));
  }
  process.exit(0);
}

// The backends run side by side (each in its own process): the WASM one is bound to one CPU core, the
// WebGPU one to the GPU, and the `gpu` preset on WASM takes minutes.
const results: BackendResult[] = await Promise.all(
  ['webgpu', 'wasm'].map(async (backend) => {
    const { text, code } = await new Promise<{ text: string; code: number | null }>((resolve) => {
      // This script again (through tsx, or as the bundle scripts/device-bundle.sh makes), for one backend.
      const child = spawn(process.execPath, [...process.execArgv, process.argv[1]!, '--backend', backend, '--steps', String(STEPS)], { stdio: ['ignore', 'pipe', 'inherit'] });
      let text = '';
      child.stdout.on('data', (c) => (text += c));
      child.on('exit', (code) => resolve({ text, code }));
    });
    const last = text.trim().split('\n').filter((l) => l.startsWith('{')).pop();
    const r: BackendResult = last ? JSON.parse(last) : { backend, error: `exited ${code} before measuring anything` };
    if (code !== 0) r.failures = [...(r.failures ?? []), `the process exited ${code} after the measurements above (a WASM heap abort, typically)`];
    const f = (n: number | undefined) => (n === undefined ? 'not measured' : `${n.toFixed(0)} tok/s`);
    console.log(
      r.error
        ? `${backend}: not measured: ${r.error}`
        : `${backend}: small ${f(r.tokensPerSec?.small)}, gpu ${f(r.tokensPerSec?.gpu)}, one gpu stage ${f(r.gpuStage?.tokensPerSec)}` +
            (r.gpuStage ? ` (forward ${r.gpuStage.forwardMs.toFixed(0)} ms, backward ${r.gpuStage.backwardMs.toFixed(0)} ms, optimizer ${r.gpuStage.optimizerMs.toFixed(0)} ms)` : '') +
            (r.failures ? `; failed: ${r.failures.join('; ')}` : ''),
    );
    return r;
  }),
);

const by = (b: string) => results.find((r) => r.backend === b);
const presets = ['small', 'gpu'] as const;
const tokensPerSec = Object.fromEntries(presets.map((p) => [p, Object.fromEntries(results.filter((r) => r.tokensPerSec?.[p] !== undefined).map((r) => [r.backend, Math.round(r.tokensPerSec![p]!)]))]));
const webgpu = by('webgpu');
const wasm = by('wasm');
/** One `gpu` stage on WebGPU at the microbatch that went fastest. */
const bestStage = [
  ...(webgpu?.gpuStage ? [{ batch: BATCH, ...webgpu.gpuStage }] : []),
  ...Object.entries(webgpu?.gpuStageByBatch ?? {}).map(([b, t]) => ({ batch: Number(b), ...t })),
].sort((a, b) => b.tokensPerSec - a.tokensPerSec)[0];
finish('gpu', {
  device: webgpu?.adapter ?? `no WebGPU adapter here (${webgpu?.error ?? 'not run'})`,
  tokensPerSec,
  gpuStageTokensPerSec: Object.fromEntries(results.filter((r) => r.gpuStage).map((r) => [r.backend, Math.round(r.gpuStage!.tokensPerSec)])),
  stepMs: Object.fromEntries(results.filter((r) => r.gpuStage).map((r) => [r.backend, { forward: +r.gpuStage!.forwardMs.toFixed(1), backward: +r.gpuStage!.backwardMs.toFixed(1), optimizer: +r.gpuStage!.optimizerMs.toFixed(1) }])),
  memoryBytes: Object.fromEntries(results.filter((r) => r.memoryBytes !== undefined).map((r) => [r.backend, r.memoryBytes])),
  gpuMemory: webgpu?.memory ?? null,
  gpuStageCompositeOptimizer: webgpu?.gpuStageComposite ?? null,
  gpuStageSubmitEvery15: webgpu?.gpuStageSubmit15 ?? null,
  gpuStageByBatch: Object.fromEntries(results.filter((r) => r.gpuStageByBatch).map((r) => [r.backend, r.gpuStageByBatch])),
  optimizerCheck: webgpu?.optimizerCheck ?? null,
  layerNormCheck: webgpu?.layerNormCheck ?? null,
  geluCheck: webgpu?.geluCheck ?? null,
  attentionCheck: webgpu?.attentionCheck ?? null,
  addLayerNormCheck: webgpu?.addLayerNormCheck ?? null,
  matMulCheck: webgpu?.matMulCheck ?? null,
  codecCheckOk: webgpu?.codecCheckOk ?? null,
  failures: Object.fromEntries(results.filter((r) => r.failures).map((r) => [r.backend, r.failures])),
  webgpuOverWasm: webgpu?.tokensPerSec?.small && wasm?.tokensPerSec?.small ? { small: +(webgpu.tokensPerSec.small / wasm.tokensPerSec.small).toFixed(2) } : null,
  profile: webgpu?.profile ?? null,
  tflops: bestStage ? { batch: bestStage.batch, tokensPerSec: Math.round(bestStage.tokensPerSec), tflops: bestStage.tflops, parameters: bestStage.parameters } : null,
  gpuStageCounts: webgpu?.gpuStageCounts ?? null,
  goals: { webgpuOverWasmSmall: 40, gpuStageTokensPerSec: 50_000, gpuStageTflops: 'about 25% of the card\'s fp32 peak' },
  budget: { batch: BATCH, steps: STEPS, gpuPresetStepsOnWasm: STEPS_GPU_WASM, layouts: LAYOUTS, gpuParameters: countParameters(PRESETS.gpu), note: 'gpu preset on WASM measured over 2 steps only (tens of seconds each on a CPU); the two backends ran side by side, each in its own process' },
  machine: machine(results.map((r) => `${r.backend}${r.error ? ' (unavailable)' : ''}`).join(', ')),
});

