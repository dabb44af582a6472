import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { HOST, launchBrowser, noPageErrors, openTab, screenshot, tabView } from './lib';

/**
 * A coordinator served over HTTPS at an address other than localhost (the namespace's), with a certificate this test
 * makes: browsers give WebGPU only to secure contexts, so this is how a hosted run's tabs reach it. The browser trusts
 * exactly that certificate (its public key pinned), and is not told to treat any plain-http origin as secure.
 */
const MAIN = fileURLToPath(new URL('../server/src/main.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const PORT = 20_000 + Math.floor(Math.random() * 20_000);

const dir = mkdtempSync(join(tmpdir(), 'tah-https-'));
let coordinator: ChildProcess | undefined;
let browser: Awaited<ReturnType<typeof launchBrowser>> | undefined;
let output = '';

afterEach(noPageErrors);
afterAll(async () => {
  await browser?.close();
  if (coordinator && coordinator.exitCode === null) coordinator.kill('SIGKILL');
  try {
    for (const { pid } of JSON.parse(readFileSync(join(dir, 'db', 'local-miners.json'), 'utf8')) as Array<{ pid: number }>) process.kill(pid, 'SIGTERM');
  } catch {
    // none recorded, or gone
  }
  rmSync(dir, { recursive: true, force: true });
});

/** GET over HTTPS, trusting only the test's certificate (which names the namespace's address). */
function getJson(cert: Buffer, path: string): Promise<any> {
  return new Promise((resolve, reject) => {
    const req = request({ host: HOST, port: PORT, path, ca: cert, method: 'GET' }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => {
        try {
          resolve(JSON.parse(body));
        } catch (e) {
          reject(e);
        }
      });
    });
    req.on('error', reject);
    req.end();
  });
}

describe('HTTPS', () => {
  it('the coordinator serves its pages over HTTPS with a certificate; a tab opened at a non-localhost address is a secure context and gets WebGPU; its local miner comes in through the loopback door', { timeout: 300_000 }, async () => {
    // A self-signed certificate for the namespace's address, and its public key's SHA-256 (what Chromium pins).
    const [cert, key] = [join(dir, 'cert.pem'), join(dir, 'key.pem')];
    execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', key, '-out', cert, '-days', '2', '-subj', `/CN=${HOST}`, '-addext', `subjectAltName=IP:${HOST}`], { stdio: 'ignore' });
    const spki = execFileSync('bash', ['-c', `openssl x509 -in ${cert} -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64`]).toString().trim();
    const pem = readFileSync(cert);

    coordinator = spawn(
      process.execPath,
      ['--import', 'tsx', MAIN, '--port', String(PORT), '--host', HOST, '--preset', 'tiny', '--stages', '2', '--data-dir', join(dir, 'db'), '--tls-cert', cert, '--tls-key', key],
      { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    coordinator.stdout!.on('data', (c: Buffer) => (output += c.toString()));
    coordinator.stderr!.on('data', (c: Buffer) => (output += c.toString()));
    const url = `https://${HOST}:${PORT}`;
    await expect.poll(() => output, { timeout: 120_000, interval: 250 }).toContain(`the dashboard is ${url}/dashboard`);
    // Plain HTTP at that port gets no page: it speaks TLS only.
    const plain = await fetch(`http://${HOST}:${PORT}/api/status`).then((r) => r.status, (e: Error) => e.name);
    expect(plain).not.toBe(200);

    browser = await launchBrowser(['--enable-unsafe-webgpu', `--ignore-certificate-errors-spki-list=${spki}`]);
    const tab = await openTab(browser.context, `${url}/?backend=webgpu`);
    expect(await tab.evaluate('[window.isSecureContext, location.protocol]')).toEqual([true, 'https:']);
    await expect.poll(async () => (await tabView(tab)).backend, { timeout: 120_000, interval: 1000 }).toBe('webgpu');
    expect(await tab.getByTestId('backend-why').textContent()).toMatch(/webgpu was asked for/);

    // Alone in a 2-stage run, the coordinator starts a miner of its own for the other stage; it registers through
    // the plain door on 127.0.0.1 (tls-loopback.ts), carried over TLS to the HTTPS port.
    await expect.poll(async () => (await getJson(pem, '/api/stages')).stages.map((s: { miners: unknown[] }) => s.miners.length), { timeout: 120_000, interval: 1000 }).toEqual([1, 1]);
    expect((await getJson(pem, '/api/status')).localMiners.running).toBe(1);
    await screenshot(tab, 'https-webgpu-tab.png');

    const exited = new Promise<number | null>((resolve) => coordinator!.once('exit', resolve));
    coordinator.kill('SIGINT');
    expect(await exited).toBe(0);
    console.log(`e2e: the HTTPS coordinator's output:\n${output}`);
    expect(output).toMatch(/^Train at Home: stopped\./m);
  });
});
