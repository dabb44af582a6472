import { Keyring } from '@polkadot/keyring';
import type { KeyringPair } from '@polkadot/keyring/types';
import { stringToU8a, u8aToHex, u8aWrapBytes } from '@polkadot/util';
import { mnemonicGenerate } from '@polkadot/util-crypto';
import { verifyPayout } from '@train-at-home/incentives';
import { cryptoReady, generateIdentity, parseRewardsMessage, type ClaimMessage, type Identity } from '@train-at-home/protocol';
import { claimRewards, linkPayout, register, RewardsApiError } from '@train-at-home/swarm';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { io as connect, type Socket } from 'socket.io-client';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { loadPayoutKey, PayoutKeyError } from '../../apps/miner/src/payout';
import { buildApp, type App, type AppOptions } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { runStartMs } from '../src/ledger/queries';
import { settleEpoch, type SettlementInput } from '../src/ledger/settle';
import { buildSettlement, testMiners } from '@train-at-home/testkit/settlements';
import { recordMicrobatch } from '@train-at-home/testkit/work';
import { freePort } from '@train-at-home/testkit/ports';

/**
 * Rewards for wallet holders, against a real coordinator on the test database
 * (PGlite, or PostgreSQL under scripts/test-postgres.sh): real sr25519 wallets
 * from @polkadot/keyring, epochs settled by the ledger's own settleEpoch, and
 * after every refusal the tables are compared to show nothing was paid.
 */

const TTL_MS = 5 * 60_000;
let app: App;
let url: string;
/** The main coordinator's domain: its own loopback address and port. */
let domain: string;
let runId: number;
let startMs: number;
/** The coordinator's rewards clock runs this far ahead of the real one (the expiry test moves it). */
let skewMs = 0;
const sockets: Socket[] = [];
const dirs: string[] = [];

let sr: Keyring;
let ed: Keyring;
const wallet = (): KeyringPair => sr.addFromUri(mnemonicGenerate());

async function start(options: AppOptions = {}, port = 0): Promise<{ app: App; url: string }> {
  // No audits: the work these tests settle is written straight to the database, never trained in a committed round (where
  // a round is drawn, only replicas that committed it are paid for it: jobs/accounting.ts).
  const a = await buildApp({ database: await testDatabase(), run: { name: 'rewards', preset: 'tiny', stages: 3, bottleneck: 32, incentives: { auditRate: 0 } }, ...options });
  return { app: a, url: await a.fastify.listen({ port, host: '127.0.0.1' }) };
}

/**
 * A coordinator of its own whose every transaction is SERIALIZABLE on PostgreSQL (an operator's
 * default_transaction_isolation; checked), with rate limits no test here reaches. PGlite runs one transaction at a time.
 */
async function serializableCoordinator(): Promise<{ app: App; url: string }> {
  const base = await testDatabase();
  let database = base;
  if (base.url) {
    const strict = new URL(base.url);
    strict.searchParams.set('options', '-c default_transaction_isolation=serializable');
    database = { url: strict.toString() };
  }
  const generous = { max: 100_000, timeWindowMs: 60_000 };
  const target = await start({ database, rewards: { rateLimit: { perIp: generous, perAddress: generous } } });
  if (target.app.db.kind === 'postgres') {
    const [{ level }] = (await target.app.db.query<{ level: string }>("SELECT current_setting('transaction_isolation') AS level")) as [{ level: string }];
    expect(level).toBe('serializable');
  }
  return target;
}


beforeAll(async () => {
  await cryptoReady();
  sr = new Keyring({ type: 'sr25519', ss58Format: 42 });
  ed = new Keyring({ type: 'ed25519', ss58Format: 42 });
  // Limits far above what the tests send, but for the rate-limit test's own coordinator.
  const generous = { max: 100_000, timeWindowMs: 60_000 };
  // Its domain is the address the tests reach it at, as a deployed coordinator's is the site people open:
  // the shared client checks that the messages it signs name the coordinator it talks to.
  const port = await freePort();
  domain = `127.0.0.1:${port}`;
  ({ app, url } = await start({ rewards: { domain, now: () => Date.now() + skewMs, challengeTtlMs: TTL_MS, rateLimit: { perIp: generous, perAddress: generous } } }, port));
  runId = app.coordinator.runId;
  startMs = await runStartMs(app.db, runId);
});
afterEach(() => {
  skewMs = 0;
  sockets.splice(0).forEach((s) => s.disconnect());
});
afterAll(async () => {
  await app?.close();
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

// Epochs far from the run's clock (epoch 0 is the validator's, in the settlement test).
let nextEpoch = 100;
/** Settles one more epoch through the ledger, paying each account (and one miner paid to its own id). */
async function settleTo(...accounts: string[]): Promise<SettlementInput> {
  return settleOn(app, ...accounts);
}
async function settleOn(target: App, ...accounts: string[]): Promise<SettlementInput> {
  const miners = testMiners(accounts.length + 1);
  const id = target.coordinator.runId;
  const input = buildSettlement(
    id,
    target === app ? startMs : await runStartMs(target.db, id),
    target.coordinator.run.incentives.epochMs,
    nextEpoch++,
    1_000_000_007n,
    miners.map((m, i) => ({ ...m, work: 10 + 7 * i, quality: 0.9, account: accounts[i] })),
  );
  expect((await settleEpoch(target.db, input)).settled).toBe(true);
  return input;
}

const paid = (input: SettlementInput, account: string): bigint => input.payouts.find((p) => p.account === account)!.amount;
const sign = (pair: KeyringPair, message: string): string => u8aToHex(pair.sign(stringToU8a(message)));
/** As extensions' signRaw signs: the message wrapped in <Bytes>…</Bytes>. */
const signWrapped = (pair: KeyringPair, message: string): string => u8aToHex(pair.sign(u8aWrapBytes(message)));

interface Res {
  status: number;
  body: { error?: string; message?: string; [k: string]: unknown };
  headers: Record<string, unknown>;
}
async function call(method: 'GET' | 'POST', path: string, payload?: unknown, remoteAddress?: string, target: App = app): Promise<Res> {
  const res = await target.fastify.inject({ method, url: path, payload: payload as object, remoteAddress });
  let body: Res['body'];
  try {
    body = res.json();
  } catch {
    body = { raw: res.body };
  }
  return { status: res.statusCode, body, headers: res.headers };
}
const post = (path: string, payload: unknown, remoteAddress?: string, target?: App) => call('POST', path, payload, remoteAddress, target);
const get = (path: string) => call('GET', path);

async function claimChallenge(address: string): Promise<{ message: string; parsed: ClaimMessage }> {
  const res = await post('/api/rewards/challenge', { kind: 'claim', address });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  const message = res.body.message as string;
  return { message, parsed: parseRewardsMessage(message) as ClaimMessage };
}

/** Every row links and claims wrote (and each nonce's use): equal before and after a refusal means nothing changed. */
async function rewardsSnapshot(): Promise<string> {
  const tables = await Promise.all(
    ['claims', 'claimed_items', 'payout_links', 'nonces', 'payouts', 'settlements'].map((t) => app.db.query(`SELECT to_jsonb(t)::text AS j FROM ${t} t ORDER BY j`).then((rows) => rows.map((r) => r.j))),
  );
  return JSON.stringify(tables);
}

/** Totals as the ledger holds them, for one address. */
async function ledgerOf(address: string): Promise<{ settled: bigint; claimed: bigint; claims: number; items: number }> {
  const [row] = await app.db.query<{ settled: string; claimed: string; claims: number; items: number }>(
    `SELECT (SELECT coalesce(sum(amount), 0) FROM payouts WHERE account = $1)::text AS settled,
            (SELECT coalesce(sum(amount), 0) FROM claimed_items WHERE account = $1)::text AS claimed,
            (SELECT count(*)::int FROM claims WHERE address = $1) AS claims,
            (SELECT count(*)::int FROM claimed_items WHERE account = $1) AS items`,
    [address],
  );
  return { settled: BigInt(row!.settled), claimed: BigInt(row!.claimed), claims: row!.claims, items: row!.items };
}

async function registeredMiner(target = url): Promise<Identity> {
  const socket = connect(target, { transports: ['websocket'], reconnection: false, forceNew: true });
  sockets.push(socket);
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('connect_error', reject);
  });
  const identity = generateIdentity();
  await register(socket, identity, { backend: 'wasm', tokensPerSec: 1000 });
  return identity;
}

