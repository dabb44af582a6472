import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { PRESETS, encodedBytes, type Precision } from '@train-at-home/model';
import { SMALL_BOUNDARY } from '../server/src/run-config';
import type { Page } from 'playwright-core';
import { HOST, launchBrowser, noPageErrors, screenshot, stopCoordinator, tabView } from './lib';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const PORT = 18_000 + Math.floor(Math.random() * 2000);
const dbDir = mkdtempSync(join(tmpdir(), 'tah-newcomer-'));
let coordinator: ChildProcess | undefined;
let output = '';
let browser: Awaited<ReturnType<typeof launchBrowser>> | undefined;
let tab: Page;
const url = `http://${HOST}:${PORT}`;
/** A tab not training again this long after the restarted coordinator answered has stopped, not slowed. */
const TRAINS_AGAIN_LOST_MS = 120_000;
/** When the coordinator first answered: the run's emission clock starts about then. */
let firstUpAt = 0;

/** Starts the coordinator in a process group of its own (npm start, or the coordinator alone on a restart). */
function startCoordinator(command: string[]): ChildProcess {
  // At info, for a failure's message: what it did with local miners (started, taken over, stopped as surplus).
  const child = spawn(command[0]!, command.slice(1), { cwd: ROOT, detached: true, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, LOG_LEVEL: 'info' } });
  // The coordinator's own log, without a line per HTTP request (this test polls often).
  const keep = (c: Buffer): void => {
    const lines = c.toString().split('\n').filter((l) => l && !/"msg":"(incoming request|request completed)"/.test(l));
    if (lines.length) output = (output + lines.map((l) => `[${new Date().toISOString().slice(11, 23)}] ${l}`).join('\n') + '\n').slice(-20_000);
  };
  child.stdout!.on('data', keep);
  child.stderr!.on('data', keep);
  return child;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
const json = async (path: string): Promise<any> => (await fetch(`${url}${path}`)).json();

// A page that threw fails the test it threw in.
afterEach(noPageErrors);
afterAll(async () => {
  await browser?.close();
  await stopCoordinator(coordinator);
  // Its local miners outlive it (for a restart to take them over): this test ends them.
  try {
    for (const { pid } of JSON.parse(readFileSync(join(dbDir, 'db', 'local-miners.json'), 'utf8')) as Array<{ pid: number }>) process.kill(pid, 'SIGTERM');
  } catch {
    // none recorded, or gone
  }
  rmSync(dbDir, { recursive: true, force: true });
});

/**
 * A newcomer's first five minutes: the coordinator started as the README says
 * (`npm start`: the default run, `small` on 3 stages, embedded database), the
 * page opened, Join pressed: one tab alone is training within two minutes,
 * because the coordinator fills the stages nobody holds with local headless
 * miners. Its boundaries use the default run's codec, and the page shows the
 * compression it achieves. The page fits a phone-sized screen.
 */
