import type { ChildProcess } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DATA_DIR, prepareData } from '@train-at-home/model/node';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { expect } from 'vitest';
import { buildApp, type App, type AppOptions } from '../server/src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { freePort } from '@train-at-home/testkit/ports';

/** The namespace address scripts/test-e2e.sh gives the coordinator (and the browsers' side of the veth). */
export const HOST = process.env.E2E_HOST ?? '';
export const ARTIFACTS = fileURLToPath(new URL('./artifacts', import.meta.url));
const WEB_ROOT = fileURLToPath(new URL('../dist/web', import.meta.url));

if (!HOST) throw new Error('e2e tests run inside their network namespace: use `bash scripts/test-e2e.sh` (or `npm test`)');

/**
 * The browser tests' run: `tiny` on 2 stages with boundaries at full width (b = d = 128), int8: the
 * local trainer's CI configuration, which passes the bigram baseline in ~200 steps. A 32-wide
 * bottleneck costs ~0.2 nats there (3.40 after 200 steps, the swarm matching it step for step), too
 * slow for CI.
 */
export const E2E_RUN = {
  preset: 'tiny',
  stages: 2,
  bottleneck: 128,
  training: { batchSize: 32, peakLr: 0.006, warmupSteps: 20, totalSteps: 200 },
  merge: { every: 10 },
} as const satisfies AppOptions['run'];


/**
 * A coordinator serving the built web app and the training data, on the namespace's address. Its
 * rewards domain is that address, the site the tabs open: the shared rewards client signs only
 * messages that name the coordinator it talks to.
 */
export async function startCoordinator(run: AppOptions['run']): Promise<{ app: App; url: string }> {
  prepareData({ outDir: DATA_DIR, vocabSize: 320 });
  const port = await freePort(HOST);
  const app = await buildApp({ database: await testDatabase(), run, webRoot: WEB_ROOT, dataRoot: DATA_DIR, rewards: { domain: `${HOST}:${port}` } });
  await app.fastify.listen({ port, host: HOST });
  return { app, url: `http://${HOST}:${port}` };
}

/**
 * Stops a coordinator started in a process group of its own (its command line, or `npm start`) as Ctrl-C in its
 * terminal would: npm, the coordinator and its validator (not its local miners, which run in groups of their own);
 * killed if still there after 10 s.
 */
export async function stopCoordinator(child: ChildProcess | undefined): Promise<void> {
  if (!child?.pid || child.exitCode !== null) return;
  process.kill(-child.pid, 'SIGTERM');
  // As after Ctrl-C on a terminal: every process of the group (npm exits before the coordinator it started
  // has closed) is given the time to finish, and only what still runs after 10 s is killed.
  const groupGone = (): boolean => {
    try {
      process.kill(-child.pid!, 0);
      return false;
    } catch {
      return true;
    }
  };
  for (const until = Date.now() + 10_000; !groupGone() && Date.now() < until; ) await new Promise((r) => setTimeout(r, 100));
  try {
    process.kill(-child.pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

/** Uncaught errors thrown in any page of a browser launched here, with the page's address, since the last check. */
const pageErrors: string[] = [];

/**
 * Fails on every uncaught error a page threw since the last call (each e2e file runs it after each test): a tab
 * whose script threw has broken somewhere its assertions may not look. None is expected in any test here.
 */
export function noPageErrors(): void {
  expect(pageErrors.splice(0), "uncaught errors in the browsers' pages").toEqual([]);
}

function watchPage(page: Page): void {
  page.on('pageerror', (e) => {
    console.log(`[${page.url()}] page error: ${e.message}`);
    pageErrors.push(`${page.url()}: ${e.message}`);
  });
}

const FLAGS = ['--no-sandbox', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-renderer-backgrounding', '--disable-background-timer-throttling', '--disable-backgrounding-occluded-windows'];

/** One browser process (Debian's Chromium) with a fresh profile, in network namespace `netns` when named; removed with `close`. */
export async function launchBrowser(extraArgs: string[] = [], netns?: string): Promise<{ context: BrowserContext; close(): Promise<void> }> {
  const profile = mkdtempSync(join(tmpdir(), 'tah-chromium-'));
  let executablePath = '/usr/bin/chromium';
  if (netns) {
    // Playwright drives the browser over inherited pipes, which `ip netns exec` keeps.
    executablePath = join(profile, 'chromium-in-netns');
    writeFileSync(executablePath, `#!/bin/sh\nexec ip netns exec ${netns} /usr/bin/chromium "$@"\n`);
    chmodSync(executablePath, 0o755);
  }
  mkdirSync(join(profile, 'profile'));
  const context = await chromium.launchPersistentContext(join(profile, 'profile'), { executablePath, headless: true, args: [...FLAGS, ...extraArgs], viewport: { width: 1000, height: 900 } });
  context.pages().forEach(watchPage);
  context.on('page', watchPage);
  return {
    context,
    async close() {
      await context.close().catch(() => {});
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** Opens the Train at Home page in a new tab and presses Join. */
export async function openTab(context: BrowserContext, url: string): Promise<Page> {
  const page = await context.newPage();
  await page.goto(url);
  await page.getByTestId('join').click();
  return page;
}

/** What a tab's page shows now (read through locators: tsx-compiled functions do not survive page.evaluate). */
export async function tabView(page: Page): Promise<{ phase: string; stage: string; microbatches: number; backend: string }> {
  const text = async (id: string): Promise<string> => ((await page.getByTestId(id).count()) ? ((await page.getByTestId(id).first().textContent()) ?? '') : '');
  const phaseEl = page.getByTestId('phase');
  return {
    phase: (await phaseEl.count()) ? ((await phaseEl.getAttribute('data-phase')) ?? '') : '',
    stage: await text('stage'),
    microbatches: Number((await text('microbatches')) || 0),
    backend: await text('backend'),
  };
}

export async function screenshot(page: Page, name: string): Promise<string> {
  mkdirSync(ARTIFACTS, { recursive: true });
  const path = join(ARTIFACTS, name);
  await page.screenshot({ path, fullPage: true });
  return path;
}
