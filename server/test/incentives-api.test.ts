import { verifyPayout } from '@train-at-home/incentives';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { epochAt, epochWindow } from '../src/ledger/epochs';
import { runStartMs } from '../src/ledger/queries';
import { settleEpoch, type SettlementInput } from '../src/ledger/settle';
import { buildSettlement, testMiners, type TestMiner } from '@train-at-home/testkit/settlements';
import { incentiveRoutes } from '../src/routes/incentives';

let app: App;
let runId: number;
let startMs: number;
let epochMs: number;
let miners: TestMiner[];
const settled: SettlementInput[] = [];

const get = async (url: string) => {
  const res = await app.fastify.inject({ method: 'GET', url });
  return { status: res.statusCode, body: res.json() };
};

beforeAll(async () => {
  app = await buildApp({ database: await testDatabase(), run: { name: 'ledger', preset: 'tiny', stages: 3, bottleneck: 32 } });
  // app.ts registers the plugin once the validator lands; until then the test does.
  if (!app.fastify.hasRoute({ method: 'GET', url: '/api/epochs' })) await app.fastify.register(incentiveRoutes, { coordinator: app.coordinator });
  runId = app.coordinator.runId;
  startMs = await runStartMs(app.db, runId);
  epochMs = app.coordinator.run.incentives.epochMs;
  miners = testMiners(5);
  // Miner 3 is caught in epoch 1; its flags are evidence the leaderboard and its score page show.
  await app.db.query(`INSERT INTO flags (run_id, miner_id, kind, reason, evidence) VALUES ($1, $2, 'spot-check', 'forward output differs from the replay', '{"activationId": "a1"}')`, [
    runId,
    miners[3]!.minerId,
  ]);
  await app.db.query(`INSERT INTO flags (run_id, miner_id, kind, reason, evidence) VALUES ($1, $2, 'clasp', 'pathways through it lose 0.4 nats more', '{"z": 4.1}')`, [
    runId,
    miners[3]!.minerId,
  ]);
  // Epochs 0, 1, 2 and 4 settled (3 not yet); miner 1 is paid to its linked address.
  for (const epoch of [0, 1, 2, 4]) {
    const input = buildSettlement(
      runId,
      startMs,
      epochMs,
      epoch,
      BigInt(1_000_000_000 + epoch),
      miners.map((m, i) => ({ ...m, work: 10 + i + epoch, quality: 1 - i / 10, flagged: i === 3 && epoch === 1, linked: i === 1 })),
    );
    await settleEpoch(app.db, input);
    settled.push(input);
  }
});
afterAll(() => app?.close());