async function linkChallenge(miner: Identity, address: string): Promise<string> {
  const res = await post('/api/rewards/challenge', { kind: 'link', minerId: miner.publicKey, address });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.message as string;
}

async function currentLink(miner: Identity): Promise<string | undefined> {
  const [row] = await app.db.query<{ address: string }>('SELECT address FROM payout_addresses WHERE miner_id = $1', [miner.publicKey.slice(2)]);
  return row?.address;
}

describe('rewards: claims', () => {
  it('pays a valid claim once, with a receipt, and shows each epoch with a proof that verifies', async () => {
    const alice = wallet();
    const settled = [await settleTo(alice.address), await settleTo(alice.address, wallet().address)];
    const total = settled.reduce((s, e) => s + paid(e, alice.address), 0n);

    const before = await get(`/api/rewards/${alice.address}`);
    expect(before.status).toBe(200);
    expect(before.body).toMatchObject({ address: alice.address, miners: [], totals: { settled: total.toString(), claimed: '0', claimable: total.toString() } });
    const epochs = before.body.epochs as Array<{ runId: number; epoch: number; settled: string; claimable: string; root: string; proof: string[] }>;
    expect(epochs.map((e) => e.epoch)).toEqual(settled.map((s) => s.epoch).reverse());
    for (const e of epochs) expect(verifyPayout(e.root, alice.address, e.settled, e.proof)).toBe(true);

    const { message, parsed } = await claimChallenge(alice.address);
    expect(parsed).toMatchObject({ kind: 'claim', domain, address: alice.address, amount: total, epochs: settled.map((s) => ({ runId, epoch: s.epoch })) });
    expect(Date.parse(parsed.expires) - Date.now()).toBeGreaterThan(TTL_MS - 60_000);
    // Signed as an extension signs: over <Bytes>message</Bytes>.
    const res = await post('/api/rewards/claim', { message, signature: signWrapped(alice, message) });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const receipt = res.body.receipt as { id: number; amount: string; epochs: Array<{ epoch: number; amount: string }>; payout: object; claimedAt: string };
    expect(receipt).toMatchObject({ address: alice.address, amount: total.toString(), payout: { method: 'ledger', status: 'recorded' } });
    expect(receipt.epochs).toEqual(settled.map((s) => ({ runId, epoch: s.epoch, amount: paid(s, alice.address).toString() })));

    expect(await ledgerOf(alice.address)).toEqual({ settled: total, claimed: total, claims: 1, items: 2 });
    const after = await get(`/api/rewards/${alice.address}`);
    expect(after.body.totals).toEqual({ settled: total.toString(), claimed: total.toString(), claimable: '0' });
    expect((after.body.epochs as Array<{ claimable: string }>).every((e) => e.claimable === '0')).toBe(true);
    expect((await get(`/api/rewards/${alice.address}/claims`)).body).toEqual({ claims: [receipt], nextBefore: null });

    // The same signed claim again, and a new challenge: nothing more to pay.
    const snapshot = await rewardsSnapshot();
    const again = await post('/api/rewards/claim', { message, signature: signWrapped(alice, message) });
    expect([again.status, again.body.error]).toEqual([409, 'NONCE_USED']);
    expect([(await post('/api/rewards/challenge', { kind: 'claim', address: alice.address })).body.error]).toEqual(['NOTHING_TO_CLAIM']);
    expect(await rewardsSnapshot()).toBe(snapshot);
    expect(await ledgerOf(alice.address)).toEqual({ settled: total, claimed: total, claims: 1, items: 2 });
  });

  it('refuses an expired, foreign, forged, malformed or inflated claim by name, pays nothing, and the honest claim still goes through', async () => {
    const bob = wallet();
    const carol = wallet();
    const [e1, e2] = [await settleTo(bob.address), await settleTo(bob.address, carol.address)];
    const elsewhere = await settleTo(carol.address); // pays nothing to bob
    const total = paid(e1, bob.address) + paid(e2, bob.address);
    const { message, parsed } = await claimChallenge(bob.address);
    const snapshot = await rewardsSnapshot();
    const claim = (text: string, signature: string) => post('/api/rewards/claim', { message: text, signature });
    const refused = async (res: Promise<Res>, status: number, error: string) => {
      const r = await res;
      expect([r.status, r.body.error], JSON.stringify(r.body)).toEqual([status, error]);
      expect(typeof r.body.message).toBe('string');
    };

    // Expired: the coordinator's clock moves past the expiry.
    skewMs = TTL_MS + 1000;
    await refused(claim(message, sign(bob, message)), 410, 'EXPIRED');
    skewMs = 0;
    // Another domain: the same message as another coordinator would write it, signed by bob.
    const foreign = message.replace(`domain: ${domain}`, 'domain: evil.example');
    await refused(claim(foreign, sign(bob, foreign)), 403, 'WRONG_DOMAIN');
    // Signed by another address.
    await refused(claim(message, sign(carol, message)), 401, 'BAD_SIGNATURE');
    await refused(claim(message, signWrapped(carol, message)), 401, 'BAD_SIGNATURE');
    // Malformed signatures.
    for (const s of ['0x1234', 'hello', `0x${'zz'.repeat(64)}`, sign(bob, message).slice(0, -2), `${sign(bob, message)}00ff`, '']) {
      await refused(claim(message, s), 400, 'MALFORMED_SIGNATURE');
    }
    // Malformed addresses: in the challenge, the balance, and the signed message.
    const badChecksum = `${bob.address.slice(0, -1)}${bob.address.endsWith('a') ? 'b' : 'a'}`;
    for (const address of ['not-an-address', badChecksum, `0x${'11'.repeat(32)}`, '5'.repeat(48)]) {
      await refused(post('/api/rewards/challenge', { kind: 'claim', address }), 400, 'BAD_ADDRESS');
      await refused(get(`/api/rewards/${encodeURIComponent(address)}`), 400, 'BAD_ADDRESS');
      const text = message.replace(`address: ${bob.address}`, `address: ${address}`);
      await refused(claim(text, sign(bob, text)), 400, 'BAD_ADDRESS');
    }
    // More than the claimable amount, and less; an epoch that pays bob nothing.
    const inflated = message.replace(`amount: ${total}`, `amount: ${total + 1n}`);
    await refused(claim(inflated, sign(bob, inflated)), 409, 'AMOUNT_EXCEEDS_CLAIMABLE');
    const doubled = message.replace(`amount: ${total}`, `amount: ${total * 2n}`);
    await refused(claim(doubled, sign(bob, doubled)), 409, 'AMOUNT_EXCEEDS_CLAIMABLE');
    const less = message.replace(`amount: ${total}`, `amount: ${total - 1n}`);
    await refused(claim(less, sign(bob, less)), 409, 'AMOUNT_MISMATCH');
    const extra = message.replace(`epochs: ${runId}:${e1.epoch},${runId}:${e2.epoch}`, `epochs: ${runId}:${e1.epoch},${runId}:${e2.epoch},${runId}:${elsewhere.epoch}`);
    await refused(claim(extra, sign(bob, extra)), 400, 'NOT_CLAIMABLE');
    // A later expiry than was issued, and a nonce never issued.
    const later = message.replace(`expires: ${parsed.expires}`, `expires: ${new Date(Date.parse(parsed.expires) + 3_600_000).toISOString()}`);
    await refused(claim(later, sign(bob, later)), 400, 'MESSAGE_MISMATCH');
    const unissued = message.replace(parsed.nonce, `0x${randomBytes(32).toString('hex')}`);
    await refused(claim(unissued, sign(bob, unissued)), 400, 'UNKNOWN_NONCE');
    // Not a claim message at all.
    for (const text of ['hello', `${message}\n`, message.replace('Train at Home: claim rewards', 'Train at Home: link a payout address'), message.replace('amount: ', 'amount:  ')]) {
      await refused(claim(text, sign(bob, text)), 400, 'BAD_MESSAGE');
    }

    expect(await rewardsSnapshot()).toBe(snapshot);
    expect(await ledgerOf(bob.address)).toEqual({ settled: total, claimed: 0n, claims: 0, items: 0 });
    // None of that used up the challenge: bob's own claim of it is paid, once.
    const second = await claimChallenge(bob.address);
    const ok = await claim(message, sign(bob, message));
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    await refused(claim(message, sign(bob, message)), 409, 'NONCE_USED');
    await refused(claim(inflated, sign(bob, inflated)), 409, 'NONCE_USED');
    // A second challenge of the same balance, taken before the first was claimed.
    await refused(claim(second.message, sign(bob, second.message)), 409, 'ALREADY_CLAIMED');
    expect(await ledgerOf(bob.address)).toEqual({ settled: total, claimed: total, claims: 1, items: 2 });
  });

  it('accepts only sr25519: an ed25519 wallet’s valid signature is refused and nothing is paid', async () => {
    const dave = ed.addFromUri(mnemonicGenerate());
    await settleTo(dave.address);
    const { message } = await claimChallenge(dave.address);
    const snapshot = await rewardsSnapshot();
    for (const signature of [sign(dave, message), signWrapped(dave, message)]) {
      const res = await post('/api/rewards/claim', { message, signature });
      expect([res.status, res.body.error]).toEqual([401, 'UNSUPPORTED_KEY_TYPE']);
    }
    expect(await rewardsSnapshot()).toBe(snapshot);
    expect((await ledgerOf(dave.address)).claimed).toBe(0n);
  });

  it('pays 50 simultaneous copies of one signed claim exactly once', async () => {
    const erin = wallet();
    const e = await settleTo(erin.address);
    const { message } = await claimChallenge(erin.address);
    const signature = sign(erin, message);
    const results = await Promise.all(Array.from({ length: 50 }, () => post('/api/rewards/claim', { message, signature })));
    expect(results.filter((r) => r.status === 200)).toHaveLength(1);
    expect(results.filter((r) => r.status !== 200).map((r) => `${r.status} ${r.body.error}`)).toEqual(Array(49).fill('409 NONCE_USED'));
    expect(await ledgerOf(erin.address)).toEqual({ settled: paid(e, erin.address), claimed: paid(e, erin.address), claims: 1, items: 1 });
  });

  it('pays 50 simultaneous claims of the same balance, each from its own challenge, exactly once', async () => {
    const frank = wallet();
    const settled = [await settleTo(frank.address), await settleTo(frank.address)];
    const total = settled.reduce((s, e) => s + paid(e, frank.address), 0n);
    const challenges = await Promise.all(Array.from({ length: 50 }, () => claimChallenge(frank.address)));
    expect(new Set(challenges.map((c) => c.parsed.nonce)).size).toBe(50);
    const results = await Promise.all(challenges.map(({ message }) => post('/api/rewards/claim', { message, signature: sign(frank, message) })));
    expect(results.filter((r) => r.status === 200)).toHaveLength(1);
    expect(results.filter((r) => r.status !== 200).map((r) => `${r.status} ${r.body.error}`)).toEqual(Array(49).fill('409 ALREADY_CLAIMED'));
    expect(await ledgerOf(frank.address)).toEqual({ settled: total, claimed: total, claims: 1, items: 2 });
  });

  it('answers any malformed request with a named 4xx, never a 500', async () => {
    const snapshot = await rewardsSnapshot();
    const cases: Array<[string, unknown]> = [
      ['/api/rewards/challenge', {}],
      ['/api/rewards/challenge', { kind: 'link', address: wallet().address }], // no miner
      ['/api/rewards/challenge', { kind: 'claim', address: wallet().address, minerId: `0x${'ab'.repeat(32)}` }],
      ['/api/rewards/challenge', { kind: 'stake', address: wallet().address }],
      ['/api/rewards/challenge', { kind: 'link', minerId: '0x12', address: wallet().address }],
      ['/api/rewards/challenge', { kind: 'claim', address: 'x'.repeat(10_000) }],
      ['/api/rewards/challenge', { kind: 'claim', address: 42 }],
      ['/api/rewards/challenge', [1, 2, 3]],
      ['/api/rewards/challenge', 'null'],
      ['/api/rewards/claim', {}],
      ['/api/rewards/claim', { message: 'x'.repeat(20_000), signature: '0x00' }],
      ['/api/rewards/claim', { message: { nested: true }, signature: 7 }],
      ['/api/rewards/claim', { message: '', signature: '' }],
      ['/api/rewards/claim', { message: 'Train at Home: claim rewards', signature: `0x${'00'.repeat(64)}` }],
      ['/api/rewards/claim', JSON.parse('{"__proto__": {"x": 1}, "message": "a", "signature": "b"}')],
      ['/api/rewards/link', { message: 'a', signature: 'b' }],
      ['/api/rewards/link', { message: 'Train at Home: link a payout address', signature: '0x', minerSignature: '0x' }],
    ];
    for (const [path, payload] of cases) {
      const res = await post(path, payload);
      expect(res.status, `${path} ${JSON.stringify(payload).slice(0, 80)} → ${JSON.stringify(res.body)}`).toBeGreaterThanOrEqual(400);
      expect(res.status).toBeLessThan(500);
      expect(res.body.error).toMatch(/^[A-Z_]+$/);
    }
    // Not JSON, and broken JSON.
    const text = await app.fastify.inject({ method: 'POST', url: '/api/rewards/claim', payload: 'message=x', headers: { 'content-type': 'application/x-www-form-urlencoded' } });
    expect([text.statusCode, text.json().error]).toEqual([415, 'BAD_CONTENT_TYPE']);
    const broken = await app.fastify.inject({ method: 'POST', url: '/api/rewards/claim', payload: '{"message": ', headers: { 'content-type': 'application/json' } });
    expect([broken.statusCode, broken.json().error]).toEqual([400, 'BAD_REQUEST']);
    const huge = await app.fastify.inject({ method: 'POST', url: '/api/rewards/claim', payload: { message: 'x'.repeat(70_000), signature: '0x' } });
    expect([huge.statusCode, huge.json().error]).toEqual([413, 'BODY_TOO_LARGE']);
    for (const path of [`/api/rewards/${wallet().address}?limit=0`, `/api/rewards/${wallet().address}?limit=501`, `/api/rewards/${wallet().address}?before=99999999999:1`, `/api/rewards/${wallet().address}/claims?before=-1`]) {
      const res = await get(path);
      expect([res.status, res.body.error], path).toEqual([400, 'BAD_REQUEST']);
    }
    expect(await rewardsSnapshot()).toBe(snapshot);
  });

  it('never lets the total claimed exceed the total settled, for any account', async () => {
    const rows = await app.db.query<{ account: string; settled: string; claimed: string }>(
      `SELECT p.account, sum(p.amount)::text AS settled, coalesce((SELECT sum(c.amount) FROM claimed_items c WHERE c.account = p.account), 0)::text AS claimed
       FROM payouts p GROUP BY p.account`,
    );
    expect(rows.length).toBeGreaterThan(5);
    for (const r of rows) expect(BigInt(r.claimed)).toBeLessThanOrEqual(BigInt(r.settled));
    const [sums] = await app.db.query<{ claims: string; items: string; settled: string }>(
      `SELECT (SELECT coalesce(sum(amount), 0) FROM claims)::text AS claims, (SELECT coalesce(sum(amount), 0) FROM claimed_items)::text AS items,
              (SELECT coalesce(sum(amount), 0) FROM payouts)::text AS settled`,
    );
    expect(sums!.claims).toBe(sums!.items);
    expect(BigInt(sums!.claims)).toBeLessThanOrEqual(BigInt(sums!.settled));
    // Below the code, the database itself: a payout claimed once cannot be claimed again, nor one that was never settled.
    const [item] = await app.db.query<{ run_id: number; epoch: number; account: string; amount: string; claim_id: number }>('SELECT run_id, epoch, account, amount::text, claim_id FROM claimed_items LIMIT 1');
    const insert = 'INSERT INTO claimed_items (run_id, epoch, account, amount, claim_id) VALUES ($1, $2, $3, $4::bigint, $5)';
    await expect(app.db.query(insert, [item!.run_id, item!.epoch, item!.account, item!.amount, item!.claim_id])).rejects.toThrow(/duplicate key|unique/i);
    await expect(app.db.query(insert, [item!.run_id, 99_999, item!.account, item!.amount, item!.claim_id])).rejects.toThrow(/foreign key/i);
  });
});

