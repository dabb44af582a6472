import type { Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../server/src/app';
import { evaluations } from '@train-at-home/testkit/evaluations';
import { E2E_RUN, launchBrowser, noPageErrors, openTab, screenshot, startCoordinator, tabView } from './lib';

let app: App;
let url: string;
const browsers: Array<Awaited<ReturnType<typeof launchBrowser>>> = [];
const tabs: Page[] = [];

beforeAll(async () => {
  // Each tab's rounds are drawn until two of them passed (unprovenAuditRate 1, PROVEN_AUDITS 2: about 8 replays of
  // the tabs' WASM rounds on the validator's own Node WASM, certain, not a draw), then next to never (0 turns the draw
  // off): at 0.25 the validator replayed about 18 rounds more of batches of 32 beside four tabs on two cores, and
  // the run took that much longer to pass the baseline.
  ({ app, url } = await startCoordinator({ name: 'e2e', ...E2E_RUN, incentives: { auditRate: 1e-9 } }));
  browsers.push(await launchBrowser(), await launchBrowser());
});
// A page that threw fails the test it threw in.
afterEach(noPageErrors);
afterAll(async () => {
  for (const b of browsers) await b.close();
  await app?.close();
});

/** A run that has not finished its schedule in this long has stopped, not slowed. */
const LOST_RUN_MS = 25 * 60_000;

const stageSizes = async (): Promise<number[]> => (await app.coordinator.stageMap()).map((s: { miners: unknown[] }) => s.miners.length);

describe('Train at Home in Chromium tabs', () => {
  it('four tabs in two browsers form two stages, train over WebRTC and bring held-out loss below the bigram baseline', async () => {
    app.validator.evaluateEveryMs = 0;
    const held = evaluations(app);
    for (const b of browsers) for (let i = 0; i < 2; i++) tabs.push(await openTab(b.context, url));
    await expect.poll(stageSizes, { timeout: 120_000, interval: 1000 }).toEqual([2, 2]);

    // Each page shows its stage and a microbatch count that rises.
    await expect.poll(async () => (await Promise.all(tabs.map(tabView))).every((v) => v.microbatches > 0), { timeout: 120_000, interval: 2000 }).toBe(true);
    expect((await Promise.all(tabs.map(tabView))).map((v) => v.stage).sort()).toEqual(['1 of 2', '1 of 2', '2 of 2', '2 of 2']);

    const started = Date.now();
    let last: { heldOutLoss: number; bigramLoss: number; rounds: number[] } | undefined;
    // On two cores, with the validator auditing a quarter of the tabs' rounds beside four tabs, held-out loss crossed
    // the baseline at 500-520 s (3.271 against 3.270 at 496 s in one CI run). Trained until it does, or until
    // both stages merged the whole schedule (past it the learning rate is at its floor): steps, not minutes, since a
    // loaded machine trains the same schedule more slowly. LOST_RUN_MS only tells a run that stopped from a slow one.
    // Each merged round's held-out loss is the validator's own, measured once as the round closes (evaluateEveryMs 0,
    // set above) and heard here: evaluations of this test's own on a timer took a fifth of the validator's CPU beside them.
    while (Date.now() - started < LOST_RUN_MS) {
      last = (await held.next(60_000)) ?? last;
      const views = await Promise.all(tabs.map(tabView));
      console.log(`e2e: ${Math.round((Date.now() - started) / 1000)} s, held-out ${last?.heldOutLoss.toFixed(3)} (bigram ${last?.bigramLoss.toFixed(3)}), tabs ${views.map((v) => `${v.phase}/${v.microbatches}`).join(' ')}`);
      if (last && last.heldOutLoss < last.bigramLoss) break;
      if (last && Math.min(...last.rounds) * E2E_RUN.merge.every >= E2E_RUN.training.totalSteps) break;
    }
    held.stop();
    await screenshot(tabs[0]!, 'train-at-home.png');
    expect(last).toBeDefined();
    expect(last!.heldOutLoss).toBeLessThan(last!.bigramLoss);

    // Every page shows its stage and a microbatch count that keeps rising.
    const later = await Promise.all(tabs.map(tabView));
    await new Promise((r) => setTimeout(r, 10_000));
    const latest = await Promise.all(tabs.map(tabView));
    for (const [i, tab] of tabs.entries()) {
      console.log(`e2e: tab ${i}: ${JSON.stringify(latest[i])}; ${(await tab.locator('.log').textContent())?.slice(-400)}`);
      expect(latest[i]!.stage).toMatch(/^[12] of 2$/);
      expect(latest[i]!.microbatches).toBeGreaterThan(later[i]!.microbatches);
      expect(latest[i]!.backend).toBe('wasm'); // no GPU here: the probe picks WASM over software WebGL
    }
    expect(latest.map((v) => v.stage).sort()).toEqual(['1 of 2', '1 of 2', '2 of 2', '2 of 2']);
    // Each page shows the merged model's latest held-out loss as the run's status gives it (polled every 5 s; the
    // validator measures a new one as each round closes).
    const shown = async (tab: Page): Promise<boolean> =>
      (await tab.getByTestId('heldout').textContent()) === Number((await app.fastify.inject({ method: 'GET', url: '/api/status' })).json().heldOutLoss).toFixed(3);
    for (const tab of tabs) await expect.poll(() => shown(tab), { timeout: 60_000, interval: 500 }).toBe(true);
    // Replicas merged, and every activation went tab to tab: nothing through the coordinator.
    // After every merge both replicas of the stage reported the same weights: each round has one
    // merged hash, no replica differed (no hash-mismatch events), and that hash is the stage's checkpoint.
    const merges = (await app.fastify.inject({ method: 'GET', url: '/api/merges' })).json();
    const pairs = merges.rounds.filter((r: { participants: string[]; endedAt: string | null }) => r.endedAt && r.participants.length === 2);
    expect(pairs.length).toBeGreaterThan(2);
    for (const r of pairs) expect(r.mergedHash).toMatch(/^[0-9a-f]{64}$/);
    expect(merges.events).toEqual([]);
    const checkpoints = (await app.fastify.inject({ method: 'GET', url: '/api/checkpoints' })).json().checkpoints;
    let matched = 0;
    for (const c of checkpoints) {
      const round = pairs.find((r: { stage: number; round: number }) => r.stage === c.stage && r.round === c.epoch);
      if (round) (expect(c.hash).toBe(round.mergedHash), matched++);
    }
    expect(matched).toBeGreaterThan(0);
    expect(app.coordinator.relayed.frameBytes).toBe(0);
    // Each page shows how it reaches each peer: here directly (one network, host candidates), with bytes, never
    // through TURN or the coordinator; and each tab's heartbeats tell the dashboard the same.
    for (const tab of tabs) {
      const paths = await tab.locator('[data-testid="path"]').evaluateAll((els) => els.map((e) => ({ path: e.getAttribute('data-path'), text: e.textContent ?? '' })));
      console.log(`e2e: paths ${JSON.stringify(paths)}`);
      expect(paths.some((p) => p.path === 'direct' && /sent/.test(p.text))).toBe(true);
      expect(paths.filter((p) => p.path === 'turn' || p.path === 'coordinator')).toEqual([]);
    }
    const dashboard = (await app.fastify.inject({ method: 'GET', url: '/api/dashboard' })).json() as { swarm: { stages: Array<{ miners: Array<{ paths?: Record<string, { peers: number; bytes: number }> }> }> } };
    const reported = dashboard.swarm.stages.flatMap((s) => s.miners.map((m) => m.paths));
    expect(reported).toHaveLength(4);
    for (const p of reported) {
      expect(p?.direct?.peers).toBeGreaterThan(0);
      expect(p?.direct?.bytes).toBeGreaterThan(0);
      expect([p?.turn, p?.coordinator]).toEqual([undefined, undefined]);
    }

    // The tabs' whole rounds replayed bit for bit in the validator (Chromium's WASM and Node's agree): audits
    // passed, none failed or went unanswered, and no honest tab was flagged.
    const audits = await app.db.query<{ status: string; reason: string | null; detail: unknown }>('SELECT status, reason, detail FROM audits ORDER BY created_at');
    console.log(`e2e: audits ${JSON.stringify(audits.map((a) => `${a.status}${a.reason ? `:${a.reason}` : ''}`))}`);
    for (const a of audits.filter((a) => a.status === 'failed')) console.log(`e2e: failed audit ${JSON.stringify(a.detail).slice(0, 600)}`);
    expect(audits.filter((a) => a.status === 'passed').length).toBeGreaterThan(0);
    expect(audits.filter((a) => a.status === 'failed' || a.status === 'unanswered')).toEqual([]);
    expect(await app.db.query('SELECT miner_id, kind, reason FROM flags')).toEqual([]);
  }, LOST_RUN_MS + 8 * 60_000);

  it('the Try it page continues a prompt with the run\'s latest agreed checkpoints, in the tab; the Dashboard links to it and its Download gives the model', async () => {
    const page = await browsers[0]!.context.newPage();
    try {
      await page.setViewportSize({ width: 1280, height: 800 });
      await page.goto(`${url}/dashboard`);
      await page.getByTestId('try-link').click();
      await expect.poll(async () => (await page.getByTestId('try-note').count()) > 0, { timeout: 60_000, interval: 500 }).toBe(true);
      const note = (await page.getByTestId('try-note').textContent()) ?? '';
      console.log(`e2e: Try it: ${note}`);
      expect(note).toMatch(/^Weights of merge rounds? [0-9]/);
      expect(note).toContain('tiny');
      await page.getByTestId('try-prompt').fill('The president said that');
      await page.getByTestId('try-tokens').fill('24');
      await page.getByTestId('try-generate').click();
      await expect.poll(async () => (await page.getByTestId('try-generate').textContent()) === 'Continue' && ((await page.getByTestId('try-rate').textContent()) ?? '').includes('tokens/s'), { timeout: 60_000, interval: 500 }).toBe(true);
      const written = ((await page.getByTestId('try-output').textContent()) ?? '').slice('The president said that'.length);
      const rate = (await page.getByTestId('try-rate').textContent()) ?? '';
      console.log(`e2e: Try it wrote ${JSON.stringify(written)} (${rate})`);
      expect(written.length).toBeGreaterThan(0);
      expect(rate).toMatch(/^(2[0-4]|1?[0-9]) tokens, [0-9.]+ tokens\/s/);
      await screenshot(page, 'try-it.png');
      await page.setViewportSize({ width: 390, height: 844 });
      await expect.poll(() => page.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);
      await screenshot(page, 'try-it-phone.png');
      // The Dashboard's Download link: the model folder as one zip, from the page's own origin.
      const zip = await page.request.get(`${url}/api/model`);
      expect(zip.status()).toBe(200);
      expect(zip.headers()['content-type']).toBe('application/zip');
      expect((await zip.body()).subarray(0, 2).toString()).toBe('PK');
    } finally {
      await page.close();
    }
  });

  it('a paused tab leaves the run and says so; resumed, it joins again and trains', async () => {
    const tab = tabs[0]!;
    await tab.getByTestId('pause').click();
    await expect.poll(async () => (await tabView(tab)).phase, { timeout: 10_000 }).toBe('idle');
    expect(await tab.getByTestId('why').textContent()).toMatch(/paused by you/);
    await expect.poll(stageSizes, { timeout: 30_000, interval: 500 }).toSatisfy((s: number[]) => s.reduce((a, b) => a + b, 0) === 3);
    await tab.getByTestId('resume').click();
    await expect.poll(stageSizes, { timeout: 60_000, interval: 500 }).toEqual([2, 2]);
    await expect.poll(async () => (await tabView(tab)).microbatches, { timeout: 120_000, interval: 2000 }).toBeGreaterThan(2);
  });

  it('closing a tab mid-training does not stop the run, and a newly opened tab joins it with the current weights', async () => {
    const closing = tabs.splice(3, 1)[0]!; // browser 2's second tab
    await closing.close();
    await expect.poll(stageSizes, { timeout: 60_000, interval: 1000 }).toSatisfy((s: number[]) => s.reduce((a, b) => a + b, 0) === 3);
    // The run goes on: losses keep arriving and both stages keep working. (With one miner left on
    // a stage and one microbatch in flight, one of the other stage's two replicas may have no
    // partner upstream until the newcomer arrives: its page says it is idle, and why.)
    const losses = async (): Promise<number> => (await app.fastify.inject({ method: 'GET', url: '/api/metrics' })).json().counts.trainLoss;
    const lossesBefore = await losses();
    const perStage = async (): Promise<number[]> => {
      const views = await Promise.all(tabs.map(tabView));
      return ['1 of 2', '2 of 2'].map((st) => views.filter((v) => v.stage === st).reduce((n, v) => n + v.microbatches, 0));
    };
    const before = await perStage();
    await expect
      .poll(perStage, { timeout: 120_000, interval: 2000 })
      .toSatisfy((now: number[]) => now.every((n, i) => n > before[i]! + 2))
      .catch(async (e: unknown) => {
        // What each remaining tab and the coordinator were doing, for a failure's log.
        for (const [i, tab] of tabs.entries()) {
          const why = (await tab.getByTestId('why').count()) ? await tab.getByTestId('why').first().textContent() : '';
          console.log(`e2e: stalled tab ${i}: ${JSON.stringify(await tabView(tab))} why=${why}; ${(await tab.locator('.log').textContent())?.slice(-800)}`);
        }
        console.log(`e2e: phases ${JSON.stringify(app.coordinator.phases.status())}; stage map ${JSON.stringify(await app.coordinator.stageMap())}`);
        throw e;
      });
    expect(await losses()).toBeGreaterThan(lossesBefore + 2);

    const newcomer = await openTab(browsers[1]!.context, url);
    tabs.push(newcomer);
    await expect.poll(stageSizes, { timeout: 60_000, interval: 1000 }).toEqual([2, 2]);
    await expect.poll(async () => (await tabView(newcomer)).microbatches, { timeout: 120_000, interval: 2000 }).toBeGreaterThan(3);
    // It started from the stage's latest checkpoint, not from scratch.
    expect(await newcomer.getByTestId('resumed').textContent()).toMatch(/^checkpoint [0-9a-f]{12}/);
    expect((await app.fastify.inject({ method: 'GET', url: '/api/metrics' })).json().counts.trainLoss).toBeGreaterThan(lossesBefore);
  });
});
