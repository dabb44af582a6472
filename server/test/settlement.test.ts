import { verifyPayout } from '@train-at-home/incentives';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { openDatabase } from '../src/db/database';
import { testDatabase } from '@train-at-home/testkit/database';
import { runStartMs } from '../src/ledger/queries';
import { LedgerError, settledEpochs, settleEpoch, type SettlementInput } from '../src/ledger/settle';
import { buildSettlement, ledgerCounts, ledgerSnapshot, testMiners, type TestMiner } from '@train-at-home/testkit/settlements';

let app: App;
let database: Awaited<ReturnType<typeof testDatabase>>;
let runId: number;
let startMs: number;
let epochMs: number;
let miners: TestMiner[];

beforeEach(async () => {
  database = await testDatabase();
  app = await buildApp({ database, run: { name: 'ledger', preset: 'tiny', stages: 3, bottleneck: 32 } });
  runId = app.coordinator.runId;
  startMs = await runStartMs(app.db, runId);
  epochMs = app.coordinator.run.incentives.epochMs;
  miners = testMiners(7);
});
afterEach(() => app?.close());

/** An epoch of the seven miners: uneven work and quality, one flagged, two paid to linked addresses. */
function epochOf(epoch: number, emission: bigint): SettlementInput {
  return buildSettlement(
    runId,
    startMs,
    epochMs,
    epoch,
    emission,
    miners.map((m, i) => ({ ...m, work: 3 + ((i * 7 + epoch) % 11), quality: [1, 0.9, 0.35, 0.8, 0.61, 1, 0.123][i]!, flagged: i === 4, linked: i % 3 === 0 })),
  );
}

async function rejected(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(LedgerError);
    return (e as LedgerError).code;
  }
  return 'accepted';
}

