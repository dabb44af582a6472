import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../server/src/app';
import { launchBrowser, noPageErrors, openTab, screenshot, startCoordinator, tabView } from './lib';

/**
 * How far the fused programs may move a loss curve, in nats at any step: float32 sums in another order. Measured on
 * SwiftShader: 4.8e-7 over 5 steps of the `small` last stage below, whose loss fell 8.36 → 2.97. The test runs 3
 * (each step of each curve took ~20 s of the suite on SwiftShader; the difference is largest where the curves have
 * moved least apart, at no particular step).
 */
const FUSION_BAND = 1e-4;

let app: App;
let url: string;
const browsers: Array<Awaited<ReturnType<typeof launchBrowser>>> = [];

beforeAll(async () => {
  // Small microbatches: SwiftShader runs WebGPU on the CPU, far slower than WASM.
  // A merge every 3 microbatches, each round audited: the validator (WASM) replays the WebGPU and WebGL tabs' rounds within their backends' measured spread.
  // The ready window is SwiftShader's: a tab answers `merge` once its microbatch under way is done and its weights and
  // optimizer state are read back and hashed, seconds each on a software GPU. In the default 5 s it answered some
  // rounds late and sat them out (merged, so committed and drawn, in none of 300 s in a CI run: no audit of it to wait for).
  ({ app, url } = await startCoordinator({ name: 'e2e-webgpu', preset: 'tiny', stages: 2, bottleneck: 32, training: { batchSize: 4, peakLr: 0.006, warmupSteps: 5, totalSteps: 200 }, merge: { every: 3, readyMs: 20_000 }, incentives: { auditRate: 1 } }));
  // --enable-unsafe-webgpu: the only way to a WebGPU adapter here (SwiftShader, a software "fallback" adapter).
  // WebGPU exists only in secure contexts; the namespace's plain-http origin is declared one for this profile.
  browsers.push(await launchBrowser(['--enable-unsafe-webgpu', `--unsafely-treat-insecure-origin-as-secure=${url}`]), await launchBrowser());
});
// A page that threw fails the test it threw in.
afterEach(noPageErrors);
afterAll(async () => {
  for (const b of browsers) await b.close();
  await app?.close();
});

