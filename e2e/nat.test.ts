/**
 * A browser tab behind a home NAT: the NAT lab (scripts/nat-lab.sh: a public namespace with the
 * coordinator and Debian's coturn, two homes each behind its own nftables NAT), made inside the browser
 * tests' namespace. Chromium runs in home 1 with its own ICE agent, told the operator's STUN and TURN
 * servers (and TURN credentials of its own) with its registration; a Node miner runs in home 2.
 *   - Both NATs symmetric: the pair trains through coturn's relay, past a merge; the tab's page says
 *     the peer is reached through TURN, its heartbeats tell the dashboard, and the coordinator carries
 *     no frame.
 *   - Then UDP blocked at home 1, TURN taken out of the run's settings and the relay off: a new tab that
 *     no path reaches says so by name, with what its user can do.
 */
import { fileURLToPath } from 'node:url';
import { prepareData, DATA_DIR } from '@train-at-home/model/node';
import type { Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { ask } from '@train-at-home/testkit/netns';
import { startNatLab, type NatLab } from '@train-at-home/testkit/nat-lab';
import { MinerSwarm } from '@train-at-home/testkit/swarm';
import { launchBrowser, noPageErrors, openTab, screenshot, tabView } from './lib';

const P = `te${process.pid % 100000}`;
const WEB_ROOT = fileURLToPath(new URL('../dist/web', import.meta.url));
let lab: NatLab;
let swarm: MinerSwarm | undefined;
const browsers: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  prepareData({ outDir: DATA_DIR, vocabSize: 320 });
  lab = await startNatLab(P, {}, { webRoot: WEB_ROOT });
}, 180_000);

// A page that threw fails the test it threw in.
afterEach(noPageErrors);
afterAll(async () => {
  swarm?.stop();
  for (const b of browsers) await b.close();
  lab?.close();
});

const relayedFrameBytes = async (): Promise<number> => (await ask<{ frameBytes: number }>(lab.coordinator, 'relayed')).frameBytes;
/** The tab's miner id (its public key, as the page shows it in the miner's title). */
const tabMinerId = async (tab: Page): Promise<string> => ((await tab.getByTestId('miner-id').getAttribute('title')) ?? '').replace(/^0x/i, '').toLowerCase();

describe('a tab behind a home NAT', () => {
  it('symmetric NATs at both homes: the tab trains with a Node miner in the other home through TURN, past a merge; its page and the dashboard say so; no frame through the coordinator', async () => {
    lab.nat(1, 'symmetric');
    lab.nat(2, 'symmetric');
    const before = await relayedFrameBytes();
    const browser = await launchBrowser([], `${P}-home1`);
    browsers.push(browser);
    // The first miner takes stage 1 (both empty: the lowest); the Node miner then holds stage 2.
    const tab = await openTab(browser.context, lab.url);
    await expect.poll(async () => (await tabView(tab)).stage, { timeout: 120_000, interval: 1000 }).toBe('1 of 2');
    const tabId = await tabMinerId(tab);
    swarm = new MinerSwarm();
    const [node] = await swarm.start(lab.url, [1], [`${P}-home2`]);
    expect(node!.stage).toBe(1);

    await expect.poll(async () => (await tabView(tab)).microbatches, { timeout: 240_000, interval: 2000 }).toBeGreaterThan(3);
    await expect.poll(async () => Number((await tab.getByTestId('merges').textContent()) ?? 0), { timeout: 180_000, interval: 2000 }).toBeGreaterThan(0);
    const atMerge = (await tabView(tab)).microbatches;
    await expect.poll(async () => (await tabView(tab)).microbatches, { timeout: 120_000, interval: 2000 }).toBeGreaterThan(atMerge + 2);

    // The page lists the Node miner as reached through TURN, with bytes both ways.
    const path = tab.locator(`[data-testid="path"][data-peer="${node!.minerId}"]`);
    await expect.poll(() => path.getAttribute('data-path'), { timeout: 20_000 }).toBe('turn');
    const text = (await path.textContent()) ?? '';
    console.log(`e2e nat: the tab shows ${text}`);
    expect(text).toMatch(/TURN( \((udp|tcp|tls)\))? · [\d.]+ \S*B sent, [\d.]+ \S*B received/);
    expect(text).not.toMatch(/· 0 B sent|, 0 B received/);
    // The Node miner's mesh agrees: the tab is reached through TURN.
    const stats = await swarm.stats();
    expect(new Map(stats[0]!.paths).get(tabId)).toMatchObject({ path: 'turn' });
    // The dashboard (read from the tab, in home 1) shows what each miner's heartbeats said.
    const dashboard = (await tab.evaluate("fetch('/api/dashboard').then((r) => r.json())")) as { swarm: { stages: Array<{ miners: Array<{ id: string; paths?: Record<string, { peers: number; bytes: number }> }> }> } };
    const reported = new Map(dashboard.swarm.stages.flatMap((s) => s.miners.map((m) => [m.id.replace(/^0x/i, '').toLowerCase(), m.paths])));
    for (const id of [tabId, node!.minerId]) {
      expect(reported.get(id)?.turn?.peers, `${id.slice(0, 8)}: ${JSON.stringify(reported.get(id))}`).toBe(1);
      expect(reported.get(id)?.turn?.bytes).toBeGreaterThan(0);
      expect(reported.get(id)?.coordinator).toBeUndefined();
    }
    expect(await relayedFrameBytes()).toBe(before);
    await screenshot(tab, 'nat-tab-turn.png');
    await browser.close();
    browsers.pop();
  }, 600_000);

  it('no path at all (UDP blocked at home, no TURN, no relay): a new tab says it cannot reach its peer, and what its user can do', async () => {
    lab.nat(1, 'udp-blocked');
    // New registrations get no TURN server, and the coordinator carries no frame.
    await ask(lab.coordinator, 'network', { turn: [], relay: { enabled: false, bytesPerMinute: 1024 * 1024 } });
    // The first tab left (its stage was refilled by the Node miner): the run starts afresh, this tab first, on stage 1,
    // so it is the one that sends, its activations to a new Node miner in home 2.
    swarm?.stop();
    await expect.poll(async () => (await ask<number[]>(lab.coordinator, 'miners')).length, { timeout: 60_000, interval: 1000 }).toBe(0);
    const browser = await launchBrowser([], `${P}-home1`);
    browsers.push(browser);
    const tab = await openTab(browser.context, lab.url);
    await expect.poll(async () => (await tabView(tab)).stage, { timeout: 120_000, interval: 1000 }).toBe('1 of 2');
    swarm = new MinerSwarm();
    expect((await swarm.start(lab.url, [1], [`${P}-home2`]))[0]!.stage).toBe(1);
    const why = tab.getByTestId('why');
    const shown = async (): Promise<string> =>
      JSON.stringify({ view: await tabView(tab), phase: await tab.getByTestId('phase').textContent(), paths: await tab.getByTestId('paths').textContent(), log: (await tab.locator('.log').textContent().catch(() => ''))?.slice(-600) });
    const timer = setInterval(() => void shown().then((s) => console.log(`e2e nat: ${s}`), () => {}), 15_000);
    onTestFinished(() => clearInterval(timer));
    await expect.poll(async () => ((await why.count()) ? await why.textContent() : ''), { timeout: 180_000, interval: 2000 }).toMatch(/cannot reach a peer: no direct or TURN path got through/);
    expect(await why.textContent()).toMatch(/Try another network \(a phone hotspot\) or ask the run's operator for TURN/);
    expect((await tabView(tab)).microbatches).toBe(0);
    await screenshot(tab, 'nat-tab-no-path.png');
  }, 400_000);
});
