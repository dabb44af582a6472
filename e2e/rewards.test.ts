import type { KeyringPair } from '@polkadot/keyring/types';
import { readFileSync } from 'node:fs';
import { verifyPayout } from '@train-at-home/incentives';
import type { Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../server/src/app';
import { checkDashboard } from './dashboard';
import { launchBrowser, noPageErrors, openTab, screenshot, startCoordinator, tabView } from './lib';
import { accountFromSeed, installTestWallet, newAccount } from './wallet';

/**
 * Short emission epochs, so that one settles within a minute of the link: an epoch waits for its window (itself and
 * the default holdEpochs, 2, after it), so the page's payout comes about 3 epochs after the link, and the last epoch
 * with work settles about 3 epochs after the tab leaves (with 30 s epochs those two waits were 3 of the file's 4 minutes).
 */
const EPOCH_MS = 10_000;
const SETTLE_AFTER_MS = 5_000;

let app: App;
let url: string;
let browser: Awaited<ReturnType<typeof launchBrowser>>;

beforeAll(async () => {
  // Nothing here asks the run to learn (e2e/train.test.ts does): small microbatches (batch 8, a 32-wide bottleneck),
  // so rounds of 10 close, are drawn and replayed in seconds and an epoch's settlement waits on its clock, not on
  // them (with the learning run's batches of 32 at full width, a round took the two tabs about 20 s).
  ({ app, url } = await startCoordinator({
    name: 'e2e-rewards',
    preset: 'tiny',
    stages: 2,
    bottleneck: 32,
    training: { batchSize: 8 },
    merge: { every: 10 },
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

    // Before a wallet is connected: the page shows the tab's own key as the account it makes (the address the tab's
    // miner registered with), says nothing can be linked until a wallet is, and warns that the key lives only here.
    const keyCard = tab.getByTestId('tab-key');
    await expect.poll(() => keyCard.getAttribute('data-address'), { timeout: 20_000 }).toMatch(/^5\w{47}$/);
    const keyAddress = (await keyCard.getAttribute('data-address'))!;
    expect(await app.db.query('SELECT count(*)::int AS n FROM miners WHERE address = $1', [keyAddress])).toEqual([{ n: 1 }]);
    expect(await tab.getByTestId('link-needs-wallet').textContent()).toMatch(/^Connect a wallet above to link it\. Until then, save the key below/);
    expect(await tab.getByTestId('tab-key-warning').textContent()).toMatch(/^The key lives only in this tab: closing the tab or clearing the browser's data loses it/);
    await screenshot(tab, 'rewards-tab-key.png');
    // Saved to a file: a raw sr25519 seed that makes exactly that account in a wallet (as polkadot{.js} imports it).
    const [download] = await Promise.all([tab.waitForEvent('download'), tab.getByTestId('save-key').click()]);
    const keyFile = readFileSync((await download.path())!, 'utf8');
    const key = /^key \(sr25519 raw seed\): (0x[0-9a-f]{64})$/m.exec(keyFile)?.[1];
    expect(key, keyFile).toBeDefined();
    const keyPair = await accountFromSeed(key!, 'This tab');
    expect(keyPair.address).toBe(keyAddress);
    expect(keyFile).toContain(`account (SS58 address): ${keyAddress}`);
    expect(await tab.getByTestId('tab-key-warning').count()).toBe(0);
    // Unlinked, the tab's settled epochs pay its own key.
    await expect
      .poll(async () => BigInt((await tab.getByTestId('tab-key-claimable').getAttribute('data-base-units')) || '0'), { timeout: 4 * 60_000, interval: 2000 })
      .toBeGreaterThan(0n);
    console.log(`e2e: settled to the tab's own key before any link: ${(await api<RewardsBody>(`/api/rewards/${keyAddress}`)).totals.claimable} base units`);

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

    // What the tab's own key was paid before the link is still its own: the key imported into the wallet (as a person
    // imports the saved raw seed into their extension) is an account of its own, which this page claims like any other.
    wallet.importAccount(keyPair);
    await tab.reload();
    // Reloaded, the page reads the key from the tab's storage and derives its account itself (the tab has not joined).
    await expect.poll(() => tab.getByTestId('tab-key').getAttribute('data-address'), { timeout: 20_000 }).toBe(keyAddress);
    await expect.poll(() => tab.getByTestId('account-select').count(), { timeout: 20_000 }).toBe(1);
    await tab.getByTestId('account-select').selectOption(keyAddress);
    const held = await api<RewardsBody>(`/api/rewards/${keyAddress}`);
    expect(BigInt(held.totals.claimable)).toBeGreaterThan(0n);
    expect(held.miners).toEqual([]); // nothing links to the key: it is the miner's own address
    await expect.poll(() => units(tab, 'claimable'), { timeout: 30_000, interval: 1000 }).toBe(held.totals.claimable);
    await expect.poll(() => units(tab, 'tab-key-claimable'), { timeout: 30_000, interval: 1000 }).toBe(held.totals.claimable);
    for (let i = 0; i < (await proofs.count()); i++) expect(await proofs.nth(i).getAttribute('data-verified')).toBe('true');
    await tab.getByTestId('claim').click();
    await expect.poll(() => tab.getByTestId('receipt').count(), { timeout: 30_000 }).toBe(1);
    expect(await units(tab, 'receipt-amount')).toBe(held.totals.claimable);
    expect(wallet.signed).toHaveLength(3);
    expect(wallet.signed[2]).toMatch(new RegExp(`^Train at Home: claim rewards\\n.*\\naddress: ${keyAddress}\\namount: ${held.totals.claimable}\\n`, 's'));
    await expect.poll(() => units(tab, 'tab-key-claimable'), { timeout: 30_000, interval: 1000 }).toBe('0');
    expect((await api<RewardsBody>(`/api/rewards/${keyAddress}`)).totals).toEqual({ settled: held.totals.settled, claimed: held.totals.settled, claimable: '0' });
    // The first claim's account is untouched by the second.
    expect((await api<RewardsBody>(`/api/rewards/${account.address}`)).totals).toEqual(after.totals);

    // In a new tab, the saved key makes it train as the same miner: a paste that holds no key is refused by name and
    // changes nothing; the key file's text is taken as it is.
    const other = await browser.context.newPage();
    await other.goto(`${url}/rewards`);
    await expect.poll(() => other.getByTestId('tab-key-none').count(), { timeout: 20_000 }).toBe(1);
    await other.getByTestId('restore-key').locator('summary').click();
    await other.getByTestId('restore-key-input').fill(`0x${'ab'.repeat(31)}`);
    await other.getByTestId('restore-key-button').click();
    expect(await other.getByTestId('restore-key-error').textContent()).toMatch(/^no key found: a key is 0x followed by 64 hexadecimal digits$/);
    expect(await other.evaluate(() => sessionStorage.getItem('tah-seed'))).toBeNull();
    await other.getByTestId('restore-key-input').fill(keyFile);
    await Promise.all([other.waitForEvent('load'), other.getByTestId('restore-key-button').click()]);
    await expect.poll(() => other.getByTestId('tab-key').getAttribute('data-address'), { timeout: 20_000 }).toBe(keyAddress);
    await other.close();
    // The page as its holder leaves it: the key's account chosen, claimed, its key card below.
    await tab.reload();
    await expect.poll(() => units(tab, 'claimable'), { timeout: 30_000, interval: 1000 }).toBe('0');
    await expect.poll(() => tab.getByTestId('tab-key').getAttribute('data-address'), { timeout: 20_000 }).toBe(keyAddress);
    await screenshot(tab, 'rewards.png');
    // On a phone-sized screen the page fits its width (the epochs table scrolls inside its card).
    await tab.setViewportSize({ width: 390, height: 844 });
    await expect.poll(() => tab.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);
    await screenshot(tab, 'rewards-phone.png');
  });
});
