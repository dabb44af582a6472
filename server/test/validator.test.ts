import { verifyPayout } from '@train-at-home/incentives';
import { generateIdentity, PROTOCOL_VERSION } from '@train-at-home/protocol';
import { CoordinatorError, register, request } from '@train-at-home/swarm';
import { randomBytes } from 'node:crypto';
import { io as connect, type Socket } from 'socket.io-client';
import { afterEach, describe, expect, it, onTestFinished } from 'vitest';
import type { App } from '../src/app';
import { listeningCoordinator } from '@train-at-home/testkit/miner-processes';
import { recordMicrobatch } from '@train-at-home/testkit/work';

let app: App | undefined;
const sockets: Socket[] = [];
afterEach(async () => {
  sockets.splice(0).forEach((s) => s.disconnect());
  await app?.close();
  app = undefined;
});

const EMISSION = 1_000_000_007n; // prime: the split always has a remainder to place

/**
 * Work as the pipeline records it, written straight to the database: each
 * microbatch crossed every boundary both ways, each transfer confirmed by
 * both ends, and the last stage reported a loss with the pathway. No round of
 * it was trained or committed, so the runs that settle it draw no audits
 * (auditRate 0): where a round is drawn, only replicas that committed it are
 * paid for it (jobs/accounting.ts, accounting.test.ts).
 */
async function seedWork(a: App, pathways: string[][], perPathway: number, at?: Date): Promise<void> {
  for (const id of new Set(pathways.flat())) {
    await a.db.query(`INSERT INTO miners (id, run_id, public_key, address, backend, tokens_per_sec, stage, status) VALUES ($1, $2, $3, $4, 'wasm', 1, $5, 'active')`, [
      id,
      a.coordinator.runId,
      `0x${id}`,
      generateIdentity(Buffer.from(id, 'hex')).address,
      pathways.find((p) => p.includes(id))!.indexOf(id),
    ]);
  }
  for (const pathway of pathways) {
    for (let n = 0; n < perPathway; n++) await recordMicrobatch(a.db, a.coordinator.runId, pathway, { loss: 4 - n * 0.01 + Math.random() * 0.05, round: Math.floor(n / 5), at });
  }
}

const ids = (n: number): string[] => Array.from({ length: n }, () => randomBytes(32).toString('hex'));