describe('ledger: settling an epoch', () => {
  it('stores payouts that sum to each epoch’s emission exactly, in SQL (numeric) and in bigint', async () => {
    // Emissions that do not divide evenly, one past 2^53 (a float would lose units), one near int8's top.
    const emissions = [1_000_000_000n, 1_000_000_007n, 9_007_199_254_740_993n, 4_611_686_018_427_387_903n];
    for (const [epoch, emission] of emissions.entries()) {
      const input = epochOf(epoch, emission);
      expect(input.allocated).toBe(emission);
      expect(await settleEpoch(app.db, input)).toEqual({ settled: true });
    }
    expect(await settledEpochs(app.db, runId)).toEqual([0, 1, 2, 3]);
    const sums = await app.db.query<{ epoch: number; emission: string; allocated: string; paid: string; n: number }>(
      `SELECT s.epoch, s.emission::numeric::text AS emission, s.allocated::numeric::text AS allocated,
              (SELECT sum(p.amount::numeric)::text FROM payouts p WHERE p.run_id = s.run_id AND p.epoch = s.epoch) AS paid,
              (SELECT count(*)::int FROM payouts p WHERE p.run_id = s.run_id AND p.epoch = s.epoch) AS n
       FROM settlements s WHERE s.run_id = $1 ORDER BY s.epoch`,
      [runId],
    );
    expect(sums.map((r) => [r.epoch, r.emission, r.allocated, r.paid])).toEqual(emissions.map((e, i) => [i, e.toString(), e.toString(), e.toString()]));
    expect(sums.every((r) => r.n === 6)).toBe(true); // seven miners, one flagged
    for (const [epoch, emission] of emissions.entries()) {
      const rows = await app.db.query<{ amount: string }>('SELECT amount::text AS amount FROM payouts WHERE run_id = $1 AND epoch = $2', [runId, epoch]);
      expect(rows.reduce((sum, r) => sum + BigInt(r.amount), 0n)).toBe(emission);
    }
    // The flagged miner is scored (quality 0) and paid nothing.
    const [flagged] = await app.db.query<{ quality: number; score: number; paid: number }>(
      `SELECT quality, score, (SELECT count(*)::int FROM payouts p WHERE p.run_id = s.run_id AND p.miners @> jsonb_build_array(s.miner_id)) AS paid
       FROM scores s WHERE run_id = $1 AND miner_id = $2 AND epoch = 0`,
      [runId, miners[4]!.minerId],
    );
    expect(flagged).toEqual({ quality: 0, score: 0, paid: 0 });
  });

  it('settles an epoch in which nobody earned: no payouts, no root, nothing allocated', async () => {
    const input = buildSettlement(runId, startMs, epochMs, 0, 1_000_000_000n, miners.slice(0, 2).map((m) => ({ ...m, work: 5, quality: 1, flagged: true })));
    expect(input.payouts).toEqual([]);
    expect(await settleEpoch(app.db, input)).toEqual({ settled: true });
    const [s] = await app.db.query<{ allocated: string; merkle_root: string | null }>('SELECT allocated::text, merkle_root FROM settlements WHERE run_id = $1', [runId]);
    expect(s).toEqual({ allocated: '0', merkle_root: null });
    expect(await ledgerCounts(app.db, runId)).toEqual({ settlements: 1, scores: 2, payouts: 0 });
  });

  it('settles an epoch once: a second call changes nothing and says so', async () => {
    const input = epochOf(0, 1_000_000_000n);
    expect(await settleEpoch(app.db, input)).toEqual({ settled: true });
    const before = await ledgerSnapshot(app.db, runId);
    expect(await settleEpoch(app.db, input)).toEqual({ settled: false });
    // Even with other figures: the epoch's money has moved already.
    expect(await settleEpoch(app.db, epochOf(0, 5_000_000_000n))).toEqual({ settled: false });
    expect(await ledgerSnapshot(app.db, runId)).toBe(before);
    expect(await ledgerCounts(app.db, runId)).toEqual({ settlements: 1, scores: 7, payouts: 6 });
  });

  it('lets exactly one of 20 concurrent calls settle an epoch', async () => {
    const input = epochOf(3, 1_000_000_007n);
    const results = await Promise.all(Array.from({ length: 20 }, () => settleEpoch(app.db, input)));
    expect(results.filter((r) => r.settled)).toHaveLength(1);
    expect(results.filter((r) => !r.settled)).toHaveLength(19);
    expect(await ledgerCounts(app.db, runId)).toEqual({ settlements: 1, scores: 7, payouts: 6 });
    const [sum] = await app.db.query<{ paid: string }>('SELECT sum(amount)::text AS paid FROM payouts WHERE run_id = $1', [runId]);
    expect(sum!.paid).toBe('1000000007');
  });

  it('makes a call that races an open settlement wait for it: settled: false if it commits, settled if it rolls back', async () => {
    for (const [epoch, outcome] of [
      [5, 'commits'],
      [6, 'rolls back'],
    ] as const) {
      const input = epochOf(epoch, 1_000_000_000n);
      let release!: () => void;
      const gate = new Promise<void>((resolve) => (release = resolve));
      let holding!: () => void;
      const held = new Promise<void>((resolve) => (holding = resolve));
      // The first call stops inside its transaction, its settlement row written but not committed.
      const first = settleEpoch(app.db, input, {
        afterRow: async (n) => {
          if (n !== 1) return;
          holding();
          await gate;
          if (outcome === 'rolls back') throw new Error('rolled back');
        },
      }).then(
        (r) => r,
        (e: Error) => e.message,
      );
      await held;
      const second = settleEpoch(app.db, input);
      if (app.db.kind === 'postgres') {
        // Proof of a real race: the second transaction waits on the first's row of the primary key.
        await expect.poll(async () => (await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`))[0]!.n).toBe(1);
      } else {
        await new Promise((resolve) => setTimeout(resolve, 100)); // PGlite: it waits for the one connection
      }
      release();
      if (outcome === 'commits') expect([await first, await second]).toEqual([{ settled: true }, { settled: false }]);
      else expect([await first, await second]).toEqual(['rolled back', { settled: true }]);
      expect(await ledgerCounts(app.db, runId, epoch)).toEqual({ settlements: 1, scores: 7, payouts: 6 });
    }
  });

  it.skipIf(!process.env.TAH_TEST_DATABASE_URL)('reports settled: false, not an error, to a racing twin under SERIALIZABLE too (PostgreSQL)', async () => {
    // An operator may make every transaction SERIALIZABLE; the loser then gets a serialization failure.
    const url = new URL(database.url!);
    url.searchParams.set('options', '-c default_transaction_isolation=serializable');
    const strict = await openDatabase({ url: url.toString() });
    try {
      const [{ level }] = (await strict.query<{ level: string }>("SELECT current_setting('transaction_isolation') AS level")) as [{ level: string }];
      expect(level).toBe('serializable');
      const input = epochOf(7, 1_000_000_000n);
      let release!: () => void;
      const gate = new Promise<void>((resolve) => (release = resolve));
      let holding!: () => void;
      const held = new Promise<void>((resolve) => (holding = resolve));
      const first = settleEpoch(strict, input, { afterRow: async (n) => (n === 1 ? (holding(), gate) : undefined) });
      await held;
      const second = settleEpoch(strict, input);
      await expect.poll(async () => (await strict.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`))[0]!.n).toBe(1);
      release();
      expect([await first, await second]).toEqual([{ settled: true }, { settled: false }]);
      expect(await ledgerCounts(app.db, runId, 7)).toEqual({ settlements: 1, scores: 7, payouts: 6 });
    } finally {
      await strict.close();
    }
  });

  it('leaves nothing behind when it fails after the second payout row, and settles once afterwards', async () => {
    const input = epochOf(1, 1_000_000_000n);
    const written: number[] = [];
    const crash = new Error('the coordinator died mid-settlement');
    await expect(
      settleEpoch(app.db, input, {
        afterRow: (n) => {
          written.push(n);
          if (n === 2) throw crash;
        },
      }),
    ).rejects.toBe(crash);
    expect(written).toEqual([1, 2]);
    expect(await ledgerCounts(app.db, runId)).toEqual({ settlements: 0, scores: 0, payouts: 0 });
    expect(await settledEpochs(app.db, runId)).toEqual([]);
    // An async fault as well (the hook may await).
    await expect(settleEpoch(app.db, input, { afterRow: async (n) => (n === 2 ? Promise.reject(crash) : undefined) })).rejects.toBe(crash);
    expect(await ledgerCounts(app.db, runId)).toEqual({ settlements: 0, scores: 0, payouts: 0 });
    const again = await Promise.all([settleEpoch(app.db, input), settleEpoch(app.db, input)]);
    expect(again.map((r) => r.settled).sort()).toEqual([false, true]);
    expect(await ledgerCounts(app.db, runId)).toEqual({ settlements: 1, scores: 7, payouts: 6 });
  });

  it('rejects an inconsistent settlement by name and writes nothing', async () => {
    const good = epochOf(2, 1_000_000_000n);
    const [first, second] = good.payouts as [SettlementInput['payouts'][0], SettlementInput['payouts'][0]];
    const rest = good.payouts.slice(1);
    // [what is wrong, the input, a fragment of the error's message: each is rejected for its own reason]
    const variants: Array<[string, SettlementInput, string]> = [
      ['sum above allocated', { ...good, payouts: [{ ...first, amount: first.amount + 1n }, ...rest] }, 'not the allocated'],
      ['sum below allocated', { ...good, payouts: [{ ...first, amount: first.amount - 1n }, ...rest] }, 'not the allocated'],
      ['sum above the emission', { ...good, emission: good.allocated! - 1n }, 'more than the emission'],
      ['sum above the emission, no allocated given', { ...good, allocated: undefined, payouts: [{ ...first, amount: first.amount + 1n }, ...rest] }, 'more than the emission'],
      ['a negative amount', { ...good, payouts: [{ ...first, amount: -first.amount }, ...rest] }, 'not a positive bigint'],
      ['a zero amount', { ...good, payouts: [{ ...first, amount: 0n }, ...rest], allocated: good.allocated! - first.amount }, 'not a positive bigint'],
      ['an amount that is a float', { ...good, payouts: [{ ...first, amount: Number(first.amount) as unknown as bigint }, ...rest] }, 'not a positive bigint'],
      ['a duplicate account', { ...good, payouts: [...good.payouts, { ...first }] }, 'paid twice'],
      ['a duplicate scored miner', { ...good, scores: [...good.scores, good.scores[0]!] }, 'scored twice'],
      ['a proof that is not hex32', { ...good, payouts: [{ ...first, proof: ['0x1234'] }, ...rest] }, '32-byte hex'],
      ['a proof that is not an array', { ...good, payouts: [{ ...first, proof: 'nope' as unknown as string[] }, ...rest] }, '32-byte hex'],
      ['a proof of another payout', { ...good, payouts: [{ ...first, proof: second.proof }, { ...second, proof: first.proof }, ...good.payouts.slice(2)] }, 'does not verify'],
      ['a root of other payouts', { ...good, merkleRoot: epochOf(2, 2_000_000_000n).merkleRoot }, 'not the root of these payouts'],
      ['no root with payouts', { ...good, merkleRoot: null }, 'Merkle root null'],
      ['a root without payouts', { ...good, payouts: [], allocated: 0n }, 'root without payouts'],
      ['a payout naming an unscored miner', { ...good, payouts: [{ ...first, miners: ['ab'.repeat(32)] }, ...rest] }, 'not scored with that account'],
      ['a payout naming no miner', { ...good, payouts: [{ ...first, miners: [] }, ...rest] }, 'names no miners'],
      ['a flagged miner with a score', { ...good, scores: good.scores.map((s) => (s.flagged ? { ...s, score: 1 } : s)) }, 'is flagged but'],
      ['quality above 1', { ...good, scores: good.scores.map((s, i) => (i === 0 ? { ...s, quality: 1.5 } : s)) }, 'not in [0, 1]'],
      ['a bad account', { ...good, scores: good.scores.map((s, i) => (i === 1 ? { ...s, account: 'robert; drop table payouts' } : s)) }, 'account robert'],
      ['a negative epoch', { ...good, epoch: -1 }, 'epoch -1'],
      ['an epoch past int4', { ...good, epoch: 2 ** 31 }, 'epoch 2147483648'],
      ['an epoch that ends before it starts', { ...good, endsAt: good.startsAt }, 'start before it ends'],
      ['an emission past int8', { ...good, emission: 2n ** 63n }, 'emission 9223372036854775808'],
    ];
    for (const [what, input, because] of variants) {
      const error = await settleEpoch(app.db, input).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error, what).toBeInstanceOf(LedgerError);
      expect((error as LedgerError).code, what).toBe('BAD_SETTLEMENT');
      expect((error as LedgerError).message, what).toContain(because);
    }
    expect(await rejected(settleEpoch(app.db, { ...good, runId: runId + 1000 }))).toBe('NO_SUCH_RUN');
    expect(await ledgerCounts(app.db, runId)).toEqual({ settlements: 0, scores: 0, payouts: 0 });
    expect(await settleEpoch(app.db, good)).toEqual({ settled: true });
  });

  it('stores proofs that verify against the stored root, and a tampered proof or amount does not', async () => {
    await settleEpoch(app.db, epochOf(0, 1_000_000_007n));
    const [{ merkle_root: root }] = (await app.db.query<{ merkle_root: string }>('SELECT merkle_root FROM settlements WHERE run_id = $1 AND epoch = 0', [runId])) as [
      { merkle_root: string },
    ];
    const rows = await app.db.query<{ account: string; amount: string; proof: string[] }>('SELECT account, amount::text AS amount, proof FROM payouts WHERE run_id = $1 AND epoch = 0', [runId]);
    expect(rows).toHaveLength(6);
    for (const { account, amount, proof } of rows) {
      expect(verifyPayout(root, account, BigInt(amount), proof), account).toBe(true);
      expect(verifyPayout(root, account, BigInt(amount) + 1n, proof)).toBe(false);
      expect(verifyPayout(root, account, BigInt(amount) - 1n, proof)).toBe(false);
      const flipped = proof.map((h, i) => (i === 0 ? h.slice(0, -1) + (h.endsWith('0') ? '1' : '0') : h));
      expect(verifyPayout(root, account, BigInt(amount), flipped)).toBe(false);
      expect(verifyPayout(root, account, BigInt(amount), proof.slice(1))).toBe(false);
      const other = rows.find((r) => r.account !== account)!;
      expect(verifyPayout(root, other.account, BigInt(amount), proof)).toBe(false);
    }
  });
});
