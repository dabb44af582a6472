import { randomBytes } from 'node:crypto';
import { generateIdentity, PROTOCOL_VERSION, type MergeGo } from '@train-at-home/protocol';
import { register, type Registration } from '@train-at-home/swarm';
import type { Socket } from 'socket.io-client';
import { afterEach, describe, expect, it } from 'vitest';
import { MAX_WAITING_REPORTS } from '../../src/activations';
import type { App } from '../../src/app';
import { MAX_POINTS } from '../../src/routes/status';
import { emitWithAck, hardeningHarness } from '@train-at-home/testkit/hardening-harness';

const hex = (bytes: number): string => randomBytes(bytes).toString('hex');
const receipt = (activationId: string, from: string, to: string, direction: 'activation' | 'gradient' = 'activation') => ({
  v: PROTOCOL_VERSION,
  epoch: 0,
  activationId,
  direction,
  from,
  to,
  bytes: 100,
  payloadHash: 'ab'.repeat(32),
});
const count = async (app: App, table: string): Promise<number> => (await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`))[0]!.n;

/**
 * Defect 8: what a registered miner could write had no bound (rows naming
 * invented miners and microbatches, a merge report with 100 disputes against
 * made-up ids and clipped 2147483648), and the lists came back whole.
 */
describe('what a registered miner can write, and what a list returns', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  async function miners(url: string, n: number): Promise<Array<{ socket: Socket; reg: Registration }>> {
    const out = [];
    for (let i = 0; i < n; i++) {
      const socket = await h.open(url);
      out.push({ socket, reg: await register(socket, generateIdentity(), { backend: 'wasm', tokensPerSec: 1 }) });
    }
    return out;
  }

  it('receipts and losses must name miners of the run, and reports waiting for their microbatch are capped', async () => {
    const { app, url } = await h.start('hardening-writes');
    const [a, b, owner] = await miners(url, 3);
    expect([a!.reg.stage, b!.reg.stage, owner!.reg.stage]).toEqual([0, 1, 2]);
    const stranger = hex(32);
    // The other end of a transfer that is no miner of this run: refused, nothing stored, nothing announced.
    expect(await emitWithAck(a!.socket, 'receipt', receipt(hex(16), a!.reg.minerId, stranger))).toMatchObject({ ok: false, error: { code: 'UNKNOWN_PEER' } });
    // A loss whose pathway names invented miners.
    const loss = { v: PROTOCOL_VERSION, epoch: 0, activationId: hex(16), pathway: [stranger, hex(32), owner!.reg.minerId], loss: 3 };
    expect(await emitWithAck(owner!.socket, 'loss', loss)).toMatchObject({ ok: false, error: { code: 'UNKNOWN_PEER' } });
    expect(await count(app, 'receipts')).toBe(0);
    expect(await count(app, 'metrics')).toBe(0);

    // Receipts for microbatches nobody announced wait for the announcement; only so many at once.
    // (Their refusals, 10 s later, also disconnect the miner as a sender of bad messages.)
    for (let i = 0; i < MAX_WAITING_REPORTS; i++) b!.socket.emit('receipt', receipt(hex(16), a!.reg.minerId, b!.reg.minerId), () => {});
    await expect.poll(() => app.coordinator.activations.waiting(b!.reg.minerId)).toBe(true);
    await new Promise((r) => setTimeout(r, 300));
    const over = await emitWithAck(b!.socket, 'receipt', receipt(hex(16), a!.reg.minerId, b!.reg.minerId));
    expect(over).toMatchObject({ ok: false, error: { code: 'RATE_LIMITED' } });
    // Each waiting one is refused and recorded once its wait is over; the one over the cap never was.
    await expect.poll(() => count(app, 'refused_receipts'), { timeout: 20_000 }).toBe(MAX_WAITING_REPORTS);
    await new Promise((r) => setTimeout(r, 500));
    expect(await count(app, 'refused_receipts')).toBe(MAX_WAITING_REPORTS);
    expect(await count(app, 'receipts')).toBe(0);
  }, 60_000);

  it('a merge report is bounded by its round: made-up disputes and an absurd clipped count are refused, and nothing of it is stored', async () => {
    // A run of 2 stages whose stages merge once each replica has one verified microbatch.
    const { app: run, url: runUrl } = await h.start('hardening-merge', undefined, { run: { stages: 2, merge: { every: 1 } } });
    const [a0, b0, a1, b1] = await miners(runUrl, 4);
    expect([a0, b0, a1, b1].map((m) => m!.reg.stage)).toEqual([0, 1, 0, 1]);
    const gos: MergeGo[] = [];
    for (const m of [a0!, a1!]) {
      m.socket.on('merge', (s: { stage: number; round: number }) =>
        m.socket.emit('merge-ready', { v: PROTOCOL_VERSION, stage: s.stage, round: s.round, stateId: 'cd'.repeat(32), microbatches: 1, weightsHash: 'cd'.repeat(32), optimizerHash: 'cd'.repeat(32), contributionRoots: { outer: 'cd'.repeat(32), average: 'cd'.repeat(32) } }, () => {}),
      );
      m.socket.on('merge-go', (g: MergeGo) => gos.push(g));
    }
    // Each stage-0 replica sends one microbatch to a stage-1 miner, and both ends confirm it.
    for (const [from, to] of [[a0!, b0!], [a1!, b1!]] as const) {
      const id = hex(16);
      expect(await emitWithAck(from.socket, 'receipt', receipt(id, from.reg.minerId, to.reg.minerId))).toEqual({ ok: true });
      expect(await emitWithAck(to.socket, 'receipt', receipt(id, from.reg.minerId, to.reg.minerId))).toEqual({ ok: true });
    }
    await expect.poll(() => gos.length, { timeout: 15_000 }).toBeGreaterThanOrEqual(1);
    const go = gos[0]!;
    expect(go.stage).toBe(0);
    const base = { v: PROTOCOL_VERSION, stage: 0, round: go.round, ok: true, hash: 'ef'.repeat(32) };
    const madeUp = Array.from({ length: 100 }, (_, i) => ({ partition: i % 2, owners: [hex(32), hex(32)], hashes: ['01'.repeat(32), '02'.repeat(32)], liar: undefined }));
    expect(await emitWithAck(a0!.socket, 'merged', { ...base, clipped: 0, evidence: madeUp.map(({ liar: _l, ...e }) => e) })).toMatchObject({ ok: false, error: { code: 'OUT_OF_BOUNDS' } });
    expect(await emitWithAck(a0!.socket, 'merged', { ...base, clipped: 2147483648, evidence: [] })).toMatchObject({ ok: false, error: { code: 'OUT_OF_BOUNDS' } });
    expect(await emitWithAck(a0!.socket, 'merged', { ...base, clipped: 5, evidence: [] })).toMatchObject({ ok: false, error: { code: 'OUT_OF_BOUNDS' } });
    // Refused slices name another participant, on a partition the reporter owns, each once.
    // (From its partner: each refusal counts toward a connection's limit of bad messages.)
    for (const refused of [[{ partition: 0, from: a1!.reg.minerId }], [{ partition: 0, from: hex(32) }], [{ partition: 2, from: a0!.reg.minerId }], [0, 0].map(() => ({ partition: 1, from: a0!.reg.minerId }))]) {
      expect(await emitWithAck(a1!.socket, 'merged', { ...base, clipped: 0, evidence: [], refused })).toMatchObject({ ok: false, error: { code: 'OUT_OF_BOUNDS' } });
    }
    // Clipped contributions named: no more than it counted.
    expect(await emitWithAck(a1!.socket, 'merged', { ...base, clipped: 0, evidence: [], clippedFrom: [{ partition: 0, from: a0!.reg.minerId }] })).toMatchObject({ ok: false, error: { code: 'OUT_OF_BOUNDS' } });
    expect(await count(run, 'merge_events')).toBe(0);
    // The replica's true report is still taken (the refusals changed nothing), and so is its partner's. It says it
    // refused its partner's slice: one owner's word, recorded, flags nobody.
    expect(await emitWithAck(a0!.socket, 'merged', { ...base, clipped: 4, evidence: [], refused: [{ partition: 1, from: a1!.reg.minerId }] })).toEqual({ ok: true });
    expect(await emitWithAck(a1!.socket, 'merged', { ...base, clipped: 0, evidence: [] })).toEqual({ ok: true });
    await expect.poll(async () => (await run.db.query<{ clipped: Record<string, number> | null }>('SELECT clipped FROM epochs WHERE stage = 0 AND epoch = $1', [go.round]))[0]?.clipped).toEqual({
      [a0!.reg.minerId]: 4,
      [a1!.reg.minerId]: 0,
    });
    expect(await run.db.query('SELECT kind, miner_id, reporter FROM merge_events')).toEqual([{ kind: 'commitment-mismatch', miner_id: a1!.reg.minerId, reporter: a0!.reg.minerId }]);
    expect(await count(run, 'flags')).toBe(0);
  }, 60_000);

  it('pages every list: metrics, merges and checkpoints, each row once, with a cursor', async () => {
    const { app } = await h.start('hardening-pages');
    const runId = app.coordinator.runId;
    await app.db.query(`INSERT INTO metrics (run_id, epoch, name, value) SELECT $1, 0, 'train_loss', 5 - g / 1000.0 FROM generate_series(1, 1200) g`, [runId]);
    await app.db.query(`INSERT INTO epochs (run_id, stage, epoch, phase) SELECT $1, g % 3, g / 3, 'training' FROM generate_series(3, 602) g`, [runId]);
    const get = async (url: string) => {
      const res = await app.fastify.inject({ method: 'GET', url });
      expect(res.statusCode, url).toBe(200);
      return res.json();
    };
    expect((await get('/api/metrics')).counts).toEqual({ trainLoss: 1200, heldOutLoss: 0 });
    const ids: number[] = [];
    for (let after: number | null = 0, pages = 0; after !== null; pages++) {
      const body = await get(`/api/metrics/train_loss?limit=500${after ? `&after=${after}` : ''}`);
      expect(body.points.length).toBeLessThanOrEqual(500);
      ids.push(...body.points.map((p: { id: number }) => p.id));
      after = body.nextAfter;
      expect(pages).toBeLessThan(5);
    }
    expect(ids.length).toBe(1200);
    expect(new Set(ids).size).toBe(1200);
    expect([...ids].sort((x, y) => x - y)).toEqual(ids);
    // Without a limit: the default page, never the whole table.
    expect((await get('/api/metrics/train_loss')).points.length).toBe(1000);

    const rounds: string[] = [];
    for (let after: string | null = null; ; ) {
      const body = await get(`/api/merges?limit=250${after ? `&after=${after}` : ''}`);
      rounds.push(...body.rounds.map((r: { round: number; stage: number }) => `${r.round}:${r.stage}`));
      after = body.nextAfter;
      if (after === null) break;
    }
    expect(rounds.length).toBe(600);
    expect(new Set(rounds).size).toBe(600);
    expect((await get('/api/merges')).rounds.length).toBe(500);
    expect((await get('/api/checkpoints?limit=1')).checkpoints).toEqual([]);

    for (const bad of ['/api/metrics/train_loss?limit=0', `/api/metrics/train_loss?limit=${MAX_POINTS + 1}`, '/api/metrics/train_loss?after=-1', '/api/merges?after=1', '/api/merges?eventsAfter=x', '/api/checkpoints?before=9:x']) {
      const res = await app.fastify.inject({ method: 'GET', url: bad });
      expect([res.statusCode, res.json().error], bad).toEqual([400, 'BAD_REQUEST']);
    }
    expect((await app.fastify.inject({ method: 'GET', url: '/api/metrics/passwords' })).json().error).toBe('NO_SUCH_SERIES');
  });
});
