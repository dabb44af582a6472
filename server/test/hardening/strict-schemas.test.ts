import { Keyring } from '@polkadot/keyring';
import { stringToU8a, u8aToHex } from '@polkadot/util';
import { mnemonicGenerate } from '@polkadot/util-crypto';
import { cryptoReady, generateIdentity } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import type { FastifyInstance } from 'fastify';
import { afterEach, describe, expect, it } from 'vitest';
import type { App } from '../../src/app';
import { runStartMs } from '../../src/ledger/queries';
import { settleEpoch } from '../../src/ledger/settle';
import { buildSettlement, testMiners } from '@train-at-home/testkit/settlements';
import { hardeningHarness } from '@train-at-home/testkit/hardening-harness';

/**
 * Issue 25, item 10: Fastify's default Ajv coerced types (a one-element array
 * taken as the string it wraps) and dropped unknown fields, so bodies the docs
 * refuse were accepted. Every route that takes a body is found from the
 * app's own route table; each JSON one must refuse a wrong type or an unknown
 * field with 400 BAD_REQUEST (the app's named format) and change nothing, and
 * then take the well-formed body.
 */

/** Every route of the app with the methods it answers, read from Fastify's route tree (printRoutes). */
function routeTable(fastify: FastifyInstance): Array<{ method: string; path: string }> {
  const routes: Array<{ method: string; path: string }> = [];
  const prefixes: string[] = [];
  for (const line of fastify.printRoutes({ commonPrefix: false }).split('\n')) {
    const m = /^(.*?)[├└]── (.*) \(([A-Z, ]+)\)$/.exec(line);
    if (!m) continue;
    const depth = m[1]!.length / 4;
    const path = (depth > 0 ? prefixes[depth - 1]! : '') + m[2]!;
    prefixes[depth] = path;
    for (const method of m[3]!.split(', ')) routes.push({ method, path });
  }
  return routes;
}

/** What a field of a well-formed body must not be taken as: the same value in a one-element array, and other types. */
const wrongTypes = (value: unknown): unknown[] => [[value], 42, true, null, { value }];

