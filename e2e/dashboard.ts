import type { BrowserContext } from 'playwright-core';
import { expect } from 'vitest';
import { screenshot } from './lib';

/**
 * The Dashboard of a run that is training now, as a read-only viewer sees it
 * (no wallet, no miner): the loss chart gains points live, the stage map shows
 * the miners with their states, the leaderboard lists them (an epoch must have
 * settled), a sample of generated text appears; nothing shown is NaN or
 * negative; the layout fits a phone. Screenshots: dashboard.png, dashboard-phone.png.
 * Called during the Rewards test's run (one swarm for both pages).
 */
export async function checkDashboard(context: BrowserContext, url: string, miners: number): Promise<void> {
  const page = await context.newPage();
  await page.goto(`${url}/dashboard`);
  await expect.poll(() => page.getByTestId('connection').getAttribute('data-state'), { timeout: 30_000 }).toBe('live');
  const chart = page.getByTestId('loss-chart');
  const points = async (): Promise<number> => Number((await chart.getAttribute('data-train-points')) ?? 0);
  await expect.poll(points, { timeout: 60_000 }).toBeGreaterThan(0);
  const first = await points();
  // Live: the chart gains points without a reload.
  await expect.poll(points, { timeout: 60_000, interval: 1000 }).toBeGreaterThan(first);
  // With the pointer off the chart, the legend shows each line's latest value (uPlot's own is "--" until hovered).
  const legend = await chart.locator('.u-legend .u-value').allTextContents();
  expect(legend[0], JSON.stringify(legend)).toBe('latest');
  expect(legend.slice(1, 3).every((v) => /^\d+\.\d{3}$/.test(v)), JSON.stringify(legend)).toBe(true);
  expect(legend).not.toContain('--');
  // The stage map: every miner, with its state (one stage each here).
  await expect.poll(() => page.getByTestId('miner').count(), { timeout: 30_000 }).toBe(miners);
  await expect.poll(async () => (await page.getByTestId('miner').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-state')))).some((s) => s === 'training'), { timeout: 30_000 }).toBe(true);
  // Each stage with miners says what they moved per token they trained, by kind: their activations or gradients at least.
  await expect.poll(() => page.getByTestId('stage-traffic').count(), { timeout: 30_000 }).toBeGreaterThan(0);
  const moved = (await page.getByTestId('stage-traffic').allTextContents()).join(' | ');
  expect(moved).toMatch(/B\/token in all: .*(activations|gradients) [0-9.]+ (B|KiB|MiB|GiB) sent/);
  console.log(`e2e: dashboard stage traffic: ${moved}`);
  // The leaderboard of the settled epoch lists them.
  await expect.poll(() => page.getByTestId('leader').count(), { timeout: 90_000, interval: 2000 }).toBe(miners);
  // What the model writes now, after a merged round.
  await expect.poll(() => page.getByTestId('sample').count(), { timeout: 120_000, interval: 2000 }).toBe(1);
  expect((await page.getByTestId('sample').textContent())?.length).toBeGreaterThan(10);
  // Nothing shown is NaN, infinite or negative.
  const text = (await page.locator('main').textContent()) ?? '';
  expect(text).not.toMatch(/NaN|Infinity|(^|\s)-\d/);
  const series = await page.evaluate<Array<{ value: number }>>('window.trainAtHomeDashboard.series.train_loss.points');
  expect(series.every((p) => Number.isFinite(p.value) && p.value >= 0)).toBe(true);
  console.log(`e2e: dashboard shows ${await points()} train losses, ${await chart.getAttribute('data-heldout-points')} held-out, ${miners} miners on the leaderboard, sample “${((await page.getByTestId('sample').textContent()) ?? '').slice(0, 80)}…”`);
  await screenshot(page, 'dashboard.png');
  await page.setViewportSize({ width: 390, height: 844 });
  await expect.poll(() => page.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);
  await screenshot(page, 'dashboard-phone.png');
  await page.close();
}