describe('rewards: payout links', () => {
  it('links a registered miner to a wallet; relinking needs the miner’s signature; the wrong miner or wallet is refused', async () => {
    const miner = await registeredMiner();
    const other = await registeredMiner();
    const [alice, bob, carol] = [wallet(), wallet(), wallet()];

    const first = await linkChallenge(miner, alice.address);
    expect(parseRewardsMessage(first)).toMatchObject({ kind: 'link', domain, minerId: miner.publicKey, address: alice.address });
    const linked = await post('/api/rewards/link', { message: first, signature: signWrapped(alice, first), minerSignature: miner.sign('payout-link', { message: first }) });
    expect(linked.status, JSON.stringify(linked.body)).toBe(200);
    expect(linked.body).toMatchObject({ minerId: miner.publicKey, address: alice.address });
    expect(Date.parse(linked.body.linkedAt as string)).toBeGreaterThan(0);
    expect(await currentLink(miner)).toBe(alice.address);
    expect((await get(`/api/rewards/${alice.address}`)).body.miners).toEqual([miner.publicKey]);

    // Relinking to bob: bob's wallet and the miner sign.
    const second = await linkChallenge(miner, bob.address);
    expect((await post('/api/rewards/link', { message: second, signature: sign(bob, second), minerSignature: miner.sign('payout-link', { message: second }) })).status).toBe(200);
    expect(await currentLink(miner)).toBe(bob.address);
    expect((await get(`/api/rewards/${alice.address}`)).body.miners).toEqual([]);
    expect((await get(`/api/rewards/${bob.address}`)).body.miners).toEqual([miner.publicKey]);

    // Relinking to carol without the miner: signed by another miner, by nobody, or by the wallet again.
    const third = await linkChallenge(miner, carol.address);
    const snapshot = await rewardsSnapshot();
    const refused = async (body: object, status: number, error: string) => {
      const r = await post('/api/rewards/link', body);
      expect([r.status, r.body.error], JSON.stringify(r.body)).toEqual([status, error]);
    };
    await refused({ message: third, signature: sign(carol, third), minerSignature: other.sign('payout-link', { message: third }) }, 401, 'BAD_MINER_SIGNATURE');
    await refused({ message: third, signature: sign(carol, third), minerSignature: sign(carol, third) }, 401, 'BAD_MINER_SIGNATURE');
    await refused({ message: third, signature: sign(carol, third), minerSignature: miner.sign('register', { message: third }) }, 401, 'BAD_MINER_SIGNATURE');
    await refused({ message: third, signature: sign(carol, third), minerSignature: 'nope' }, 401, 'BAD_MINER_SIGNATURE');
    await refused({ message: third, signature: sign(carol, third) }, 400, 'BAD_REQUEST');
    // The miner signs, but the wallet does not: bob (the current address) or alice sign in carol's place.
    await refused({ message: third, signature: sign(bob, third), minerSignature: miner.sign('payout-link', { message: third }) }, 401, 'BAD_SIGNATURE');
    // A message naming the other miner, signed by both wallets' owner and this miner.
    const theirs = third.replace(`miner: ${miner.publicKey}`, `miner: ${other.publicKey}`);
    await refused({ message: theirs, signature: sign(carol, theirs), minerSignature: miner.sign('payout-link', { message: theirs }) }, 401, 'BAD_MINER_SIGNATURE');
    await refused({ message: theirs, signature: sign(carol, theirs), minerSignature: other.sign('payout-link', { message: theirs }) }, 400, 'MESSAGE_MISMATCH');
    // A link message where a claim is expected, another domain, an ed25519 wallet.
    expect((await post('/api/rewards/claim', { message: third, signature: sign(carol, third) })).body.error).toBe('BAD_MESSAGE');
    const foreign = third.replace(`domain: ${domain}`, 'domain: localhost:9999');
    await refused({ message: foreign, signature: sign(carol, foreign), minerSignature: miner.sign('payout-link', { message: foreign }) }, 403, 'WRONG_DOMAIN');
    const dave = ed.addFromUri(mnemonicGenerate());
    const edMessage = await linkChallenge(miner, dave.address);
    const edSnapshot = await rewardsSnapshot();
    await refused({ message: edMessage, signature: sign(dave, edMessage), minerSignature: miner.sign('payout-link', { message: edMessage }) }, 401, 'UNSUPPORTED_KEY_TYPE');
    expect(await rewardsSnapshot()).toBe(edSnapshot);
    expect(await currentLink(miner)).toBe(bob.address);

    // With both signatures, the relink to carol goes through, once.
    const good = { message: third, signature: sign(carol, third), minerSignature: miner.sign('payout-link', { message: third }) };
    expect(JSON.parse(snapshot).slice(0, 3)).toEqual(JSON.parse(await rewardsSnapshot()).slice(0, 3)); // claims, items, links unchanged
    expect((await post('/api/rewards/link', good)).status).toBe(200);
    await refused(good, 409, 'NONCE_USED');
    expect(await currentLink(miner)).toBe(carol.address);
    const history = await app.db.query<{ address: string }>('SELECT address FROM payout_links WHERE miner_id = $1 ORDER BY id', [miner.publicKey.slice(2)]);
    expect(history.map((h) => h.address)).toEqual([alice.address, bob.address, carol.address]);

    // Only a miner that registered here can be linked.
    const stranger = await post('/api/rewards/challenge', { kind: 'link', minerId: generateIdentity().publicKey, address: alice.address });
    expect([stranger.status, stranger.body.error]).toEqual([404, 'NO_SUCH_MINER']);
  });

  it('links once when 20 copies of one signed link arrive at once, with every transaction SERIALIZABLE on PostgreSQL: one 200, the rest 409 NONCE_USED', async () => {
    // An operator may make every transaction SERIALIZABLE (default_transaction_isolation); the losers of the race
    // for the nonce then fail to serialize instead of waiting. PGlite runs one transaction at a time: the same outcome.
    const target = await serializableCoordinator();
    try {
      const miner = await registeredMiner(target.url);
      const owner = wallet();
      const challenge = await post('/api/rewards/challenge', { kind: 'link', minerId: miner.publicKey, address: owner.address }, undefined, target.app);
      expect(challenge.status, JSON.stringify(challenge.body)).toBe(200);
      const message = challenge.body.message as string;
      const body = { message, signature: sign(owner, message), minerSignature: miner.sign('payout-link', { message }) };
      const results = await Promise.all(Array.from({ length: 20 }, () => post('/api/rewards/link', body, undefined, target.app)));
      expect(results.map((r) => `${r.status} ${r.body.error ?? ''}`.trim()).sort()).toEqual(['200', ...Array(19).fill('409 NONCE_USED')]);
      const links = await target.app.db.query<{ address: string }>('SELECT address FROM payout_links WHERE miner_id = $1', [miner.publicKey.slice(2)]);
      expect(links.map((l) => l.address)).toEqual([owner.address]);
    } finally {
      await target.app.close();
    }
  });

  it('answers 20 claim challenges for one address at once, while expired nonces are being swept, with every transaction SERIALIZABLE on PostgreSQL: all 200, none 5xx', async () => {
    // Each challenge first deletes the expired nonces: under SERIALIZABLE, concurrent sweeps of the same rows fail to
    // serialize (40001), which once answered 500 for about half of them. PGlite runs one transaction at a time.
    const target = await serializableCoordinator();
    try {
      const alice = wallet();
      await settleOn(target.app, alice.address);
      for (let attempt = 0; attempt < 5; attempt++) {
        // Expired nonces for the sweeps to race over (as a busy coordinator accumulates between challenges).
        for (let i = 0; i < 50; i++) {
          await target.app.db.query(`INSERT INTO nonces (nonce, purpose, address, message, expires_at) VALUES ($1, 'claim', $2, 'm', now() - interval '1 minute')`, [
            `0x${randomBytes(32).toString('hex')}`,
            alice.address,
          ]);
        }
        const results = await Promise.all(Array.from({ length: 20 }, () => post('/api/rewards/challenge', { kind: 'claim', address: alice.address }, undefined, target.app)));
        expect(results.map((r) => `${r.status} ${r.body.error ?? ''}`.trim())).toEqual(Array(20).fill('200'));
        // Each is a distinct, usable challenge, and the expired ones are gone.
        expect(new Set(results.map((r) => r.body.nonce)).size).toBe(20);
        const [{ n }] = (await target.app.db.query<{ n: number }>('SELECT count(*)::int AS n FROM nonces WHERE expires_at <= now()')) as [{ n: number }];
        expect(n).toBe(0);
      }
    } finally {
      await target.app.close();
    }
  });

  it('the Node miner links with its key file through the shared client, and the tab’s path claims the same way', async () => {
    const miner = await registeredMiner();
    const mnemonic = mnemonicGenerate();
    const address = sr.addFromUri(mnemonic).address;
    const dir = mkdtempSync(join(tmpdir(), 'tah-payout-'));
    dirs.push(dir);
    const file = join(dir, 'wallet.key');
    writeFileSync(file, `${mnemonic}\n`, { mode: 0o600 });

    const key = loadPayoutKey(file, address);
    expect(key).toMatchObject({ address, warning: undefined });
    const link = await linkPayout(url, miner, address, key.signRaw);
    expect(link).toMatchObject({ minerId: miner.publicKey, address });
    expect(await currentLink(miner)).toBe(address);

    // A key file for another wallet, a missing or empty one: named errors that never carry the secret.
    const wrongFile = join(dir, 'other.key');
    const otherMnemonic = mnemonicGenerate();
    writeFileSync(wrongFile, otherMnemonic, { mode: 0o644 });
    const emptyFile = join(dir, 'empty.key');
    writeFileSync(emptyFile, '\n', { mode: 0o600 });
    for (const [f, a] of [[wrongFile, address], [join(dir, 'missing.key'), address], [emptyFile, address], [file, 'not-an-address']] as const) {
      let error: unknown;
      try {
        loadPayoutKey(f, a);
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(PayoutKeyError);
      for (const secret of [mnemonic, otherMnemonic]) expect((error as Error).message).not.toContain(secret.split(' ').slice(0, 3).join(' '));
    }
    expect(loadPayoutKey(wrongFile, sr.addFromUri(otherMnemonic).address).warning).toMatch(/other users/);

    // The shared client refuses a miner the coordinator never saw, by the coordinator's code.
    const unknown = await linkPayout(url, generateIdentity(), address, key.signRaw).catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(RewardsApiError);
    expect((unknown as RewardsApiError).code).toBe('NO_SUCH_MINER');

    // claimRewards: the other half of the shared client (the Rewards page signs through the extension).
    const e = await settleTo(address);
    const receipt = await claimRewards(url, address, key.signRaw);
    expect(receipt).toMatchObject({ address, amount: paid(e, address).toString() });
    const none = await claimRewards(url, address, key.signRaw).catch((err: unknown) => err);
    expect((none as RewardsApiError).code).toBe('NOTHING_TO_CLAIM');
  });

  it('the shared client refuses, before anything is signed, a challenge relayed from another coordinator’s domain', async () => {
    // A site that relays the real coordinator's rewards routes: what it gets signed, the real one would accept.
    const relay = createHttpServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        fetch(new URL(req.url!, url), { method: req.method, headers: { 'content-type': 'application/json' }, body: req.method === 'POST' ? body : undefined }).then(
          async (r) => res.writeHead(r.status, { 'content-type': 'application/json' }).end(await r.text()),
          () => res.writeHead(502).end(),
        );
      });
    });
    await new Promise<void>((resolve) => relay.listen(0, '127.0.0.1', resolve));
    const relayUrl = `http://127.0.0.1:${(relay.address() as AddressInfo).port}`;
    try {
      const owner = wallet();
      const e = await settleTo(owner.address);
      const miner = await registeredMiner();
      let walletSigned = 0;
      let minerSigned = 0;
      const signRaw = async (message: string) => (walletSigned++, sign(owner, message));
      const signer = { publicKey: miner.publicKey, sign: (purpose: 'payout-link', payload: { message: string }) => (minerSigned++, miner.sign(purpose, payload)) };
      const nonces = async () => (await app.db.query<{ n: number }>('SELECT count(*)::int AS n FROM nonces WHERE address = $1 AND used_at IS NOT NULL', [owner.address]))[0]!.n;

      for (const attempt of [() => claimRewards(relayUrl, owner.address, signRaw), () => linkPayout(relayUrl, signer, owner.address, signRaw)]) {
        const refused = await attempt().catch((err: unknown) => err);
        expect(refused).toBeInstanceOf(RewardsApiError);
        expect((refused as RewardsApiError).code).toBe('WRONG_DOMAIN');
        expect((refused as RewardsApiError).message).toContain(domain);
      }
      expect([walletSigned, minerSigned]).toEqual([0, 0]);
      expect(await nonces()).toBe(0);
      expect(await ledgerOf(owner.address)).toMatchObject({ claimed: 0n, claims: 0 });
      expect(await currentLink(miner)).toBeUndefined();

      // Talking to the coordinator itself, the same calls sign and go through (its domain is its own address).
      expect(await linkPayout(url, signer, owner.address, signRaw)).toMatchObject({ minerId: miner.publicKey, address: owner.address });
      expect(await claimRewards(url, owner.address, signRaw)).toMatchObject({ address: owner.address, amount: paid(e, owner.address).toString() });
      expect([walletSigned, minerSigned]).toEqual([2, 1]);
    } finally {
      await new Promise((resolve) => relay.close(resolve));
    }
  });

  it('settles the epochs after a link to the linked wallet, which can then claim them', async () => {
    // Three miners, one pathway through the three stages, twelve verified microbatches: the validator's real settlement.
    const miners = [generateIdentity(), generateIdentity(), generateIdentity()];
    const ids = miners.map((m) => m.publicKey.slice(2));
    for (const [stage, m] of miners.entries()) {
      await app.db.query(`INSERT INTO miners (id, run_id, public_key, address, backend, tokens_per_sec, stage, status) VALUES ($1, $2, $3, $4, 'wasm', 1, $5, 'left')`, [
        ids[stage],
        runId,
        m.publicKey,
        m.address,
        stage,
      ]);
    }
    for (let n = 0; n < 12; n++) await recordMicrobatch(app.db, runId, ids, { loss: 4 - n * 0.01 });
    const gina = wallet();
    const message = await linkChallenge(miners[1]!, gina.address);
    expect((await post('/api/rewards/link', { message, signature: sign(gina, message), minerSignature: miners[1]!.sign('payout-link', { message }) })).status).toBe(200);

    const { settled } = await app.validator.settler.settle(0);
    expect(settled).toBe(true);
    const payouts = await app.db.query<{ account: string; amount: string; miners: string[] }>('SELECT account, amount::text, miners FROM payouts WHERE run_id = $1 AND epoch = 0 ORDER BY account', [runId]);
    expect(payouts.map((p) => p.account).sort()).toEqual([miners[0]!.address, gina.address, miners[2]!.address].sort());
    expect(payouts.find((p) => p.account === gina.address)!.miners).toEqual([ids[1]]);

    const { message: claim, parsed } = await claimChallenge(gina.address);
    expect(parsed.epochs).toEqual([{ runId, epoch: 0 }]);
    const res = await post('/api/rewards/claim', { message: claim, signature: sign(gina, claim) });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect((res.body.receipt as { amount: string }).amount).toBe(payouts.find((p) => p.account === gina.address)!.amount);
  });
});