describe('a tab on WebGPU', () => {
  it('forced to ?backend=webgpu on SwiftShader, trains its stage with the WGSL int8 codec and fused optimizer, which agree with the WASM path; its rounds and a WebGL tab\'s pass the WASM validator\'s audits; a lost GPU device falls back to WASM and training goes on', { timeout: 900_000 }, async () => {
    const gpuTab = await openTab(browsers[0]!.context, `${url}/?backend=webgpu`);
    gpuTab.on('console', (m) => console.log(`[webgpu tab] ${m.text()}`));
    await expect.poll(async () => (await tabView(gpuTab)).backend, { timeout: 120_000, interval: 1000 }).toBe('webgpu');
    expect(await gpuTab.getByTestId('backend-why').textContent()).toMatch(/webgpu was asked for/);
    // The codec kernel check: frames byte-identical to the JS codec's on seeded data with rounding ties.
    await expect.poll(async () => (await gpuTab.getByTestId('kernel-check').count()) && gpuTab.getByTestId('kernel-check').getAttribute('data-ok'), { timeout: 120_000, interval: 1000 }).toBe('true');
    expect(await gpuTab.getByTestId('kernel-check').textContent()).toMatch(/byte-identical/);
    // The fused optimizer kernels (SumSquares, AdamW moment, variance, weight) agree with the WASM arithmetic and are in use.
    expect(await gpuTab.getByTestId('optimizer-check').getAttribute('data-ok')).toBe('true');
    console.log(`e2e: ${await gpuTab.getByTestId('optimizer-check').textContent()}`);
    // The fused layer norm, GELU, attention and residual add with its norm, and the matmuls that read transposed
    // operands in place, agree with tfjs's composites, forward and backward, on odd shapes, and are in use.
    for (const id of ['layer-norm-check', 'gelu-check', 'matmul-check', 'attention-check', 'add-layer-norm-check']) {
      expect(await gpuTab.getByTestId(id).getAttribute('data-ok')).toBe('true');
      console.log(`e2e: ${await gpuTab.getByTestId(id).textContent()}`);
    }

    // Alone in a 2-stage run, the tab waits, and says how many more participants are needed and how to add them
    // (this coordinator starts no miners of its own).
    await expect.poll(async () => (await gpuTab.getByTestId('waiting-help').count()) && gpuTab.getByTestId('waiting-help').getAttribute('data-needed'), { timeout: 120_000, interval: 1000 }).toBe('1');
    const help = (await gpuTab.getByTestId('waiting-help').textContent()) ?? '';
    expect(help).toMatch(/This run has 2 stages and one has nobody yet \(stage 2\): 1 more participant is needed/);
    expect(help).toMatch(new RegExp(`open ${url.replace(/[.]/g, '\\.')} in another tab .* npm run miner -- --coordinator`));
    expect(help).not.toMatch(/starts miners of its own/);
    await screenshot(gpuTab, 'waiting-tab.png');

    // A WebGL tab takes the other stage; the WebGPU tab's microbatches complete forward and backward.
    const glTab = await openTab(browsers[1]!.context, `${url}/?backend=webgl`);
    await expect.poll(async () => (await app.coordinator.stageMap()).map((s: { miners: unknown[] }) => s.miners.length), { timeout: 60_000 }).toEqual([1, 1]);
    await expect.poll(async () => (await tabView(gpuTab)).microbatches, { timeout: 300_000, interval: 2000 }).toBeGreaterThanOrEqual(3);
    expect((await tabView(glTab)).microbatches).toBeGreaterThanOrEqual(2);
    expect((await tabView(glTab)).backend).toBe('webgl');
    const losses = (await app.fastify.inject({ method: 'GET', url: '/api/metrics/train_loss' })).json().points;
    expect(losses.length).toBeGreaterThanOrEqual(2);
    for (const l of losses) expect(Number.isFinite(l.value)).toBe(true);
    expect((await tabView(gpuTab)).backend).toBe('webgpu');
    // Beside its tokens/s the tab shows the arithmetic they are (6 per parameter of its stage per token).
    await expect.poll(async () => Number((await gpuTab.getByTestId('tflops').count()) && (await gpuTab.getByTestId('tflops').getAttribute('data-value'))), { timeout: 60_000, interval: 1000 }).toBeGreaterThan(0);
    console.log(`e2e: the WebGPU tab trains at ${await gpuTab.getByTestId('tokens-per-sec').textContent()}`);
    expect(await gpuTab.getByTestId('tflops').textContent()).toMatch(/· [\d.]+ (G|T)FLOP\/s/);
    expect(await gpuTab.locator('.log').textContent()).not.toMatch(/GPU device lost/);
    await screenshot(gpuTab, 'webgpu-tab.png');

    // Audited: each tab's whole rounds, replayed on WASM by the validator within its backend's measured spread
    // (REPLAY_TOLERANCE, from bench:backend-spread), pass; none fails, none goes unanswered, none is skipped (for its
    // backend or any other reason): every one decided by now passed.
    const byBackend = async (): Promise<Record<string, string[]>> => {
      const rows = await app.db.query<{ backend: string; status: string; reason: string | null }>('SELECT m.backend, a.status, a.reason FROM audits a JOIN miners m ON m.id = a.miner_id ORDER BY a.created_at');
      const out: Record<string, string[]> = {};
      for (const r of rows) (out[r.backend] ??= []).push(`${r.status}${r.reason ? `:${r.reason}` : ''}`);
      return out;
    };
    let tabLogsShown = false;
    await expect.poll(async () => {
      const audits = await byBackend();
      // A failed one's evidence, as soon as there is one (a failure here ends in this poll's timeout).
      const failed = await app.db.query<{ reason: string; detail: unknown }>(`SELECT reason, detail FROM audits WHERE status = 'failed'`);
      console.log(`e2e: audits ${JSON.stringify(audits)}${failed.map((f) => `; failed ${f.reason}: ${JSON.stringify(f.detail).slice(0, 600)}`).join('')}`);
      // And the tabs' own account of their merges, once.
      if (failed.length && !tabLogsShown) {
        tabLogsShown = true;
        for (const [name, tab] of [['webgpu', gpuTab], ['webgl', glTab]] as const) console.log(`e2e: the ${name} tab's log: ${await tab.locator('.log').textContent()}`);
      }
      return ['webgpu', 'webgl'].every((b) => audits[b]?.includes('passed'));
    }, { timeout: 300_000, interval: 5000 }).toBe(true);
    const failed = await app.db.query<{ detail: unknown }>(`SELECT detail FROM audits WHERE status = 'failed'`);
    for (const f of failed) console.log(`e2e: failed audit ${JSON.stringify(f.detail).slice(0, 600)}`);
    const audits = Object.values(await byBackend()).flat();
    expect(audits.filter((a) => !/^(passed|open|replaying)$/.test(a))).toEqual([]);
    expect(await app.db.query(`SELECT miner_id, kind, reason FROM flags`)).toEqual([]);

    // Drill: the GPU device is lost (as after a driver reset). The tab says so, falls back, and trains on.
    await gpuTab.evaluate('window.trainAtHome.loseDevice()');
    await expect.poll(async () => (await tabView(gpuTab)).backend, { timeout: 120_000, interval: 1000 }).toBe('wasm');
    expect(await gpuTab.locator('.log').textContent()).toMatch(/GPU device lost/);
    // Back on WASM it registers again, as a new process under the same key (a restart: miner_restarts), loads its
    // stage's checkpoint and trains; the first round its new process commits is audited from the restart on, from the
    // agreed weights and a fresh optimizer state, and passes: an honest restart is never flagged. (Before restarts were
    // told from reconnections, that audit expected the previous process's optimizer state: AUDIT_START_MISMATCH, the
    // miner flagged, and the tab stalled at 2 microbatches in fresh-clone runs.)
    // What each tab shows, printed whenever it changes (a CI log keeps only its tail: the evidence if this ever stalls).
    const drill = Date.now();
    let shown = '';
    await expect
      .poll(
        async () => {
          const [gpu, gl] = [await tabView(gpuTab), await tabView(glTab)];
          const now = JSON.stringify({ gpu, gl });
          if (now !== shown) console.log(`e2e: +${Math.round((Date.now() - drill) / 1000)} s after the drill: ${(shown = now)}`);
          // Microbatches trained since the fallback, and audits passed of rounds the new process committed.
          const [after] = await app.db.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM audits a JOIN miner_restarts x ON x.miner_id = a.miner_id
             JOIN round_commitments c ON c.miner_id = a.miner_id AND c.stage = a.stage AND c.round = a.round
             WHERE a.status = 'passed' AND c.ready_at > x.at`,
          );
          return gpu.microbatches >= 3 && after!.n >= 1;
        },
        { timeout: 420_000, interval: 2000 },
      )
      .toBe(true)
      .catch(async (e: unknown) => {
        for (const [name, tab] of [['webgpu (now wasm)', gpuTab], ['webgl', glTab]] as const) console.log(`e2e: the ${name} tab's log: ${await tab.locator('.log').textContent()}`);
        console.log(`e2e: stage map ${JSON.stringify(await app.coordinator.stageMap())}; flags ${JSON.stringify(await app.db.query('SELECT miner_id, kind, reason FROM flags'))}`);
        const losses = (await app.fastify.inject({ method: 'GET', url: '/api/metrics/train_loss' })).json().points as unknown[];
        console.log(`e2e: ${losses.length} losses reported, the last ${JSON.stringify(losses.slice(-3))}`);
        console.log(`e2e: audits ${JSON.stringify(await byBackend())}; merges ${JSON.stringify((await app.fastify.inject({ method: 'GET', url: '/api/merges' })).json()).slice(0, 1500)}`);
        throw e;
      });
    expect(await app.db.query('SELECT count(*)::int AS n FROM miner_restarts')).toEqual([{ n: 1 }]);
    // Every audit decided passed, but one the restart forfeited: the gpu tab's audit still open when its device was
    // lost cannot be answered by its new process (forfeited RESTARTED, never flagged); nothing skipped or failed.
    expect(Object.values(await byBackend()).flat().filter((a) => !/^(passed|open|replaying|forfeited:RESTARTED)$/.test(a))).toEqual([]);
    expect(await app.db.query(`SELECT miner_id, kind, reason FROM flags`)).toEqual([]);
    // Both tabs leave the run: the tests below time nothing, but they run programs on this machine's SwiftShader,
    // which two training tabs and the validator's replay of their every round would share (left open, they trained
    // through both, 271 s of a fresh-clone CI run).
    await Promise.all([gpuTab.close(), glTab.close()]);
  });
});