describe('the validator process', () => {
  it('runs outside the coordinator, and a validator killed mid-settlement leaves every epoch settled exactly once', async () => {
    ({ app } = await listeningCoordinator({ name: 'settle-kill', preset: 'tiny', stages: 3, bottleneck: 32, incentives: { epochMs: 4_000, settleAfterMs: 1_000, auditRate: 0, emissionPerEpoch: EMISSION.toString() } }));
    const [a, b, c, d, e, f] = ids(6);
    await seedWork(app, [[a!, c!, e!], [b!, d!, f!], [a!, d!, f!], [b!, c!, e!]], 12);
    // Kill the validator the moment it is handed each of the first two scoring jobs.
    let killed = 0;
    app.validator.process.onJob = (kind) => {
      if (kind === 'score' && killed < 2) {
        killed++;
        app!.validator.process.kill();
      }
    };
    await expect.poll(async () => (await app!.db.query('SELECT epoch FROM settlements')).length, { timeout: 90_000, interval: 500 }).toBeGreaterThanOrEqual(2);
    expect(killed).toBe(2);
    expect(app.validator.process.starts).toBeGreaterThanOrEqual(3);
    // The time it spent scoring is counted (the operator's status line reads it), the jobs cut short by a kill included.
    expect(app.validator.process.busyMs.score).toBeGreaterThan(0);
    expect(app.validator.process.pid).not.toBe(process.pid);

    const settlements = await app.db.query<{ epoch: number; emission: string; allocated: string; merkle_root: string | null }>(
      'SELECT epoch, emission::text, allocated::text, merkle_root FROM settlements ORDER BY epoch',
    );
    // Each epoch once, in order from 0; the seeded work fell in epoch 0 and is paid exactly the emission.
    expect(settlements.map((s) => s.epoch)).toEqual(settlements.map((_, i) => i));
    const payouts = await app.db.query<{ epoch: number; account: string; amount: string; proof: string[] }>('SELECT epoch, account, amount::text, proof FROM payouts ORDER BY epoch, account');
    const first = payouts.filter((p) => p.epoch === 0);
    expect(first.length).toBe(6);
    expect(first.reduce((n, p) => n + BigInt(p.amount), 0n)).toBe(EMISSION);
    expect(settlements[0]!.allocated).toBe(EMISSION.toString());
    for (const p of first) expect(verifyPayout(settlements[0]!.merkle_root!, p.account, p.amount, p.proof)).toBe(true);
    // Later epochs had no work: settled with nothing allocated.
    expect(settlements.slice(1).every((s) => s.allocated === '0' && s.merkle_root === null)).toBe(true);

    // Settling epoch 0 again changes nothing (later epochs keep settling meanwhile: its rows alone are compared).
    const snapshot = async (): Promise<string> =>
      JSON.stringify(await Promise.all(['settlements', 'scores', 'payouts'].map((t) => app!.db.query(`SELECT * FROM ${t} WHERE epoch = 0 ORDER BY 1, 2, 3`))));
    const before = await snapshot();
    expect((await app.validator.settler.settle(0)).settled).toBe(false);
    expect(await snapshot()).toBe(before);
  });

  it('holds an epoch for its window: a miner flagged after the epoch ended, before its window did, earns nothing in it', async () => {
    const EPOCH = 10_000;
    const SETTLE = 1_000;
    ({ app } = await listeningCoordinator({
      name: 'settle-hold',
      preset: 'tiny',
      stages: 3,
      bottleneck: 32,
      incentives: { epochMs: EPOCH, settleAfterMs: SETTLE, holdEpochs: 1, auditRate: 0, emissionPerEpoch: EMISSION.toString() },
    }));
    const start = await app.validator.settler.start();
    const [a, b, c, d, e, f] = ids(6);
    // The work falls in epoch 0 (its time is set, not taken from a clock that a loaded machine may have moved on),
    // and the epoch says when it may settle: after epoch 1 (its window) ended, and SETTLE more.
    await seedWork(app, [[a!, c!, e!], [b!, d!, f!], [a!, d!, f!], [b!, c!, e!]], 12, new Date(start + 1));
    const listed = (await app.fastify.inject({ method: 'GET', url: '/api/epochs' })).json();
    expect(listed).toMatchObject({ holdEpochs: 1, settleAfterMs: SETTLE, nextSettlement: { epoch: 0, notBefore: new Date(start + 2 * EPOCH + SETTLE).toISOString() } });
    // Past the time it would settle without a window (its end and SETTLE), it is still open…
    await new Promise((r) => setTimeout(r, start + EPOCH + SETTLE + 2_000 - Date.now()));
    expect(await app.db.query('SELECT epoch FROM settlements')).toEqual([]);
    // …so a miner caught now, in epoch 1 (an audit of one of its rounds failed), forfeits epoch 0 too.
    await app.coordinator.flags.raise(a!, 'AUDIT_FAILED', 'a round of epoch 1 did not replay (test)', { round: 1 });
    // (The flag as stored fell in epoch 1, before epoch 0's window ended: the case this test is about.)
    const [flag] = await app.db.query<{ at: Date }>('SELECT created_at AS at FROM flags WHERE miner_id = $1', [a!]);
    expect(flag!.at.getTime()).toBeGreaterThanOrEqual(start + EPOCH);
    expect(flag!.at.getTime()).toBeLessThan(start + 2 * EPOCH);
    // (The validator process scores it: on two busy cores its start alone can take tens of seconds.)
    await expect
      .poll(async () => (await app!.db.query('SELECT epoch FROM settlements WHERE epoch = 0')).length, { timeout: 90_000, interval: 250 })
      .toBe(1);
    const [settled] = await app.db.query<{ settled_at: Date }>('SELECT settled_at FROM settlements WHERE epoch = 0');
    expect(settled!.settled_at.getTime()).toBeGreaterThanOrEqual(start + 2 * EPOCH + SETTLE);
    const epoch0 = (await app.fastify.inject({ method: 'GET', url: '/api/epochs/0' })).json();
    expect(epoch0.scores.find((s: { miner: string }) => s.miner === a)).toMatchObject({ flagged: true, score: 0 });
    expect(epoch0.payouts.flatMap((p: { miners: string[] }) => p.miners).sort()).toEqual([b, c, d, e, f].sort());
    expect(epoch0.payouts.reduce((n: bigint, p: { amount: string }) => n + BigInt(p.amount), 0n)).toBe(EMISSION);
  });

  it('refuses malformed and non-finite losses, reports of microbatches that never existed, and probe replies for probes never sent, by name; none reach the ledger', async () => {
    ({ app } = await listeningCoordinator({ name: 'validator-input', preset: 'tiny', stages: 3, bottleneck: 32 }));
    const url = `http://127.0.0.1:${(app.fastify.server.address() as { port: number }).port}`;
    const open = async (): Promise<Socket> => {
      const s = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
      sockets.push(s);
      await new Promise<void>((r) => s.once('connect', () => r()));
      return s;
    };
    const rejection = async (p: Promise<unknown>): Promise<string> => p.then(() => 'accepted', (e: unknown) => (e instanceof CoordinatorError ? e.code : String(e)));
    const miners: Array<{ socket: Socket; minerId: string; stage: number }> = [];
    for (let i = 0; i < 3; i++) {
      const socket = await open();
      miners.push({ socket, ...(await register(socket, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 })) });
    }
    const [s0, s1, s2] = [0, 1, 2].map((stage) => miners.find((m) => m.stage === stage)!);
    const pathway = [s0!.minerId, s1!.minerId, s2!.minerId];
    const snapshot = async (): Promise<string> =>
      JSON.stringify(await Promise.all(['metrics', 'receipts', 'spot_checks', 'flags', 'settlements', 'payouts'].map((t) => app!.db.query(`SELECT * FROM ${t} ORDER BY 1`))));
    const before = await snapshot();
    const loss = (value: unknown, activationId = randomBytes(16).toString('hex')) => ({ v: PROTOCOL_VERSION, epoch: 0, activationId, pathway, loss: value });
    // Non-finite numbers do not survive JSON: NaN and Infinity arrive as null. Malformed ones fail the schema.
    // (Five rejections a connection: the sixth, below, is answered and then the connection is closed.)
    for (const bad of [NaN, Infinity, -1, '3.2']) expect(await rejection(request(s2!.socket, 'loss', loss(bad))), String(bad)).toBe('SCHEMA');
    expect(await rejection(request(s2!.socket, 'loss', { ...loss(3), epoch: 2 ** 31 }))).toBe('SCHEMA');
    // Well formed, but no stage-0 miner ever sent that microbatch.
    const [unknownLoss, unknownReceipt] = await Promise.all([
      rejection(request(s2!.socket, 'loss', loss(3.2), 20_000)),
      rejection(request(s1!.socket, 'receipt', { v: 1, epoch: 0, activationId: randomBytes(16).toString('hex'), direction: 'activation', from: s0!.minerId, to: s1!.minerId, bytes: 10, payloadHash: 'ab'.repeat(32) }, 20_000)),
    ]);
    expect([unknownLoss, unknownReceipt]).toEqual(['UNKNOWN_ACTIVATION', 'UNKNOWN_ACTIVATION']);
    // A probe reply for a probe never sent.
    const probe = (id: string, headers: Record<string, string> = { 'x-miner-id': s1!.minerId }) =>
      app!.fastify.inject({ method: 'PUT', url: `/api/probes/${id}`, headers: { 'content-type': 'application/octet-stream', ...headers }, payload: Buffer.alloc(64) });
    const never = await probe(randomBytes(16).toString('hex'));
    expect([never.statusCode, never.json().error]).toEqual([404, 'NO_SUCH_PROBE']);
    expect((await probe('..%2F..%2Fetc')).statusCode).toBe(404);
    expect((await probe(randomBytes(16).toString('hex'), {})).json().error).toBe('SCHEMA');
    expect(await snapshot()).toBe(before);
  });
  it('flags a miner that confirms transfers its peers never saw, and not an honest pair that moved a microbatch whose announcement was lost', async () => {
    ({ app } = await listeningCoordinator({ name: 'validator-forgery', preset: 'tiny', stages: 3, bottleneck: 32, incentives: { forgeryRecheckMs: 300 } }));
    const url = `http://127.0.0.1:${(app.fastify.server.address() as { port: number }).port}`;
    const miners: Array<{ socket: Socket; minerId: string; stage: number }> = [];
    for (let i = 0; i < 6; i++) {
      const socket = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
      sockets.push(socket);
      await new Promise<void>((r) => socket.once('connect', () => r()));
      miners.push({ socket, ...(await register(socket, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 })) });
    }
    // They keep sending heartbeats (a silent miner is dropped, and a departed peer takes no blame).
    let seq = 0;
    const beat = setInterval(() => miners.forEach((m) => m.socket.emit('heartbeat', { v: PROTOCOL_VERSION, seq: seq++ })), 1000);
    onTestFinished(() => clearInterval(beat));
    const [s0, s1, s2] = [0, 1, 2].map((stage) => miners.filter((m) => m.stage === stage));
    const code = async (p: Promise<unknown>): Promise<string> => p.then(() => 'accepted', (e: unknown) => (e instanceof CoordinatorError ? e.code : String(e)));
    const receipt = (m: { socket: Socket }, activationId: string, from: string, to: string) =>
      code(request(m.socket, 'receipt', { v: PROTOCOL_VERSION, epoch: 0, activationId, direction: 'activation', from, to, bytes: 10, payloadHash: 'ab'.repeat(32) }, 20_000));
    // An honest pair (stage 1 → stage 2) moved three microbatches whose maker's announcements never
    // came: both ends confirm each transfer, both are refused, neither is blamed. A forger on stage 1
    // confirms transfers from a stage-0 miner that it never made; the same microbatch twice counts once.
    const [sender, receiver, forger, victim] = [s1![0]!, s2![0]!, s1![1]!, s0![0]!];
    const honest = Array.from({ length: 3 }, () => randomBytes(16).toString('hex'));
    const forged = Array.from({ length: 3 }, () => randomBytes(16).toString('hex'));
    const answers = await Promise.all([
      ...honest.flatMap((id) => [receipt(sender, id, sender.minerId, receiver.minerId), receipt(receiver, id, sender.minerId, receiver.minerId)]),
      receipt(forger, forged[0]!, victim.minerId, forger.minerId),
      receipt(forger, forged[1]!, victim.minerId, forger.minerId),
      receipt(forger, forged[0]!, victim.minerId, forger.minerId),
    ]);
    expect(new Set(answers)).toEqual(new Set(['UNKNOWN_ACTIVATION']));
    // Two distinct forged microbatches so far (each rechecked 300 ms later): not yet a flag.
    await new Promise((r) => setTimeout(r, 1500));
    expect(await app.db.query('SELECT miner_id FROM flags')).toEqual([]);
    expect(await receipt(forger, forged[2]!, victim.minerId, forger.minerId)).toBe('UNKNOWN_ACTIVATION');
    await expect
      .poll(async () => (await app!.db.query<{ miner_id: string; kind: string }>('SELECT miner_id, kind FROM flags')).map((f) => [f.miner_id, f.kind]), { timeout: 5000 })
      .toEqual([[forger.minerId, 'FORGED_RECEIPTS']]);
    expect(await app.db.query('SELECT * FROM receipts')).toEqual([]);
  }, 60_000);
});