describe('incentives API', () => {
  it('lists settled epochs newest first, by pages, with the current epoch from the run’s clock', async () => {
    const first = await get('/api/epochs?limit=3');
    expect(first.status).toBe(200);
    const now = epochAt(startMs, epochMs, Date.now());
    const window = epochWindow(startMs, epochMs, now);
    expect(first.body.current).toEqual({ epoch: now, startsAt: window.startsAt.toISOString(), endsAt: window.endsAt.toISOString() });
    expect(first.body.emissionPerEpoch).toBe('1000000000');
    expect(first.body.epochs.map((e: { epoch: number }) => e.epoch)).toEqual([4, 2, 1]);
    expect(first.body.nextBefore).toBe(1);
    const input = settled[3]!;
    expect(first.body.epochs[0]).toMatchObject({
      epoch: 4,
      startsAt: input.startsAt.toISOString(),
      endsAt: input.endsAt.toISOString(),
      emission: '1000000004',
      allocated: input.allocated!.toString(),
      merkleRoot: input.merkleRoot,
      payoutCount: input.payouts.length,
    });
    expect(Date.parse(first.body.epochs[0].settledAt)).toBeGreaterThan(0);
    const second = await get(`/api/epochs?limit=3&before=${first.body.nextBefore}`);
    expect(second.body.epochs.map((e: { epoch: number }) => e.epoch)).toEqual([0]);
    expect(second.body.nextBefore).toBeNull();
    expect((await get('/api/epochs')).body.epochs).toHaveLength(4);
  });

  it('returns an epoch’s settlement with its payouts and scores as stored, by pages', async () => {
    const input = settled[1]!;
    const all = await get('/api/epochs/1?limit=500');
    expect(all.status).toBe(200);
    expect(all.body).toMatchObject({ epoch: 1, emission: '1000000001', allocated: '1000000001', merkleRoot: input.merkleRoot, leafEncoding: ['string', 'uint256'] });
    const payouts = [...input.payouts].sort((a, b) => (a.account < b.account ? -1 : 1));
    expect(all.body.payouts).toEqual(payouts.map((p) => ({ account: p.account, amount: p.amount.toString(), miners: p.miners, proof: p.proof })));
    expect(all.body.payouts.reduce((s: bigint, p: { amount: string }) => s + BigInt(p.amount), 0n)).toBe(1_000_000_001n);
    const scores = [...input.scores].sort((a, b) => (a.minerId < b.minerId ? -1 : 1));
    expect(all.body.scores).toEqual(
      scores.map((s) => ({ miner: s.minerId, stage: s.stage, account: s.account, work: s.work, quality: s.quality, score: s.score, flagged: s.flagged, breakdown: s.breakdown })),
    );
    expect(all.body).toMatchObject({ payoutCount: 4, scoreCount: 5, nextPayoutsAfter: null, nextScoresAfter: null });
    // Two at a time: every row once, in order.
    const seenPayouts: string[] = [];
    for (let url = '/api/epochs/1?limit=2'; ; ) {
      const { body } = await get(url);
      seenPayouts.push(...body.payouts.map((p: { account: string }) => p.account));
      if (body.nextPayoutsAfter === null) break;
      url = `/api/epochs/1?limit=2&payoutsAfter=${body.nextPayoutsAfter}`;
    }
    const seenScores: string[] = [];
    for (let url = '/api/epochs/1?limit=2'; ; ) {
      const { body } = await get(url);
      seenScores.push(...body.scores.map((s: { miner: string }) => s.miner));
      if (body.nextScoresAfter === null) break;
      url = `/api/epochs/1?limit=2&scoresAfter=${body.nextScoresAfter}`;
    }
    expect(seenPayouts).toEqual(payouts.map((p) => p.account));
    expect(seenScores).toEqual(scores.map((s) => s.minerId));
  });

  it('serves each payout with what anyone needs to verify it against the epoch’s root', async () => {
    for (const input of settled) {
      for (const p of input.payouts) {
        const { status, body } = await get(`/api/epochs/${input.epoch}/payouts/${p.account}`);
        expect(status).toBe(200);
        expect(body).toEqual({ epoch: input.epoch, account: p.account, amount: p.amount.toString(), miners: p.miners, proof: p.proof, merkleRoot: input.merkleRoot, leafEncoding: ['string', 'uint256'] });
        expect(verifyPayout(body.merkleRoot, body.account, BigInt(body.amount), body.proof)).toBe(true);
      }
    }
    // Miner 3 was flagged in epoch 1: no payout to it there.
    expect((await get(`/api/epochs/1/payouts/${miners[3]!.minerId}`)).body.error).toBe('NO_SUCH_PAYOUT');
    expect((await get(`/api/epochs/3/payouts/${miners[0]!.minerId}`)).body.error).toBe('NO_SUCH_EPOCH');
    // The linked address is the account; the miner id of that miner is not paid.
    expect((await get(`/api/epochs/0/payouts/${miners[1]!.address}`)).status).toBe(200);
    expect((await get(`/api/epochs/0/payouts/${miners[1]!.minerId}`)).status).toBe(404);
  });

  it('shows a miner its scores, what its account was paid, its flags and totals, by pages', async () => {
    const m = miners[3]!;
    const paidTo = (input: SettlementInput) => input.payouts.find((p) => p.miners.includes(m.minerId))?.amount ?? 0n;
    const earned = settled.reduce((s, input) => s + paidTo(input), 0n);
    const { status, body } = await get(`/api/miners/${m.minerId}/score?limit=2`);
    expect(status).toBe(200);
    expect(body.totals).toEqual({ earned: earned.toString(), epochs: 4, flags: 2 });
    expect(body.epochs.map((e: { epoch: number }) => e.epoch)).toEqual([4, 2]);
    expect(body.nextBefore).toBe(2);
    const rest = (await get(`/api/miners/${m.minerId}/score?limit=2&before=2`)).body;
    expect(rest.epochs.map((e: { epoch: number; paid: string; flagged: boolean }) => [e.epoch, e.paid, e.flagged])).toEqual([
      [1, '0', true],
      [0, paidTo(settled[0]!).toString(), false],
    ]);
    expect(rest.nextBefore).toBeNull();
    const scored = settled[0]!.scores.find((s) => s.minerId === m.minerId)!;
    expect(rest.epochs[1]).toMatchObject({ stage: scored.stage, account: m.minerId, work: scored.work, quality: scored.quality, score: scored.score, breakdown: scored.breakdown });
    // Flags newest first, one page at a time.
    expect(body.flags.map((f: { kind: string }) => f.kind)).toEqual(['clasp', 'spot-check']);
    const one = (await get(`/api/miners/${m.minerId}/score?limit=1`)).body;
    expect(one.flags).toHaveLength(1);
    expect(one.flags[0]).toMatchObject({ kind: 'clasp', reason: 'pathways through it lose 0.4 nats more', evidence: { z: 4.1 } });
    const older = (await get(`/api/miners/${m.minerId}/score?limit=1&flagsBefore=${one.nextFlagsBefore}`)).body;
    expect(older.flags.map((f: { kind: string }) => f.kind)).toEqual(['spot-check']);
    expect(older.nextFlagsBefore).toBeNull();
    // Paid to a linked address: earnings are still this miner's.
    const linked = (await get(`/api/miners/${miners[1]!.minerId}/score`)).body;
    expect(linked.totals.earned).toBe(settled.reduce((s, input) => s + input.payouts.find((p) => p.account === miners[1]!.address)!.amount, 0n).toString());
    expect((await get(`/api/miners/${'0'.repeat(64)}/score`)).status).toBe(404);
  });

  it('ranks the latest settled epoch’s miners by score, with flag kinds and shares', async () => {
    const { status, body } = await get('/api/leaderboard');
    expect(status).toBe(200);
    const input = settled[3]!;
    expect(body).toMatchObject({ epoch: 4, emission: '1000000004', allocated: input.allocated!.toString(), emissionPerEpoch: '1000000000', minerCount: 5, nextAfter: null });
    const expected = [...input.scores].sort((a, b) => b.score - a.score || (a.minerId < b.minerId ? -1 : 1));
    expect(body.rows.map((r: { miner: string }) => r.miner)).toEqual(expected.map((s) => s.minerId));
    expect(body.rows.map((r: { rank: number }) => r.rank)).toEqual([1, 2, 3, 4, 5]);
    const total = expected.reduce((s, r) => s + r.score, 0);
    for (const [i, r] of (body.rows as Array<{ share: number; score: number; flagKinds: string[]; miner: string }>).entries()) {
      expect(r.score).toBe(expected[i]!.score);
      expect(r.share).toBeCloseTo(expected[i]!.score / total, 12);
      // The flags were raised before epoch 4's evidence window (epochs 2…4) opened.
      expect(r.flagKinds).toEqual([]);
    }
    const page1 = (await get('/api/leaderboard?limit=2&epoch=1')).body;
    expect(page1.epoch).toBe(1);
    expect(page1.rows.map((r: { rank: number }) => r.rank)).toEqual([1, 2]);
    const page2 = (await get(`/api/leaderboard?limit=2&epoch=1&after=${page1.nextAfter}`)).body;
    const page3 = (await get(`/api/leaderboard?limit=2&epoch=1&after=${page2.nextAfter}`)).body;
    expect(page3.nextAfter).toBeNull();
    const flagged = [...page1.rows, ...page2.rows, ...page3.rows];
    expect(flagged.map((r: { rank: number }) => r.rank)).toEqual([1, 2, 3, 4, 5]);
    expect(flagged[4]).toMatchObject({ miner: miners[3]!.minerId, score: 0, flagged: true, share: 0, flagKinds: ['clasp', 'spot-check'] });
    expect(flagged.slice(0, 4).every((r: { flagKinds: string[] }) => r.flagKinds.length === 0)).toBe(true);
    expect((await get('/api/leaderboard?epoch=3')).body.error).toBe('NO_SUCH_EPOCH');
  });

  it('answers bad parameters with 400 and unknown ones with 404, never a 500', async () => {
    const badRequests = [
      '/api/epochs/2147483648',
      '/api/epochs/1e10',
      '/api/epochs/-1',
      '/api/epochs/abc',
      '/api/epochs/1.5',
      '/api/epochs/01',
      '/api/epochs/0x1',
      '/api/epochs/%20',
      '/api/epochs/99999999999999999999',
      '/api/miners/zz/score',
      `/api/miners/${'A'.repeat(64)}/score`,
      `/api/miners/${'0'.repeat(63)}/score`,
      '/api/epochs?limit=0',
      '/api/epochs?limit=501',
      '/api/epochs?limit=-5',
      '/api/epochs?limit=abc',
      '/api/epochs?limit=1&limit=2',
      '/api/epochs?before=2147483648',
      '/api/epochs?before=1e3',
      '/api/epochs/0?payoutsAfter=%27%3B%20drop%20table%20payouts',
      '/api/epochs/0?scoresAfter=zz',
      '/api/epochs/0/payouts/not-an-account',
      `/api/epochs/0/payouts/${'0'.repeat(64)}x`,
      '/api/epochs/1e10/payouts/abc',
      `/api/miners/${miners[0]!.minerId}/score?flagsBefore=-1`,
      `/api/miners/${miners[0]!.minerId}/score?before=x`,
      '/api/leaderboard?epoch=-1',
      '/api/leaderboard?after=abc',
      '/api/leaderboard?limit=100000000000',
    ];
    for (const url of badRequests) {
      const { status, body } = await get(url);
      expect([status, body.error], url).toEqual([400, 'BAD_REQUEST']);
      expect(typeof body.message, url).toBe('string');
    }
    const notFound = ['/api/epochs/3', '/api/epochs/2147483647', `/api/epochs/2147483647/payouts/${miners[0]!.minerId}`, `/api/miners/${'f'.repeat(64)}/score`, '/api/leaderboard?epoch=2147483647'];
    for (const url of notFound) expect((await get(url)).status, url).toBe(404);
    // Limits at their bounds are fine.
    expect((await get('/api/epochs?limit=500&before=0')).body).toMatchObject({ epochs: [], nextBefore: null });
    expect((await get('/api/epochs?limit=1&before=2147483647')).status).toBe(200);
  });
});