describe("a newcomer's first minutes", () => {
  it('npm start, open the page, press Join: the lone tab is training within two minutes', async () => {
    coordinator = startCoordinator(['npm', 'start', '--', '--port', String(PORT), '--data-dir', join(dbDir, 'db')]);
    await expect
      .poll(async () => fetch(`${url}/api/status`).then((r) => r.status, () => 0), { timeout: 180_000, interval: 1000 })
      .toBe(200)
      .catch((e: unknown) => {
        console.log(output);
        throw e;
      });
    firstUpAt = Date.now();
    const status = await (await fetch(`${url}/api/status`)).json();
    expect(status.run).toMatchObject({ preset: 'small', stages: 3, bottleneck: SMALL_BOUNDARY.bottleneck, codec: SMALL_BOUNDARY.codec });
    expect(status.localMiners.max).toBe(3);

    // A local run settles its emission epochs within minutes (LOCAL_INCENTIVES), not after an hour.
    expect(status.run.incentives.epochMs).toBeLessThanOrEqual(180_000);

    browser = await launchBrowser();
    tab = await browser.context.newPage();
    await tab.goto(url);
    const joinedAt = Date.now();
    await tab.getByTestId('join').click();
    // What the page says, read every 0.5 s over the first minute after Join (and on until it trains): each state it
    // shows must be true then.
    type Seen = { at: number; phase: string; text: string; microbatches: number; stage: string; help: string };
    const seen: Seen[] = [];
    let trainingAt: number | undefined;
    while (Date.now() - joinedAt < 120_000) {
      const v = await tabView(tab);
      const text = async (id: string): Promise<string> => ((await tab.getByTestId(id).count()) ? ((await tab.getByTestId(id).first().textContent()) ?? '') : '');
      seen.push({ at: Date.now() - joinedAt, phase: v.phase, text: await text('phase'), microbatches: v.microbatches, stage: v.stage, help: await text('waiting-help') });
      if (v.phase === 'training' && v.microbatches > 0) trainingAt ??= Date.now();
      if (trainingAt !== undefined && Date.now() - joinedAt >= 60_000) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    const states = seen.filter((x, i) => i === 0 || x.text !== seen[i - 1]!.text || x.help !== seen[i - 1]!.help);
    console.log(`e2e: the page after Join:\n${states.map((x) => `  +${(x.at / 1000).toFixed(1)} s: ${x.text} (${x.microbatches} microbatches, stage ${x.stage || '-'})${x.help ? `; ${x.help}` : ''}`).join('\n')}`);
    if (trainingAt === undefined) {
      console.log(JSON.stringify(await tabView(tab)), output.slice(-4000));
      await screenshot(tab, 'newcomer-failed.png');
    }
    expect(trainingAt, 'the tab trained a microbatch within two minutes of Join').toBeDefined();
    // Never "Training" with nothing trained, never "Stalled" before a first microbatch.
    expect(seen.filter((x) => x.microbatches === 0 && (/^Training/.test(x.text) || x.phase === 'idle'))).toEqual([]);
    // Never that the tab's own stage has nobody: the stages it says are empty exclude the one it holds.
    const emptyNamed = (help: string): number[] => [...(/nobody yet \(stages? ([^)]*)\)/.exec(help)?.[1] ?? '').matchAll(/\d+/g)].map((m) => Number(m[0]));
    expect(seen.filter((x) => x.help && /^\d+ of/.test(x.stage) && emptyNamed(x.help).includes(Number(x.stage.split(' ')[0])))).toEqual([]);
    const seconds = Math.round((trainingAt! - joinedAt) / 1000);
    const stages = (await (await fetch(`${url}/api/stages`)).json()).stages as Array<{ miners: unknown[] }>;
    const after = await (await fetch(`${url}/api/status`)).json();
    console.log(`e2e: a lone tab on a fresh coordinator is training ${seconds} s after Join; stages held by ${JSON.stringify(stages.map((s) => s.miners.length))}, ${after.localMiners.running} local miners`);
    expect(stages.every((s) => s.miners.length >= 1)).toBe(true);
    expect(after.localMiners.running).toBe(2);
    // What the tab's boundary traffic saved against fp32 at full width. Each transfer carries at most the
    // plain (undeflated) codec's frame, and an activation also the microbatch's target tokens (2 bytes each)
    // and a header: the floor counts every transfer as an activation.
    const { dModel, contextLength } = PRESETS.small;
    const rows = (status.run.training.batchSize as number) * contextLength;
    const plain = encodedBytes(rows, SMALL_BOUNDARY.bottleneck, SMALL_BOUNDARY.codec!.replace(/z$/, '') as Precision);
    const floor = (rows * dModel * 4) / (plain + 2 * rows + 512);
    await expect.poll(async () => Number((await tab.getByTestId('saved').getAttribute('data-ratio')) ?? 0), { timeout: 30_000 }).toBeGreaterThan(floor);
    console.log(`e2e: the tab's boundaries carry ${await tab.getByTestId('saved').textContent()} (at least ${floor.toFixed(0)}× expected)`);
    // Every byte the tab moved, by kind: its boundary frames (it holds a stage next to a local miner), the coordinator's
    // messages, and the training data it downloaded (stage 0 feeds from it; the last stage checks its targets with it).
    const kinds = await tab.getByTestId('traffic-kinds').locator('li').evaluateAll((items) => items.map((li) => li.getAttribute('data-kind')));
    expect(kinds).toEqual(expect.arrayContaining(['coordinator']));
    expect(kinds.filter((k) => k === 'activation' || k === 'gradient').length).toBeGreaterThan(0);
    console.log(`e2e: the tab's traffic by kind: ${(await tab.getByTestId('traffic').textContent())?.replace(/\s+/g, ' ')}`);
    await tab.setViewportSize({ width: 1280, height: 800 });
    await screenshot(tab, 'newcomer.png');
    // The page fits a phone-sized screen.
    await tab.setViewportSize({ width: 390, height: 844 });
    await expect.poll(() => tab.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);
    await screenshot(tab, 'newcomer-phone.png');
    await tab.setViewportSize({ width: 1280, height: 800 });
  });

  it('the coordinator stops: the page says it is unreachable; restarted, the tab trains again with no surplus local miner', async () => {
    const before = await tabView(tab);
    await stopCoordinator(coordinator);
    const stoppedAt = Date.now();
    console.log(`e2e: the stopped coordinator recorded its local miners as ${(() => { try { return readFileSync(join(dbDir, 'db', 'local-miners.json'), 'utf8'); } catch (e) { return (e as Error).message; } })()}`);
    // The page names the lost coordinator and when it tries again, in its heading too (what the tab is doing).
    await expect
      .poll(async () => ((await tab.getByTestId('coordinator').count()) ? await tab.getByTestId('coordinator').textContent() : ''), { timeout: 10_000, interval: 250 })
      .toMatch(/^Coordinator unreachable — retrying (now|in \d+ s)/);
    await expect
      .poll(async () => ((await tab.getByTestId('phase-outage').count()) ? await tab.getByTestId('phase-outage').textContent() : ''), { timeout: 10_000, interval: 250 })
      .toMatch(/^ — coordinator unreachable, retrying (now|in \d+ s)$/);
    console.log(
      `e2e: ${((Date.now() - stoppedAt) / 1000).toFixed(1)} s after the stop the page's heading says “${await tab.locator('h2', { has: tab.getByTestId('phase') }).textContent()}” and “${await tab.getByTestId('coordinator').textContent()}”`,
    );
    expect(await tab.getByTestId('nav-training').getAttribute('data-ok')).toBe('false');
    await tab.setViewportSize({ width: 1280, height: 800 });
    await screenshot(tab, 'train-unreachable.png');

    // Restarted as after Ctrl-C, with the same command: npm start (it builds the app again first), same port and database.
    coordinator = startCoordinator(['npm', 'start', '--', '--port', String(PORT), '--data-dir', join(dbDir, 'db')]);
    await expect.poll(async () => fetch(`${url}/api/status`).then((r) => r.status, () => 0), { timeout: 120_000, interval: 250 }).toBe(200);
    const answeredAt = Date.now();
    console.log(`e2e: the restarted coordinator answered ${((answeredAt - stoppedAt) / 1000).toFixed(1)} s after the stop`);
    const m0 = (await tabView(tab)).microbatches;
    // What the run does while it recovers, second by second (printed when it fails).
    const timeline: string[] = [];
    const watch = setInterval(() => {
      void Promise.all([tabView(tab), json('/api/dashboard').catch(() => undefined), tab.getByTestId('why').count().then((n) => (n ? tab.getByTestId('why').textContent() : ''))]).then(([v, d, why]) => {
        const stages = d?.swarm?.stages?.map((s: { miners: Array<{ state: string }> }) => s.miners.map((m) => m.state).join('+') || '-').join(' | ');
        timeline.push(`+${((Date.now() - answeredAt) / 1000).toFixed(1)} s: tab ${v.phase}/${v.microbatches} ${why ?? ''}; swarm ${stages}`);
      }, () => {});
    }, 1000);
    // Local miners started meanwhile, sampled while the run recovers: never more than the stages the tab leaves empty.
    let mostLocal = 0;
    const sampleLocal = setInterval(() => void json('/api/status').then((s) => (mostLocal = Math.max(mostLocal, s.localMiners.running)), () => {}), 250);
    try {
      await expect
        .poll(
          async () => {
            const v = await tabView(tab);
            return v.phase === 'training' && v.microbatches > m0 && (await tab.getByTestId('coordinator').count()) === 0;
          },
          // How soon is a figure, printed below (a loaded machine has taken 20 s and more): this bound only tells a tab
          // that never trains again from a slow one.
          { timeout: TRAINS_AGAIN_LOST_MS, interval: 250 },
        )
        .toBe(true)
        .catch(async (e: unknown) => {
          console.log(timeline.join('\n'), '\n', JSON.stringify(await tabView(tab)), await tab.locator('.log').innerText(), '\n', output.slice(-6000));
          await screenshot(tab, 'restart-failed.png');
          throw e;
        });
      console.log(`e2e: the tab trains again ${((Date.now() - answeredAt) / 1000).toFixed(1)} s after the restarted coordinator answered (${((Date.now() - stoppedAt) / 1000).toFixed(1)} s after the stop)`);
      // Every stage held by one miner, each of them training: no local miner sits idle beside another.
      await expect
        .poll(
          async () => {
            const swarm = (await json('/api/dashboard')).swarm as { stages: Array<{ miners: Array<{ state: string }> }> };
            return swarm.stages.map((s) => s.miners.map((m) => m.state).join('+')).join(' | ');
          },
          { timeout: 30_000, interval: 500 },
        )
        .toBe('training | training | training');
      console.log(`e2e: the swarm trains again ${((Date.now() - answeredAt) / 1000).toFixed(1)} s after the restart; local miners at most ${mostLocal}`);
    } finally {
      clearInterval(sampleLocal);
      clearInterval(watch);
    }
    console.log(timeline.join('\n'));
    expect(mostLocal).toBeLessThanOrEqual(2);
    // The two local miners the stopped coordinator left running were taken over (or, had they left, replaced):
    // the restarted coordinator counts them as its own.
    const running = (await json('/api/status')).localMiners.running;
    if (running !== 2) console.log(`e2e: the restarted coordinator counts ${running} local miners; its log:\n${output.slice(-8000)}`);
    expect(running).toBe(2);
  });

  it('the first epoch settles within minutes; the Dashboard marks this tab "you", shows the outage as a gap and the leaderboard; Rewards shows the balance', async () => {
    // Through the page's own links: the tab keeps its miner (and its identity) across pages.
    await tab.getByTestId('nav-dashboard').click();
    await expect.poll(() => tab.getByTestId('connection').getAttribute('data-state'), { timeout: 30_000 }).toBe('live');
    await expect.poll(() => tab.getByTestId('you').count(), { timeout: 30_000 }).toBe(1);
    expect(await tab.locator('[data-testid="miner"][data-you="true"]').getAttribute('data-state')).toBe('training');
    // The outage: no loss arrived while the coordinator was down, and the chart breaks its lines there.
    await expect.poll(async () => Number(await tab.getByTestId('loss-chart').getAttribute('data-gaps')), { timeout: 30_000 }).toBeGreaterThanOrEqual(1);
    // The first epoch settles within the run's first minutes, and the leaderboard lists its miners.
    await expect.poll(async () => (await json('/api/epochs')).epochs.length, { timeout: 360_000, interval: 2000 }).toBeGreaterThan(0);
    const settled = (await json('/api/epochs')).epochs as Array<{ epoch: number; settledAt: string }>;
    console.log(`e2e: epoch ${settled[settled.length - 1]!.epoch} settled ${((Date.parse(settled[settled.length - 1]!.settledAt) - firstUpAt) / 1000).toFixed(0)} s after the coordinator first answered`);
    await expect.poll(() => tab.getByTestId('leader').count(), { timeout: 60_000, interval: 1000 }).toBeGreaterThan(0);
    await tab.setViewportSize({ width: 1280, height: 800 });
    expect(await tab.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(1280);
    await screenshot(tab, 'dashboard-you.png');
    await tab.setViewportSize({ width: 390, height: 844 });
    await expect.poll(() => tab.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);
    await screenshot(tab, 'dashboard-you-phone.png');

    await tab.getByTestId('nav-rewards').click();
    await tab.setViewportSize({ width: 1280, height: 800 });
    // No wallet extension in this browser: the page says what to do, beside this tab's miner.
    await tab.getByTestId('connect-wallet').click();
    await expect.poll(() => tab.getByTestId('wallet-guidance').getAttribute('data-kind'), { timeout: 30_000 }).toBe('no-extension');
    await screenshot(tab, 'rewards.png');
    await tab.setViewportSize({ width: 390, height: 844 });
    await expect.poll(() => tab.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);
    await screenshot(tab, 'rewards-phone.png');
    await tab.getByTestId('nav-train').click();
    await screenshot(tab, 'train-phone.png');
    await tab.setViewportSize({ width: 1280, height: 800 });
    await screenshot(tab, 'train.png');
  });
});