describe('schemas hold as documented on every route with a body', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  it('wrong types and unknown fields get 400 BAD_REQUEST, change nothing, and the well-formed body still works', { timeout: 60_000 }, async () => {
    await cryptoReady();
    const { app, url } = await h.start('hardening-schemas');
    const withBody = routeTable(app.fastify)
      .filter((r) => !['GET', 'HEAD', 'OPTIONS'].includes(r.method))
      .map((r) => `${r.method} ${r.path}`)
      .sort();
    // A new route with a body must be added to one of these lists, and so to this test.
    const JSON_ROUTES = ['POST /api/rewards/challenge', 'POST /api/rewards/claim', 'POST /api/rewards/link'];
    const BYTES_ROUTES = ['PUT /api/audits/:auditId', 'PUT /api/checkpoints/:stage', 'PUT /api/probes/:probeId'];
    expect(withBody).toEqual([...JSON_ROUTES, ...BYTES_ROUTES].sort());

    // Real parts for the well-formed bodies: a registered miner, an sr25519 wallet with a settled payout.
    const wallet = new Keyring({ type: 'sr25519', ss58Format: 42 }).addFromUri(mnemonicGenerate());
    const miner = generateIdentity();
    await register(await h.open(url), miner, { backend: 'wasm', tokensPerSec: 1 });
    const runId = app.coordinator.runId;
    const others = testMiners(1);
    const settlement = buildSettlement(runId, await runStartMs(app.db, runId), app.coordinator.run.incentives.epochMs, 100, 1_000_000n, [
      { ...others[0]!, work: 10, quality: 1, account: wallet.address },
    ]);
    expect((await settleEpoch(app.db, settlement)).settled).toBe(true);

    const send = async (a: App, method: string, path: string, payload: unknown, headers: Record<string, string> = {}) => {
      const res = await a.fastify.inject({ method: method as 'POST', url: path, payload: JSON.stringify(payload), headers: { 'content-type': 'application/json', ...headers } });
      return { status: res.statusCode, body: res.json() as { error?: string; message?: string; [k: string]: unknown } };
    };
    const snapshot = async (): Promise<string> =>
      JSON.stringify(
        await Promise.all(['nonces', 'payout_links', 'claims', 'claimed_items', 'checkpoints', 'audits'].map((t) => app.db.query(`SELECT to_jsonb(t)::text AS j FROM ${t} t ORDER BY j`))),
      );
    const refusedEach = async (method: string, path: string, good: Record<string, unknown>): Promise<number> => {
      const bad: Array<[string, unknown]> = [];
      for (const [field, value] of Object.entries(good)) for (const wrong of wrongTypes(value)) bad.push([`${field}: ${JSON.stringify(wrong)}`, { ...good, [field]: wrong }]);
      bad.push(['an unknown field', { ...good, extra: 1 }]);
      bad.push(['an unknown field named like another route’s', { ...good, minerSignature: good.signature ?? '0x', address: wallet.address, kind: good.kind ?? 'claim' }]);
      bad.push(['an array of the body', [good]]);
      const before = await snapshot();
      for (const [what, body] of bad) {
        if (JSON.stringify(body) === JSON.stringify(good)) continue; // the extra fields above may all be the route's own
        const res = await send(app, method, path, body);
        expect([res.status, res.body.error], `${method} ${path} with ${what}: ${JSON.stringify(res.body)}`).toEqual([400, 'BAD_REQUEST']);
        expect(typeof res.body.message).toBe('string');
      }
      expect(await snapshot()).toBe(before);
      return bad.length;
    };
    const sign = (message: string) => u8aToHex(wallet.sign(stringToU8a(message)));

    // POST /api/rewards/challenge, both kinds.
    let checked = 0;
    const linkChallenge = { kind: 'link', minerId: miner.publicKey, address: wallet.address };
    const claimChallenge = { kind: 'claim', address: wallet.address };
    checked += await refusedEach('POST', '/api/rewards/challenge', linkChallenge);
    checked += await refusedEach('POST', '/api/rewards/challenge', claimChallenge);
    const link = await send(app, 'POST', '/api/rewards/challenge', linkChallenge);
    expect(link.status, JSON.stringify(link.body)).toBe(200);
    const claim = await send(app, 'POST', '/api/rewards/challenge', claimChallenge);
    expect(claim.status, JSON.stringify(claim.body)).toBe(200);

    // POST /api/rewards/link and /claim with real signatures: refused while malformed, taken once well-formed.
    const linkMessage = link.body.message as string;
    const linkBody = { message: linkMessage, signature: sign(linkMessage), minerSignature: miner.sign('payout-link', { message: linkMessage }) };
    checked += await refusedEach('POST', '/api/rewards/link', linkBody);
    expect((await send(app, 'POST', '/api/rewards/link', linkBody)).status).toBe(200);
    const claimMessage = claim.body.message as string;
    const claimBody = { message: claimMessage, signature: sign(claimMessage) };
    checked += await refusedEach('POST', '/api/rewards/claim', claimBody);
    const claimed = await send(app, 'POST', '/api/rewards/claim', claimBody);
    expect(claimed.status, JSON.stringify(claimed.body)).toBe(200);
    expect(claimed.body.receipt).toMatchObject({ address: wallet.address, amount: settlement.payouts[0]!.amount.toString() });
    expect(checked).toBeGreaterThan(50);

    // The routes that take raw bytes have no JSON fields: any JSON body is refused by name, broken JSON too, and nothing is stored.
    const before = await snapshot();
    const minerHeaders = { 'x-miner-id': miner.publicKey.slice(2), 'x-step': '1', 'x-signature': '0x' };
    for (const path of ['/api/checkpoints/0', `/api/probes/${'ab'.repeat(16)}`, `/api/audits/${'ab'.repeat(16)}`]) {
      for (const body of [{ extra: 1 }, [1], 'text', { stage: ['0'] }]) {
        const res = await send(app, 'PUT', path, body, minerHeaders);
        expect([res.status, res.body.error], `PUT ${path} ${JSON.stringify(body)}`).toEqual([415, 'BAD_CONTENT_TYPE']);
      }
    }
    for (const path of [`/api/probes/${'ab'.repeat(16)}`, `/api/audits/${'ab'.repeat(16)}`]) {
      const broken = await app.fastify.inject({ method: 'PUT', url: path, payload: '{"chunk": ', headers: { 'content-type': 'application/json', ...minerHeaders } });
      expect([broken.statusCode, broken.json().error], path).toEqual([400, 'BAD_REQUEST']);
    }
    expect(await snapshot()).toBe(before);

    // Queries, which the docs hold to the same rule: a repeated or unknown parameter is refused, a good one is taken.
    for (const query of ['limit=5&limit=5', 'extra=1', 'limit=05', 'limit=0', 'limit=501']) {
      for (const path of [`/api/rewards/${wallet.address}`, `/api/rewards/${wallet.address}/claims`]) {
        const res = await app.fastify.inject({ method: 'GET', url: `${path}?${query}` });
        expect([res.statusCode, res.json().error], `${path}?${query}`).toEqual([400, 'BAD_REQUEST']);
      }
    }
    const page = await app.fastify.inject({ method: 'GET', url: `/api/rewards/${wallet.address}?limit=1` });
    expect(page.statusCode).toBe(200);
    expect(page.json()).toMatchObject({ address: wallet.address, miners: [miner.publicKey], totals: { claimable: '0' } });
    const claims = await app.fastify.inject({ method: 'GET', url: `/api/rewards/${wallet.address}/claims?limit=1&before=2147483647` });
    expect([claims.statusCode, (claims.json() as { claims: unknown[] }).claims.length]).toEqual([200, 1]);
  });
});
