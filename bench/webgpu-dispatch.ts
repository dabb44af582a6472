/**
 * npm run bench:webgpu-dispatch — what bounds a WebGPU training step: the
 * GPU calls of one microbatch of one `small` middle stage (stage 2 of the
 * default run's 3, batch 8), counted in a Chromium tab's worker on WebGPU
 * (SwiftShader here; the same code on a real GPU), with the tab's own WGSL
 * codec and fused optimizer installed (countGpuWork, model/webgpu/counters.ts):
 * dispatches (kernel launches), buffers created, submits, queue writes.
 *
 * A step is the pipeline worker's microbatch (swarm's syntheticStage): the
 * input frame decoded, forward, activation encoded and read back, gradient
 * frame decoded, backward with the AdamW step, input gradient encoded and read
 * back. Counts after warm-up are the steady state; every measured step must
 * count the same dispatches (a step's launches do not depend on its data).
 *
 * `before` is the count the first run of this benchmark recorded (the landed
 * code, named by its commit), carried forward from bench/results/webgpu-dispatch.json;
 * `after` is this run's, on the commit it ran on.
 *
 * Budgets: BENCH_WARMUP (default 2) warm-up steps, BENCH_STEPS (default 2)
 * measured ones; SwiftShader runs one in tens of seconds. Timings here are a
 * software adapter's: only the counts carry over to a GPU.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { GpuCounts } from '@train-at-home/model/webgpu';
import type { SyntheticStageOptions } from '@train-at-home/swarm';
import { defaultRunConfig } from '../server/src/run-config';
import { launchBrowser, startCoordinator } from '../e2e/lib';
import { RESULTS_DIR, finish, machine } from './lib';

const WARMUP = Number(process.env.BENCH_WARMUP ?? 2);
const STEPS = Number(process.env.BENCH_STEPS ?? 2);
const BATCH = 8;
const run = defaultRunConfig({ preset: 'small' });
const options: SyntheticStageOptions = {
  preset: 'small',
  layout: { stages: run.stages, bottleneck: run.bottleneck, int8: run.int8, ...(run.codec ? { codec: run.codec } : {}) },
  stage: 1,
  batch: BATCH,
};
const started = performance.now();
const commit = gitCommit();

const { app, url } = await startCoordinator({ name: 'bench-webgpu-dispatch', preset: 'small', stages: run.stages, bottleneck: run.bottleneck });
const browser = await launchBrowser(['--enable-unsafe-webgpu', `--unsafely-treat-insecure-origin-as-secure=${url}`]);
const page = await browser.context.newPage();
page.on('console', (m) => /error|fail/i.test(m.text()) && console.log(`[tab] ${m.text()}`));
await page.goto(url);
type Check = { ok: boolean; maxRelativeDiff?: number; worst?: string };
type Result = { backend: string; msPerStep: number; tokensPerSec: number; warmupCounts?: GpuCounts[]; stepCounts?: GpuCounts[]; kernels?: Record<string, number>; kernelCheck?: Record<string, unknown> };
const r = (await page.evaluate(
  ([o, w, s]) => (window as unknown as { trainAtHomeBench: { stageSteps(b: string, o: unknown, w: number, s: number): Promise<unknown> } }).trainAtHomeBench.stageSteps('webgpu', o, w, s),
  [options, WARMUP, STEPS] as const,
)) as Result;
await browser.close();
await app.close();
if (r.backend !== 'webgpu' || !r.stepCounts?.length) throw new Error(`the tab did not train on WebGPU (backend ${r.backend}): no counts`);

// Which of the tab's programs passed their checks and were in use for the count.
const checks = Object.fromEntries(Object.entries(r.kernelCheck ?? {}).filter(([, c]) => c && typeof c === 'object' && 'ok' in (c as object)).map(([k, c]) => [k, (c as Check).ok]));
console.log(`webgpu-dispatch: kernel checks ${JSON.stringify(r.kernelCheck)}`);
for (const [i, c] of (r.warmupCounts ?? []).entries()) console.log(`webgpu-dispatch: warm-up step ${i + 1}: ${describe(c)}`);
for (const [i, c] of r.stepCounts.entries()) console.log(`webgpu-dispatch: step ${i + 1}: ${describe(c)}`);
console.log(`webgpu-dispatch: programs of the last step by kind: ${Object.entries(r.kernels ?? {}).sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k} ${n}`).join(', ')}`);
const dispatches = new Set(r.stepCounts.map((c) => c.dispatches));
if (dispatches.size !== 1) throw new Error(`measured steps launched different numbers of kernels (${[...dispatches].join(', ')}): not a steady state`);
const max = (k: keyof GpuCounts): number => Math.max(...r.stepCounts!.map((c) => c[k]));
const now = { dispatchesPerStep: max('dispatches'), buffersCreatedPerStep: max('buffersCreated'), submitsPerStep: max('submits'), writesPerStep: max('writes'), commit };
const previous = join(RESULTS_DIR, 'webgpu-dispatch.json');
const before = (existsSync(previous) ? (JSON.parse(readFileSync(previous, 'utf8')) as { before?: typeof now }).before : undefined) ?? now;

finish('webgpu-dispatch', {
  dispatchesPerStep: { before: before.dispatchesPerStep, after: now.dispatchesPerStep },
  buffersCreatedPerStep: { before: before.buffersCreatedPerStep, after: now.buffersCreatedPerStep },
  submitsPerStep: { before: before.submitsPerStep, after: now.submitsPerStep },
  writesPerStep: { before: before.writesPerStep, after: now.writesPerStep },
  before,
  after: now,
  reduction: Number((before.dispatchesPerStep / now.dispatchesPerStep).toFixed(2)),
  step: { preset: 'small', stage: '2 of 3 (middle)', batch: BATCH, layout: options.layout, tokens: BATCH * 128 },
  // What the last measured step launched, by kind, most first: what fused programs would replace.
  inUse: checks,
  kernels: Object.fromEntries(Object.entries(r.kernels ?? {}).sort((a, b) => b[1] - a[1])),
  warmupCounts: r.warmupCounts,
  stepCounts: r.stepCounts,
  msPerStep: Math.round(r.msPerStep),
  budget: `${WARMUP} warm-up and ${STEPS} measured steps; timings are SwiftShader's (software), only the counts carry over to a GPU`,
  seconds: Math.round((performance.now() - started) / 1000),
  machine: machine('chromium: webgpu (SwiftShader), headless'),
});
process.exit(0);

function describe(c: GpuCounts): string {
  return `${c.dispatches} dispatches in ${c.passes} passes, ${c.submits} submits, ${c.buffersCreated} buffers created (${(c.bytesCreated / 1024).toFixed(0)} KiB), ${c.writes} queue writes, ${c.bindGroups} bind groups`;
}

function gitCommit(): string {
  try {
    const sha = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
    // Code only: results and docs do not change a count.
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no', '--', '.', ':!bench/results', ':!*.md'], { encoding: 'utf8' }).trim() !== '';
    return dirty ? `${sha} (with uncommitted changes)` : sha;
  } catch {
    return 'unknown';
  }
}
