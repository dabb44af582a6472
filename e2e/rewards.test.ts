import type { KeyringPair } from '@polkadot/keyring/types';
import { verifyPayout } from '@train-at-home/incentives';
import type { Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../server/src/app';
import { checkDashboard } from './dashboard';
import { E2E_RUN, launchBrowser, noPageErrors, openTab, screenshot, startCoordinator, tabView } from './lib';
import { installTestWallet, newAccount } from './wallet';

/**
 * Short emission epochs, so that one settles within a minute of the link: an epoch waits for its window (itself and
 * the default holdEpochs, 2, after it), so the page's payout comes about 3 epochs after the link, and the last epoch
 * with work settles about 3 epochs after the tab leaves (with 30 s epochs those two waits were 3 of the file's 4 minutes).
 */
const EPOCH_MS = 15_000;
const SETTLE_AFTER_MS = 5_000;

let app: App;
let url: string;
let browser: Awaited<ReturnType<typeof launchBrowser>>;

beforeAll(async () => {
  ({ app, url } = await startCoordinator({
    name: 'e2e-rewards',
    ...E2E_RUN,
    incentives: { epochMs: EPOCH_MS, settleAfterMs: SETTLE_AFTER_MS, emissionPerEpoch: '1000000000' },
  }));
  browser = await launchBrowser();
});
// A page that threw fails the test it threw in.
afterEach(noPageErrors);
afterAll(async () => {
  await browser?.close();
  await app?.close();
});

const api = async <T>(path: string): Promise<T> => (await app.fastify.inject({ method: 'GET', url: path })).json() as T;
const units = async (page: Page, id: string): Promise<string> => (await page.getByTestId(id).first().getAttribute('data-base-units')) ?? '';

interface RewardsBody {
  miners: string[];
  totals: { settled: string; claimed: string; claimable: string };
  epochs: Array<{ runId: number; epoch: number; settled: string; claimable: string; root: string; proof: string[] }>;
}

describe('the Rewards page in Chromium', () => {
  it('opens from a deep link and tells a visitor with no wallet extension, a refused one, or one with no account what to do', async () => {
    // The coordinator serves the app for its pages' addresses, and still 404s the rest.
    for (const path of ['/rewards', '/dashboard', '/rewards?x=1']) {
      const res = await app.fastify.inject({ method: 'GET', url: path });
      expect([path, res.statusCode, res.headers['content-type']]).toEqual([path, 200, 'text/html; charset=utf-8']);
    }
    for (const path of ['/api/nothing', '/assets/missing.js', '/data/nothing', '/socket.io/nothing']) {
      expect([path, (await app.fastify.inject({ method: 'GET', url: path })).statusCode]).toEqual([path, 404]);
    }

    const page = await browser.context.newPage();
    await page.goto(`${url}/rewards`);
    await page.getByTestId('connect-wallet').click();
    const guidance = page.getByTestId('wallet-guidance');
    await expect.poll(() => guidance.getAttribute('data-kind'), { timeout: 20_000 }).toBe('no-extension');
    expect(await guidance.textContent()).toMatch(/No wallet extension found in this browser\. Install one .* then reload this page and press Connect/);
    // Without a running tab there is nothing to link yet, and the page says where to start.
    expect(await page.getByTestId('link-needs-join').textContent()).toMatch(/Go to Train and press Join/);
    await screenshot(page, 'rewards-no-extension.png');
    // The navigation is real: Dashboard and Train are addresses of their own.
    await page.getByTestId('nav-dashboard').click();
    await expect.poll(() => new URL(page.url()).pathname).toBe('/dashboard');
    await expect.poll(() => page.getByTestId('connection').isVisible(), { timeout: 20_000 }).toBe(true);
    await page.getByTestId('nav-train').click();
    await expect.poll(() => new URL(page.url()).pathname).toBe('/');
    // The address changes before the router renders the page: wait for the page, as a person would.
    await expect.poll(() => page.getByTestId('join').isVisible(), { timeout: 20_000 }).toBe(true);
    await page.close();

    const account = await newAccount('Refused');
    const refused = await browser.context.newPage();
    await installTestWallet(refused, { accounts: [account], access: 'refuse' });
    await refused.goto(`${url}/rewards`);
    await refused.getByTestId('connect-wallet').click();
    await expect.poll(() => refused.getByTestId('wallet-guidance').getAttribute('data-kind'), { timeout: 20_000 }).toBe('refused');
    expect(await refused.getByTestId('wallet-guidance').textContent()).toMatch(/did not let this page in\. Open the extension and allow “Train at Home”/);
    await refused.close();

    const empty = await browser.context.newPage();
    await installTestWallet(empty, { accounts: [] });
    await empty.goto(`${url}/rewards`);
    await empty.getByTestId('connect-wallet').click();
    await expect.poll(() => empty.getByTestId('wallet-guidance').getAttribute('data-kind'), { timeout: 20_000 }).toBe('no-accounts');
    expect(await empty.getByTestId('wallet-guidance').textContent()).toMatch(/shares no account this page can pay\. Create or import an account/);
    await empty.close();
  });

  it('links a training tab to a wallet account, shows the settled epoch with a verified proof, claims it, and the balance drops to zero', async () => {
    const account: KeyringPair = await newAccount('E2E wallet');
    const tab = await browser.context.newPage();
    const wallet = await installTestWallet(tab, { accounts: [account] });
    await tab.goto(url);
    await tab.getByTestId('join').click();
    const partner = await openTab(browser.context, url); // the other stage
    await expect.poll(async () => (await app.coordinator.stageMap()).map((s: { miners: unknown[] }) => s.miners.length), { timeout: 120_000, interval: 1000 }).toEqual([1, 1]);
    await expect.poll(async () => (await tabView(tab)).stage, { timeout: 30_000 }).toMatch(/^[12] of 2$/);

    // To Rewards without reloading: the tab keeps training on every page.
    await tab.getByTestId('nav-rewards').click();
    await expect.poll(() => new URL(tab.url()).pathname).toBe('/rewards');
    expect(await tab.getByTestId('nav-training').count()).toBe(1);
    await tab.getByTestId('connect-wallet').click();
    await expect.poll(() => tab.getByTestId('account-address').textContent(), { timeout: 20_000 }).toBe(account.address);

    // The link: the wallet and the tab's miner both sign the coordinator's message.
    await tab.getByTestId('link-miner').click();
    await expect.poll(() => tab.getByTestId('link-status').getAttribute('data-linked'), { timeout: 30_000 }).toBe('true');
    expect(wallet.signed).toHaveLength(1);
    expect(wallet.signed[0]).toMatch(new RegExp(`^Train at Home: link a payout address\\n.*\\nminer: 0x[0-9a-f]{64}\\naddress: ${account.address}\\n`, 's'));
    const linked = await api<RewardsBody>(`/api/rewards/${account.address}`);
    expect(linked.miners).toHaveLength(1);
    const minerId = linked.miners[0]!;
    console.log(`e2e: linked miner ${minerId.slice(0, 10)}… to ${account.address}`);

    // Training goes on until an epoch settled after the link pays the account (its page polls).
    const started = Date.now();
    await expect
      .poll(async () => BigInt((await units(tab, 'claimable')) || '0'), { timeout: 4 * 60_000, interval: 2000 })
      .toBeGreaterThan(0n);
    console.log(`e2e: first payout to the wallet ${Math.round((Date.now() - started) / 1000)} s after the link`);
    // The page says which epoch settles next, and that earnings wait for the audits of the epochs after it.
    const hold = app.coordinator.run.incentives.holdEpochs;
    expect(hold).toBeGreaterThan(0);
    const next = tab.getByTestId('next-settlement');
    await expect
      .poll(async () => Number(await next.getAttribute('data-epoch')) === (await api<{ nextSettlement: { epoch: number } }>('/api/epochs')).nextSettlement.epoch, { timeout: 20_000, interval: 1000 })
      .toBe(true);
    expect(await next.textContent()).toContain(`wait for the audits of the ${hold} epochs after it`);

    // Meanwhile a viewer with no wallet and no miner watches the same run on the Dashboard (one swarm for both pages' tests).
    await checkDashboard(browser.context, url, 2);

    // Stop the work (the tab leaves on its Train page, the partner closes), then let every epoch with work settle,
    // so that nothing lands on the balance between the claim and the check that it is zero.
    await tab.getByTestId('nav-train').click();
    await tab.getByTestId('leave').click();
    await partner.close();
    const { current } = await api<{ current: { epoch: number } }>('/api/epochs');
    await expect
      .poll(async () => (await api<{ epochs: Array<{ epoch: number }> }>('/api/epochs')).epochs.some((e) => e.epoch >= current.epoch), {
        // Each epoch waits for its window: itself and the holdEpochs after it (run-config.ts).
        timeout: (1 + app.coordinator.run.incentives.holdEpochs) * EPOCH_MS + SETTLE_AFTER_MS + 60_000,
        interval: 2000,
      })
      .toBe(true);
    const before = await api<RewardsBody>(`/api/rewards/${account.address}`);
    const claimable = BigInt(before.totals.claimable);
    expect(claimable).toBeGreaterThan(0n);
    expect(before.totals.claimed).toBe('0');
    // The server's proofs are right (the page checks them too, below).
    for (const e of before.epochs) expect(verifyPayout(e.root, account.address, e.settled, e.proof)).toBe(true);

    await tab.getByTestId('nav-rewards').click();
    await expect.poll(() => units(tab, 'claimable'), { timeout: 30_000, interval: 1000 }).toBe(claimable.toString());
    // The tab left, but its miner (same seed, same key) stays linked, and the page says so.
    expect(await tab.getByTestId('link-status').getAttribute('data-linked')).toBe('true');
    const rows = tab.getByTestId('epoch-row');
    expect(await rows.count()).toBe(before.epochs.length);
    const proofs = tab.getByTestId('proof');
    for (let i = 0; i < (await proofs.count()); i++) expect(await proofs.nth(i).getAttribute('data-verified')).toBe('true');

    await tab.getByTestId('claim').click();
    await expect.poll(() => tab.getByTestId('receipt').count(), { timeout: 30_000 }).toBe(1);
    expect(await units(tab, 'receipt-amount')).toBe(claimable.toString());
    await expect.poll(() => units(tab, 'claimable'), { timeout: 10_000 }).toBe('0');
    expect(await units(tab, 'claimed')).toBe(before.totals.settled);
    expect(await tab.getByTestId('claim').isDisabled()).toBe(true);
    expect(wallet.signed).toHaveLength(2);
    expect(wallet.signed[1]).toMatch(new RegExp(`^Train at Home: claim rewards\\n.*\\naddress: ${account.address}\\namount: ${claimable}\\n`, 's'));

    // The ledger agrees: claimed once, nothing left.
    const after = await api<RewardsBody>(`/api/rewards/${account.address}`);
    expect(after.totals).toEqual({ settled: before.totals.settled, claimed: before.totals.settled, claimable: '0' });
    const { claims } = await api<{ claims: Array<{ amount: string }> }>(`/api/rewards/${account.address}/claims`);
    expect(claims.map((c) => c.amount)).toEqual([claimable.toString()]);

    console.log(`e2e: claimed ${claimable} base units over ${before.epochs.length} epoch(s); receipt ${await tab.getByTestId('receipt-id').textContent()}`);
    await screenshot(tab, 'rewards.png');
    // On a phone-sized screen the page fits its width (the epochs table scrolls inside its card).
    await tab.setViewportSize({ width: 390, height: 844 });
    await expect.poll(() => tab.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);
    await screenshot(tab, 'rewards-phone.png');
  });
});
