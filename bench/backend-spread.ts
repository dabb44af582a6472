/**
 * npm run bench:backend-spread — how far an HONEST tab on WebGL or WebGPU
 * lands from the validator's WASM replay of its round: the spread a replay of
 * another backend's round must tolerate, and what is left to catch a cheat.
 *
 * Today an audit replays a round bit for bit, on WASM only: a round of a tab
 * on another backend is skipped (jobs/audits.ts, BACKEND). This measures
 * what replaying it on WASM would see.
 *
 * Method (tiny, 3 stages, b = 32, int8 boundaries: the adversarial test's run):
 *   - In Node on WASM, the three stages train as one pipeline (StageCompute,
 *     the pipeline worker's arithmetic, every boundary through the codec) to a
 *     start point: step 0 (fresh weights) and step PRETRAIN. From there, K
 *     more microbatches of the run's data are recorded per stage: what each
 *     stage received (token windows, activation frames, targets, gradient
 *     frames), as a miner of that stage would have.
 *   - Each stage's round is then run again from its start weights and
 *     optimizer state on those very inputs (audit/spread.ts, runStageRound):
 *     in Node on WASM (the validator's replay; it must reproduce the
 *     pipeline's own frames byte for byte) and in Chromium tabs' workers on
 *     WASM, WebGL and WebGPU (SwiftShader; with the WGSL codec and fused
 *     optimizer the tab uses).
 *   - Against the validator's replay, per microbatch i (its forward runs on
 *     the weights after i inner steps): the activation and gradient frames
 *     sent (decoded: relative L2 error ‖x − r‖/‖r‖; and whether the bytes are
 *     identical), the loss (|Δ|); and the weights after k steps, relative to
 *     the round's own update: ‖w_x − w_r‖ / ‖w_r − w_start‖ (what a merge
 *     contribution, anchor − weights, differs by); and AdamW's moments at the
 *     end (‖m_x − m_r‖/‖m_r‖, the same for v).
 *   - For contrast, what the cheats the audits must catch change in the same
 *     measures: noise of 1% of the output's RMS (≈ 0.01 relative error) and a
 *     lazy learner that never steps (1.0 of the update).
 *
 * Budgets: K = BENCH_K (default 20) microbatches of BENCH_BATCH (default 8)
 * rows per round; PRETRAIN = BENCH_PRETRAIN (default 60) steps. Inside its own
 * network namespace (the tabs load the app from a coordinator).
 */
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { BatchSampler, PRESETS, Stage, decodeBoundary, exportStageWeights, stageSpecs, type ModelConfig, type RunLayout, type StageInput } from '@train-at-home/model';
import { DATA_DIR, datasetName, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { StageCompute, distance, flatWeights, momentsError, runStageRound, type InnerTraining, type StageRound, type StageRoundInputs, type StageRoundMicrobatch } from '@train-at-home/swarm';
import { launchBrowser, startCoordinator } from '../e2e/lib';
import { finish, machine } from './lib';

const K = Number(process.env.BENCH_K ?? 20);
const BATCH = Number(process.env.BENCH_BATCH ?? 8);
const PRETRAIN = Number(process.env.BENCH_PRETRAIN ?? 60);
const SEED = 11;
const PRESET = 'tiny' as const;
const LAYOUT: RunLayout = { stages: 3, bottleneck: 32, int8: true };
const TRAINING: InnerTraining = { peakLr: 0.006, warmupSteps: 10, totalSteps: 200, clipNorm: 1 };
const KEEP = [1, 2, 5, 10, 20, 40].filter((k) => k <= K);
const started = performance.now();

await initNodeBackend();
const preset = PRESETS[PRESET];
prepareData({ outDir: DATA_DIR, vocabSize: preset.vocabSize });
const data = loadDataset(join(DATA_DIR, datasetName(preset.vocabSize)));
const config: ModelConfig = { ...preset, vocabSize: data.manifest.vocabSize };
if (config.vocabSize !== preset.vocabSize) throw new Error(`the dataset's vocabulary (${config.vocabSize}) is not the preset's`);
const T = config.contextLength;
const specs = stageSpecs(config, LAYOUT);

/** The three stages as one pipeline on WASM; `record` collects what each stage received. */
const pipeline = specs.map((spec) => new StageCompute(new Stage(spec, SEED), TRAINING));
const sampler = new BatchSampler(data.train, BATCH, T, SEED + 1);
async function pipelineStep(record?: StageRoundMicrobatch[][], sent?: Array<Array<StageRound['sent'][number]>>): Promise<void> {
  const batch = sampler.next();
  const [s0, s1, s2] = pipeline as [StageCompute, StageCompute, StageCompute];
  const tokens: StageInput = { batch: BATCH, time: T, x: tf.tensor2d(batch.inputs, [BATCH, T], 'int32') };
  const a0 = s0.forward(tokens);
  const f0 = await s0.encode(a0);
  const in1: StageInput = { batch: BATCH, time: T, x: s1.decode(f0, BATCH * T, specs[1]!.inputWidth) };
  const a1 = s1.forward(in1);
  const f1 = await s1.encode(a1);
  const in2: StageInput = { batch: BATCH, time: T, x: s2.decode(f1, BATCH * T, specs[2]!.inputWidth), targets: tf.tensor2d(batch.targets, [BATCH, T], 'int32') };
  const r2 = await s2.backward(in2, undefined, true);
  const g2 = await s2.encode(r2.inputGrad!);
  const og1 = s1.decode(g2, BATCH * T, specs[1]!.outputWidth);
  const r1 = await s1.backward(in1, og1, true);
  const g1 = await s1.encode(r1.inputGrad!);
  const og0 = s0.decode(g1, BATCH * T, specs[0]!.outputWidth);
  await s0.backward(tokens, og0, true);
  tf.dispose([tokens.x, a0, in1.x, a1, in2.x, in2.targets!, r2.inputGrad!, og1, r1.inputGrad!, og0]);
  record?.[0]!.push({ batch: BATCH, tokens: batch.inputs, outputGrad: g1 });
  record?.[1]!.push({ batch: BATCH, input: f0, outputGrad: g2 });
  record?.[2]!.push({ batch: BATCH, input: f1, targets: batch.targets });
  sent?.[0]!.push({ activation: f0 });
  sent?.[1]!.push({ activation: f1, gradient: g1 });
  sent?.[2]!.push({ gradient: g2, loss: r2.loss });
}

/** The recorded rounds of each stage from each start point. */
const rounds: Array<{ from: number; stage: number; inputs: StageRoundInputs; pipelineSent: StageRound['sent'] }> = [];
for (const from of [0, PRETRAIN]) {
  while (pipeline[0]!.step < from) await pipelineStep();
  const startWeights = await Promise.all(pipeline.map((c) => exportStageWeights(c.stage)));
  const startState = await Promise.all(pipeline.map((c) => c.exportState()));
  const record: StageRoundMicrobatch[][] = [[], [], []];
  const sent: Array<Array<StageRound['sent'][number]>> = [[], [], []];
  for (let i = 0; i < K; i++) await pipelineStep(record, sent);
  for (let stage = 0; stage < 3; stage++) {
    rounds.push({
      from,
      stage,
      inputs: { preset: PRESET, layout: LAYOUT, stage, seed: SEED, training: TRAINING, startWeights: startWeights[stage]!, startState: startState[stage]!, microbatches: record[stage]!, keepWeightsAt: KEEP },
      pipelineSent: sent[stage]!,
    });
  }
}
console.log(`backend-spread: recorded ${rounds.length} rounds of ${K} microbatches (from steps 0 and ${PRETRAIN}) in ${Math.round((performance.now() - started) / 1000)} s`);

// The validator's replay: Node, WASM. It must be the pipeline's own computation, byte for byte.
const reference = [];
for (const r of rounds) {
  const replay = await runStageRound(r.inputs);
  const exact = replay.sent.every((s, i) => sameFrame(s.activation, r.pipelineSent[i]!.activation) && sameFrame(s.gradient, r.pipelineSent[i]!.gradient) && s.loss === r.pipelineSent[i]!.loss);
  if (!exact) throw new Error(`the WASM replay of stage ${r.stage + 1}'s round from step ${r.from} is not the pipeline's own computation`);
  reference.push(replay);
}

// The tabs: one fresh worker per round and backend, as a tab computes it.
const { app, url } = await startCoordinator({ name: 'bench-backend-spread', preset: PRESET, stages: 3, bottleneck: 32 });
const browser = await launchBrowser(['--enable-unsafe-webgpu', `--unsafely-treat-insecure-origin-as-secure=${url}`]);
const page = await browser.context.newPage();
page.on('console', (m) => /error|fail/i.test(m.text()) && console.log(`[tab] ${m.text()}`));
await page.goto(url);

type StepRow = { i: number; activationRelErr?: number; gradientRelErr?: number; lossAbsDiff?: number; identical: boolean };
type RoundRow = { backend: string; from: number; stage: number; ms: number; steps: StepRow[]; weights: Array<{ step: number; relToUpdate: number; relToWeights: number; identical: boolean }>; momentsRelErr?: number; error?: string };
const rows: RoundRow[] = [];
for (const backend of ['wasm', 'webgl', 'webgpu'] as const) {
  for (const [n, r] of rounds.entries()) {
    const t0 = performance.now();
    let got: StageRound;
    try {
      got = (await page.evaluate(([b, inputs]) => (window as unknown as { trainAtHomeBench: { stageRound(b: string, i: unknown): Promise<StageRound> } }).trainAtHomeBench.stageRound(b, inputs), [backend, r.inputs] as const)) as StageRound;
    } catch (e) {
      rows.push({ backend, from: r.from, stage: r.stage, ms: performance.now() - t0, steps: [], weights: [], error: (e as Error).message.split('\n')[0]!.slice(0, 200) });
      console.log(`backend-spread: ${backend} stage ${r.stage + 1} from ${r.from}: ${rows[rows.length - 1]!.error}`);
      continue;
    }
    const ref = reference[n]!;
    const spec = specs[r.stage]!;
    const steps: StepRow[] = got.sent.map((s, i) => {
      const want = ref.sent[i]!;
      const row: StepRow = { i, identical: sameFrame(s.activation, want.activation) && sameFrame(s.gradient, want.gradient) && s.loss === want.loss };
      if (want.activation) row.activationRelErr = relErr(s.activation!, want.activation, BATCH * T, spec.outputWidth);
      if (want.gradient) row.gradientRelErr = relErr(s.gradient!, want.gradient, BATCH * T, spec.inputWidth);
      if (want.loss !== undefined) row.lossAbsDiff = Math.abs(s.loss! - want.loss);
      return row;
    });
    const flat = (bytes: Uint8Array): Float32Array => flatWeights(bytes, r.inputs.startWeights);
    const start = flat(r.inputs.startWeights);
    const weights = got.weights.map((w) => {
      const mine = flat(w.bytes);
      const theirs = flat(ref.weights.find((x) => x.step === w.step)!.bytes);
      return { step: w.step, relToUpdate: distance(mine, theirs) / distance(theirs, start), relToWeights: distance(mine, theirs) / norm(theirs), identical: distance(mine, theirs) === 0 };
    });
    const momentsRelErr = momentsError(got.state, ref.state);
    rows.push({ backend: got.backend, from: r.from, stage: r.stage, ms: got.ms, steps, weights, momentsRelErr });
    const worst = (f: (s: StepRow) => number | undefined): string => Math.max(0, ...steps.map((s) => f(s) ?? 0)).toExponential(2);
    console.log(
      `backend-spread: ${got.backend} stage ${r.stage + 1} from step ${r.from}: ${steps.filter((s) => s.identical).length}/${steps.length} microbatches identical, ` +
        `max rel. error activation ${worst((s) => s.activationRelErr)}, gradient ${worst((s) => s.gradientRelErr)}, max |Δloss| ${worst((s) => s.lossAbsDiff)}; ` +
        `weights off by ${weights.map((w) => `${w.relToUpdate.toExponential(1)}@${w.step}`).join(' ')} of the update, moments by ${momentsRelErr.toExponential(1)} (${Math.round(got.ms / 1000)} s)`,
    );
  }
}
await browser.close();
await app.close();

/** Per backend: the worst over stages and start points, for each measure, and how it grows with the inner step. */
const summary = Object.fromEntries(
  ['wasm', 'webgl', 'webgpu'].map((backend) => {
    const of = rows.filter((r) => r.backend === backend && !r.error);
    const failed = rows.filter((r) => r.backend === backend && r.error);
    if (of.length === 0) return [backend, { ran: false, error: failed[0]?.error ?? 'not run' }];
    const all = of.flatMap((r) => r.steps);
    const max = (xs: Array<number | undefined>): number => Math.max(0, ...xs.map((x) => x ?? 0));
    const byStep = (i: number): number => max(of.flatMap((r) => r.steps.filter((s) => s.i === i).flatMap((s) => [s.activationRelErr, s.gradientRelErr])));
    return [
      backend,
      {
        ran: true,
        identicalMicrobatches: `${all.filter((s) => s.identical).length}/${all.length}`,
        maxActivationRelErr: max(all.map((s) => s.activationRelErr)),
        maxGradientRelErr: max(all.map((s) => s.gradientRelErr)),
        maxLossAbsDiff: max(all.map((s) => s.lossAbsDiff)),
        boundaryRelErrByMicrobatch: Object.fromEntries([0, 1, 4, 9, 19, 39].filter((i) => i < K).map((i) => [i, byStep(i)])),
        weightsRelToUpdateByStep: Object.fromEntries(KEEP.map((k) => [k, max(of.map((r) => r.weights.find((w) => w.step === k)?.relToUpdate))])),
        maxMomentsRelErr: max(of.map((r) => r.momentsRelErr)),
        ...(failed.length ? { failedRounds: failed.length, error: failed[0]!.error } : {}),
      },
    ];
  }),
);
const headline = {
  machine: machine('wasm (validator) vs Chromium tabs: wasm, webgl and webgpu (SwiftShader)'),
  seconds: Math.round((performance.now() - started) / 1000),
  budget: `tiny, 3 stages, b=32 int8; rounds of ${K} microbatches of ${BATCH} rows from steps 0 and ${PRETRAIN}; peakLr ${TRAINING.peakLr}`,
  validatorReplayExact: true,
  cheats: { 'noise of 1% of the output RMS': { activationRelErr: 0.01 }, 'lazy learner (never steps)': { weightsRelToUpdate: 1 } },
  backends: summary,
  rows: rows.map((r) => ({ ...r, ms: Math.round(r.ms), steps: r.steps.map((s) => ({ ...s })) })),
};
finish('backend-spread', headline);
process.exit(0);

function sameFrame(a: Uint8Array | undefined, b: Uint8Array | undefined): boolean {
  if (a === undefined || b === undefined) return a === b;
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function relErr(got: Uint8Array, want: Uint8Array, rows: number, cols: number): number {
  const g = decodeBoundary(got, { rows, cols, precision: 'int8' }).data;
  const w = decodeBoundary(want, { rows, cols, precision: 'int8' }).data;
  return distance(g, w) / norm(w);
}

function norm(a: Float32Array): number {
  let s = 0;
  for (const x of a) s += x * x;
  return Math.sqrt(s);
}
