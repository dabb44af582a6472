import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { PRESETS, encodedBytes, type Precision } from '@train-at-home/model';
import { SMALL_BOUNDARY } from '../server/src/run-config';
import { HOST, launchBrowser, screenshot, tabView } from './lib';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const PORT = 18_000 + Math.floor(Math.random() * 2000);
const dbDir = mkdtempSync(join(tmpdir(), 'tah-newcomer-'));
let coordinator: ChildProcess | undefined;
let output = '';
let browser: Awaited<ReturnType<typeof launchBrowser>> | undefined;

afterAll(async () => {
  await browser?.close();
  if (coordinator?.pid) {
    const exited = new Promise((r) => coordinator!.once('exit', r));
    process.kill(-coordinator.pid, 'SIGTERM'); // npm, the coordinator, its validator and local miners
    await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
    try {
      process.kill(-coordinator.pid, 'SIGKILL');
    } catch {
      // already gone
    }
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
    coordinator = spawn('npm', ['start', '--', '--port', String(PORT), '--data-dir', join(dbDir, 'db')], { cwd: ROOT, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    coordinator.stdout!.on('data', (c: Buffer) => (output = (output + c.toString()).slice(-20_000)));
    coordinator.stderr!.on('data', (c: Buffer) => (output = (output + c.toString()).slice(-20_000)));
    const url = `http://${HOST}:${PORT}`;
    await expect
      .poll(async () => fetch(`${url}/api/status`).then((r) => r.status, () => 0), { timeout: 180_000, interval: 1000 })
      .toBe(200)
      .catch((e: unknown) => {
        console.log(output);
        throw e;
      });
    const status = await (await fetch(`${url}/api/status`)).json();
    expect(status.run).toMatchObject({ preset: 'small', stages: 3, bottleneck: SMALL_BOUNDARY.bottleneck, codec: SMALL_BOUNDARY.codec });
    expect(status.localMiners.max).toBe(3);

    browser = await launchBrowser();
    const tab = await browser.context.newPage();
    tab.on('pageerror', (e) => console.log(`[newcomer tab] page error: ${e.message}`));
    await tab.goto(url);
    const joinedAt = Date.now();
    await tab.getByTestId('join').click();
    await expect
      .poll(async () => {
        const v = await tabView(tab);
        return v.phase === 'training' && v.microbatches > 0;
      }, { timeout: 120_000, interval: 1000 })
      .toBe(true)
      .catch(async (e: unknown) => {
        console.log(JSON.stringify(await tabView(tab)), output.slice(-4000));
        await screenshot(tab, 'newcomer-failed.png');
        throw e;
      });
    const seconds = Math.round((Date.now() - joinedAt) / 1000);
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
    await screenshot(tab, 'newcomer.png');
    // The page fits a phone-sized screen.
    await tab.setViewportSize({ width: 390, height: 844 });
    await expect.poll(() => tab.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);
    await screenshot(tab, 'newcomer-phone.png');
  });
});