describe('counting a WebGPU step', () => {
  it("counts a stage's kernel launches, submits and buffer creations per microbatch: the same launches every step, and no buffer created after warm-up (bench:webgpu-dispatch's counter)", async () => {
    const page = await browsers[0]!.context.newPage();
    await page.goto(url);
    const options = { preset: 'tiny', layout: { stages: 3, bottleneck: 32, int8: true }, stage: 1, batch: 2 };
    type Counts = { dispatches: number; buffersCreated: number; submits: number; writes: number; bindGroups: number; passes: number };
    const r = (await page.evaluate(
      ([o]) => (window as unknown as { trainAtHomeBench: { stageSteps(b: string, o: unknown, w: number, s: number): Promise<unknown> } }).trainAtHomeBench.stageSteps('webgpu', o, 2, 3),
      [options] as const,
    )) as {
      backend: string;
      warmupCounts: Counts[];
      stepCounts: Counts[];
      kernels: Record<string, number>;
      kernelCheck: Record<'layerNorm' | 'gelu' | 'matMul' | 'attention' | 'addLayerNorm', { ok: boolean; maxRelativeDiff: number; tolerance: number; worst: string }>;
    };
    console.log(`e2e: tiny middle stage, per step ${JSON.stringify(r.stepCounts)}, warm-up ${JSON.stringify(r.warmupCounts)}`);
    expect(r.backend).toBe('webgpu');
    expect(r.stepCounts).toHaveLength(3);
    // The first step fills tfjs's buffer pool: the counter sees those allocations.
    expect(r.warmupCounts[0]!.buffersCreated).toBeGreaterThan(10);
    for (const c of r.stepCounts) {
      // Every kernel launch of the forward, its recomputation, the backward and the optimizer: a one-layer stage's
      // matmuls alone launch 20 (6 forward, twice, and 2 gradients of each but the lane's), the optimizer 15.
      expect(c.dispatches).toBe(r.stepCounts[0]!.dispatches);
      expect(c.dispatches).toBeGreaterThan(40);
      expect(c.passes).toBeGreaterThan(0);
      expect(c.submits).toBeGreaterThan(0);
      // tfjs binds and writes the uniforms of each launch.
      expect(c.bindGroups).toBe(c.dispatches);
      // After warm-up a step allocates nothing: tfjs pools storage, uniform and read-back buffers, and uploads go
      // into pooled buffers by queue.writeBuffer instead of a new staging buffer each (useWriteBufferUploads).
      expect(c.buffersCreated).toBe(0);
    }
    // By kind: every program of the last step counted once (tfjs's own and ours, the multi-output ones included).
    console.log(`e2e: programs by kind ${JSON.stringify(r.kernels)}`);
    expect(Object.values(r.kernels).reduce((a, b) => a + b, 0)).toBe(r.stepCounts[2]!.dispatches);
    expect(r.kernels['matMulPacked']).toBeGreaterThan(0);
    // The fused programs (each checked against tfjs's composite, forward and backward, on odd shapes) replaced the
    // composites. The 1-layer middle stage's 3 layer norms each read a residual sum (the bottleneck's lane returning,
    // the attention's, the MLP's with the next bottleneck's lane taken), and it has 1 attention and 1 GELU: each run
    // in the forward, again in the backward's recomputation, and differentiated once.
    console.log(`e2e: fused checks ${JSON.stringify(r.kernelCheck)}`);
    for (const op of ['layerNorm', 'gelu', 'matMul', 'attention', 'addLayerNorm'] as const) {
      expect(r.kernelCheck[op].ok).toBe(true);
      expect(r.kernelCheck[op].maxRelativeDiff).toBeLessThanOrEqual(r.kernelCheck[op].tolerance);
    }
    expect(r.kernels['tah_add_layer_norm']).toBe(6);
    expect(r.kernels['tah_add_layer_norm_grad']).toBe(3);
    expect(r.kernels['tah_layer_norm_dgdb']).toBe(3);
    expect(r.kernels['tah_attention']).toBe(2);
    expect(r.kernels['tah_attention_grad']).toBe(1);
    expect(r.kernels['tah_gelu']).toBe(2);
    expect(r.kernels['tah_gelu_grad']).toBe(1);
    // Nothing of the composites is left: no norm's rsqrt, no erf, no attention's split, head transposes, softmax or
    // concat, no lane's pad or slice, no bias gradient's column sum.
    for (const kind of ['unary_RSQRT', 'unary_ERF', 'softmax', 'transpose', 'transposeShared', 'slice', 'pad', 'concat', 'reduce_sum']) expect(r.kernels[kind], kind).toBeUndefined();
    // The residual stream's gradient is accumulated inside the add-and-norm kernels: the one add left is where the
    // stage's input feeds both the lane and the bottleneck's projection.
    expect(r.kernels['binary_ADD']).toBe(1);
    // The optimizer: one launch per parameter tensor (12 here) for the weights and both moments, Σg² one per 7
    // gradients, one for the norm and the clip factor.
    expect(r.kernels['tah_adamw']).toBe(12);
    expect(Object.entries(r.kernels).filter(([k]) => k.startsWith('tah_sum_squares')).reduce((a, [, n]) => a + n, 0)).toBe(Math.ceil(r.kernels['tah_adamw']! / 7));
    expect(r.kernels['tah_clip']).toBe(1);
    await page.close();
  });
});

