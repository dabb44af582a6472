import { payoutTree, splitEmission } from '@train-at-home/incentives';
import { generateIdentity } from '@train-at-home/protocol';
import type { Queryable } from '@train-at-home/server/db/database';
import { epochWindow } from '@train-at-home/server/ledger/epochs';
import type { SettlementInput } from '@train-at-home/server/ledger/settle';

/** A scored miner of a test epoch; `linked` pays it to an SS58 address, else to its miner id. */
export interface TestMiner {
  minerId: string;
  address: string;
}

export function testMiners(n: number): TestMiner[] {
  return Array.from({ length: n }, () => {
    const id = generateIdentity();
    return { minerId: id.publicKey.slice(2), address: id.address };
  });
}

/**
 * A settlement as the validator would build it: each miner's score is work × quality
 * (zero when flagged), scores are summed per account, the emission split with
 * splitEmission and proven with payoutTree.
 */
export function buildSettlement(
  runId: number,
  runStartMs: number,
  epochMs: number,
  epoch: number,
  emission: bigint,
  miners: Array<TestMiner & { work: number; quality: number; flagged?: boolean; stage?: number | null; linked?: boolean; account?: string }>,
): SettlementInput {
  const { startsAt, endsAt } = epochWindow(runStartMs, epochMs, epoch);
  const scores = miners.map((m, i) => {
    const flagged = m.flagged ?? false;
    const quality = flagged ? 0 : m.quality;
    return {
      minerId: m.minerId,
      stage: m.stage === undefined ? i % 3 : m.stage,
      account: m.account ?? (m.linked ? m.address : m.minerId),
      work: m.work,
      quality,
      score: m.work * quality,
      flagged,
      breakdown: { microbatches: m.work, clasp: quality, spotChecks: { passed: m.work, failed: flagged ? 1 : 0 } },
    };
  });
  const byAccount = new Map<string, { score: number; miners: string[] }>();
  for (const s of scores) {
    const a = byAccount.get(s.account) ?? { score: 0, miners: [] };
    a.score += s.score;
    if (s.score > 0) a.miners.push(s.minerId);
    byAccount.set(s.account, a);
  }
  const split = splitEmission(
    emission,
    [...byAccount].filter(([, a]) => a.score > 0).map(([account, a]) => ({ account, score: a.score })),
  );
  const paid = split.payouts.filter((p) => p.amount > 0n);
  const tree = paid.length > 0 ? payoutTree(paid) : undefined;
  return {
    runId,
    epoch,
    startsAt,
    endsAt,
    emission,
    allocated: split.allocated,
    scores,
    payouts: paid.map((p) => ({ account: p.account, amount: p.amount, miners: byAccount.get(p.account)!.miners, proof: tree!.proofs[p.account]! })),
    merkleRoot: tree?.root ?? null,
  };
}

/** Every ledger row of a run, as text, for before/after comparisons. */
// Raw SQL, read only: the ledger's own readers (settledEpochs, claimable, balance) answer with derived values, not every stored column.
export async function ledgerSnapshot(db: Queryable, runId: number): Promise<string> {
  const tables = await Promise.all(
    ['settlements', 'scores', 'payouts'].map((t) =>
      db.query(`SELECT to_jsonb(t)::text AS j FROM ${t} t WHERE run_id = $1 ORDER BY j`, [runId]).then((rows) => rows.map((r) => r.j)),
    ),
  );
  return JSON.stringify(tables);
}

/** How many ledger rows a run has, per table. */
// Raw SQL, read only: no ledger function counts a run's rows per table (settledEpochs lists settled epochs only).
export async function ledgerCounts(db: Queryable, runId: number, epoch?: number): Promise<{ settlements: number; scores: number; payouts: number }> {
  const [row] = await db.query<{ settlements: number; scores: number; payouts: number }>(
    `SELECT (SELECT count(*)::int FROM settlements WHERE run_id = $1 AND ($2::int IS NULL OR epoch = $2)) AS settlements,
            (SELECT count(*)::int FROM scores WHERE run_id = $1 AND ($2::int IS NULL OR epoch = $2)) AS scores,
            (SELECT count(*)::int FROM payouts WHERE run_id = $1 AND ($2::int IS NULL OR epoch = $2)) AS payouts`,
    [runId, epoch ?? null],
  );
  return row!;
}