describe('rewards: rate limits', () => {
  /** A claim message as this coordinator writes them, for a nonce it never issued: refused after its signature is checked. */
  const unissuedClaim = (address: string): string =>
    `Train at Home: claim rewards\ndomain: localhost\naddress: ${address}\namount: 1\nepochs: 1:0\nnonce: 0x${randomBytes(32).toString('hex')}\nexpires: 2030-01-01T00:00:00.000Z`;
  const unissuedLink = (minerId: string, address: string): string =>
    `Train at Home: link a payout address\ndomain: localhost\nminer: ${minerId}\naddress: ${address}\nnonce: 0x${randomBytes(32).toString('hex')}\nexpires: 2030-01-01T00:00:00.000Z`;
  const junkSignature = (): string => `0x${randomBytes(64).toString('hex')}`;

  it('a flood naming a victim’s address (junk signatures, unsigned challenges) from many IPs does not lock the victim out', async () => {
    // The coordinator's default limits: 60 a minute per IP and 20 per address, per route.
    const target = await start();
    try {
      const victim = wallet();
      const settled = await settleOn(target.app, victim.address);
      const miner = await registeredMiner(target.url);
      const statuses: string[] = [];
      const note = (r: Res) => statuses.push(`${r.status} ${r.body.error ?? ''}`.trim());
      // 30 of each, each from an IP of its own: 120 requests naming the victim's address.
      for (let i = 1; i <= 30; i++) {
        const ip = `203.0.113.${i}`;
        note(await post('/api/rewards/claim', { message: unissuedClaim(victim.address), signature: junkSignature() }, ip, target.app));
        note(await post('/api/rewards/link', { message: unissuedLink(miner.publicKey, victim.address), signature: junkSignature(), minerSignature: junkSignature() }, ip, target.app));
        note(await post('/api/rewards/challenge', { kind: 'claim', address: victim.address }, ip, target.app));
        note(await post('/api/rewards/challenge', { kind: 'link', minerId: miner.publicKey, address: victim.address }, ip, target.app));
      }
      // And one IP that keeps asking: its unsigned challenges are limited per IP.
      for (let i = 0; i < 61; i++) note(await post('/api/rewards/challenge', { kind: 'claim', address: victim.address }, '198.51.100.7', target.app));
      expect(statuses.filter((s) => s === '401 BAD_SIGNATURE')).toHaveLength(60);
      expect(statuses.filter((s) => s === '200')).toHaveLength(120);
      expect(statuses.filter((s) => s === '429 RATE_LIMITED')).toHaveLength(1);
      expect(statuses.at(-1)).toBe('429 RATE_LIMITED');

      // The victim, from its own IP: challenge, claim, link challenge and link all go through.
      const own = '192.0.2.1';
      const challenge = await post('/api/rewards/challenge', { kind: 'claim', address: victim.address }, own, target.app);
      expect(challenge.status, JSON.stringify(challenge.body)).toBe(200);
      const claimMessage = challenge.body.message as string;
      const claimed = await post('/api/rewards/claim', { message: claimMessage, signature: sign(victim, claimMessage) }, own, target.app);
      expect(claimed.status, JSON.stringify(claimed.body)).toBe(200);
      expect((claimed.body.receipt as { amount: string }).amount).toBe(paid(settled, victim.address).toString());
      const linkChallenge = await post('/api/rewards/challenge', { kind: 'link', minerId: miner.publicKey, address: victim.address }, own, target.app);
      expect(linkChallenge.status, JSON.stringify(linkChallenge.body)).toBe(200);
      const linkMessage = linkChallenge.body.message as string;
      const linked = await post(
        '/api/rewards/link',
        { message: linkMessage, signature: sign(victim, linkMessage), minerSignature: miner.sign('payout-link', { message: linkMessage }) },
        own,
        target.app,
      );
      expect(linked.status, JSON.stringify(linked.body)).toBe(200);
      expect(linked.body).toMatchObject({ minerId: miner.publicKey, address: victim.address });
    } finally {
      await target.app.close();
    }
  });

  it('answers 429 RATE_LIMITED with the time to wait, per IP, and per address for requests its wallet signed', async () => {
    const limited = await start({ rewards: { rateLimit: { perIp: { max: 3, timeWindowMs: 60_000 }, perAddress: { max: 2, timeWindowMs: 60_000 } } } });
    try {
      const owner = wallet();
      const a = owner.address;
      const challenge = (address: string, ip: string) => post('/api/rewards/challenge', { kind: 'claim', address }, ip, limited.app);
      const claim = (message: string, signature: string, ip: string) => post('/api/rewards/claim', { message, signature }, ip, limited.app);
      // Unsigned challenges and junk signatures prove nothing: they never count against the address.
      for (const ip of ['10.0.0.1', '10.0.0.2', '10.0.0.3', '10.0.0.4']) expect((await challenge(a, ip)).body.error).toBe('NOTHING_TO_CLAIM');
      for (const ip of ['10.0.1.1', '10.0.1.2', '10.0.1.3', '10.0.1.4']) expect((await claim(unissuedClaim(a), junkSignature(), ip)).body.error).toBe('BAD_SIGNATURE');
      // Claims the wallet signed count, from whatever IP: two, and the third waits.
      const signed = [unissuedClaim(a), unissuedClaim(a), unissuedClaim(a)];
      const answers = [];
      for (const [i, text] of signed.entries()) answers.push(await claim(text, sign(owner, text), `10.0.2.${i + 1}`));
      expect(answers.map((r) => r.body.error)).toEqual(['UNKNOWN_NONCE', 'UNKNOWN_NONCE', 'RATE_LIMITED']);
      const byAddress = answers[2]!;
      expect(byAddress.status).toBe(429);
      expect(byAddress.body.message).toMatch(/for this address/);
      const retryAfterMs = byAddress.body.retryAfterMs as number;
      expect(retryAfterMs).toBeGreaterThan(0);
      expect(retryAfterMs).toBeLessThanOrEqual(60_000);
      expect(Number(byAddress.headers['retry-after'])).toBe(Math.ceil(retryAfterMs / 1000));
      // Links count on their own, the same way: the miner's signature is not even needed for the count.
      const miner = await registeredMiner(limited.url);
      const links = [];
      for (let i = 0; i < 3; i++) {
        const text = unissuedLink(miner.publicKey, a);
        links.push((await post('/api/rewards/link', { message: text, signature: sign(owner, text), minerSignature: junkSignature() }, `10.0.3.${i}`, limited.app)).body.error);
      }
      expect(links).toEqual(['BAD_MINER_SIGNATURE', 'BAD_MINER_SIGNATURE', 'RATE_LIMITED']);
      // Per IP: three requests for three addresses, the fourth waits.
      const ip = '10.0.0.9';
      for (let i = 0; i < 3; i++) expect((await challenge(wallet().address, ip)).status).toBe(409);
      const byIp = await challenge(wallet().address, ip);
      expect([byIp.status, byIp.body.error]).toEqual([429, 'RATE_LIMITED']);
      expect(Number(byIp.headers['retry-after'])).toBeGreaterThan(0);
      // The read-only routes are not limited.
      for (let i = 0; i < 5; i++) expect((await call('GET', `/api/rewards/${a}`, undefined, ip, limited.app)).status).toBe(200);
    } finally {
      await limited.app.close();
    }
  });
});