describe('fused programs', () => {
  it("leave a small stage's loss curve where tfjs's composites put it: the last stage of the default run trained on one microbatch, without and then with the tab's fused layer norm, GELU, attention, residual adds with their norms, matmuls and optimizer", { timeout: 600_000 }, async () => {
    const page = await browsers[0]!.context.newPage();
    await page.goto(url);
    const options = { preset: 'small', layout: { stages: 3, bottleneck: 64, int8: true }, batch: 1, steps: 3, lr: 3e-3 };
    const r = (await page.evaluate(([o]) => (window as unknown as { trainAtHomeBench: { fusionCurve(o: unknown): Promise<unknown> } }).trainAtHomeBench.fusionCurve(o), [options] as const)) as {
      backend: string;
      unfused: number[];
      fused: number[];
      maxAbsDiff: number;
      kernelCheck: Record<'optimizer' | 'layerNorm' | 'gelu' | 'matMul' | 'attention' | 'addLayerNorm', { ok: boolean }>;
    };
    console.log(`e2e: small last stage on WebGPU, loss per step: composites ${r.unfused.map((l) => l.toFixed(5)).join(' ')}; fused ${r.fused.map((l) => l.toFixed(5)).join(' ')}; largest difference ${r.maxAbsDiff.toExponential(2)} nats`);
    expect(r.backend).toBe('webgpu');
    for (const op of ['optimizer', 'layerNorm', 'gelu', 'matMul', 'attention', 'addLayerNorm'] as const) expect(r.kernelCheck[op].ok).toBe(true);
    expect(r.unfused).toHaveLength(options.steps);
    expect(r.fused).toHaveLength(options.steps);
    // Both train: the loss falls on the microbatch they see again and again.
    for (const curve of [r.unfused, r.fused]) {
      for (const l of curve) expect(Number.isFinite(l)).toBe(true);
      expect(curve.at(-1)!).toBeLessThan(curve[0]! - 0.5);
    }
    expect(r.maxAbsDiff).toBeLessThanOrEqual(FUSION_BAND);
  });
});
