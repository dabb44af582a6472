/**
 * bench/browser: in headless Chromium (Debian's, driven by playwright-core),
 * 1. tokens/s of one tab training the whole `small` model on each backend
 *    that initialises (WASM; WebGPU on SwiftShader when the browser offers it;
 *    WebGL where a GL driver exists), forward + backward + AdamW per step;
 * 2. tokens/s of a 2-stage swarm of 2 tabs (one per stage) training `small`
 *    through the coordinator's pipeline, over WebRTC.
 * Runs inside its own network namespace: `npm run bench:browser`.
 * Budgets: BENCH_STEPS (default 4) measured WASM steps of batch 8;
 * software WebGPU gets 1 step of batch 2 (it is ~80x slower than WASM here);
 * BENCH_SWARM_S (default 90) seconds of swarm training after warm-up.
 */
import { launchBrowser, openTab, startCoordinator } from '../e2e/lib';
import { finish, machine } from './lib';

const steps = Number(process.env.BENCH_STEPS ?? 4);
const swarmSeconds = Number(process.env.BENCH_SWARM_S ?? 90);

const { app, url } = await startCoordinator({
  name: 'bench-browser',
  preset: 'small',
  stages: 2,
  bottleneck: 64,
  training: { batchSize: 8, peakLr: 0.003, warmupSteps: 10, totalSteps: 2000 },
  merge: { every: 1000 },
});
// WebGPU lives only in secure contexts: the namespace's http origin is declared one.
const browser = await launchBrowser(['--enable-unsafe-webgpu', `--unsafely-treat-insecure-origin-as-secure=${url}`]);
const page = await browser.context.newPage();
await page.goto(url);

type Row = { backend: string; tokensPerSec: number | null; batch: number; steps: number; msPerStep?: number; warmupMs?: number; note?: string };
const rows: Row[] = [];
for (const backend of ['wasm', 'webgpu', 'webgl'] as const) {
  const budget = backend === 'wasm' ? { steps, batch: 8 } : { steps: 1, batch: 2 };
  try {
    const r = (await page.evaluate(`window.trainAtHomeBench.benchLocal(${JSON.stringify({ backend, preset: 'small', ...budget })})`)) as {
      backend: string;
      tokensPerSec: number;
      msPerStep: number;
      warmupMs: number;
    };
    rows.push({ backend, tokensPerSec: Math.round(r.tokensPerSec), ...budget, msPerStep: Math.round(r.msPerStep), warmupMs: Math.round(r.warmupMs), ...(backend === 'webgpu' ? { note: 'SwiftShader (software adapter)' } : {}) });
  } catch (e) {
    rows.push({ backend, tokensPerSec: null, ...budget, note: (e as Error).message.split('\n')[0]!.slice(0, 160) });
  }
  console.log(JSON.stringify(rows[rows.length - 1]));
}
await page.close();

// The swarm: two tabs, one per stage, training `small` (batch 8) peer to peer.
const tabs = [await openTab(browser.context, url), await openTab(browser.context, url)];
const stageSizes = async (): Promise<number[]> => (await app.coordinator.stageMap()).map((s: { miners: unknown[] }) => s.miners.length);
const deadline = Date.now() + 180_000;
while ((await stageSizes()).join() !== '1,1' && Date.now() < deadline) await new Promise((r) => setTimeout(r, 500));
const losses = async (): Promise<number> => (await app.fastify.inject({ method: 'GET', url: '/api/metrics' })).json().counts.trainLoss;
while ((await losses()) < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 1000)); // warm-up: first microbatches
const n0 = await losses();
const t0 = performance.now();
await new Promise((r) => setTimeout(r, swarmSeconds * 1000));
const microbatches = (await losses()) - n0;
const seconds = (performance.now() - t0) / 1000;
const swarmTokensPerSec = Math.round((microbatches * 8 * 128) / seconds);
console.log(JSON.stringify({ swarm: { tabs: tabs.length, stages: 2, microbatches, seconds: Math.round(seconds), relayedFrameBytes: app.coordinator.relayed.frameBytes } }));

await browser.close();
await app.close();
const tokensPerSec = Object.fromEntries(rows.map((r) => [r.backend, r.tokensPerSec]));
finish('browser', {
  tokensPerSec,
  swarmTokensPerSec,
  preset: 'small',
  rows,
  swarm: { tabs: 2, stages: 2, batch: 8, seconds: Math.round(seconds), microbatches, relayedFrameBytes: app.coordinator.relayed.frameBytes },
  budget: `wasm: ${steps} steps of batch 8 after 1 warm-up; webgpu/webgl: 1 step of batch 2 after 1 warm-up (software adapters); swarm: ${swarmSeconds} s after its first 2 microbatches`,
  browser: 'Debian Chromium, headless',
  gpu: 'none on this machine (the device tool was not lent to this session)',
  machine: machine('chromium: wasm / webgpu (SwiftShader)'),
});
process.exit(0);
