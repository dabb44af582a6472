import { PROTOCOL_VERSION } from '@train-at-home/protocol';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { simHarness } from '@train-at-home/testkit/sim-harness';
import { simMiners, type SimMiner } from '@train-at-home/testkit/sim-miners';

const h = simHarness();
afterEach(() => h.close());

/** What the phase machine once recomputed every second from every receipt: verified microbatches per active miner of a stage in [from, to). */
async function recount(stage: number, from: Date, to: Date): Promise<Record<string, number>> {
  const rows = await h.app!.db.query<{ id: string; n: number }>(
    `WITH verified AS (
       SELECT activation_id, from_miner, to_miner FROM receipts
       WHERE run_id = $1 AND direction = 'activation' AND created_at >= $2 AND created_at < $3
       GROUP BY activation_id, from_miner, to_miner
       HAVING count(*) = 2 AND count(DISTINCT (bytes, payload_hash)) = 1)
     SELECT m.id, count(v.activation_id)::int AS n FROM miners m
     LEFT JOIN verified v ON (m.stage > 0 AND v.to_miner = m.id) OR (m.stage = 0 AND v.from_miner = m.id)
     WHERE m.run_id = $1 AND m.status = 'active' AND m.stage = $4
     GROUP BY m.id`,
    [h.app!.coordinator.runId, from, to, stage],
  );
  return Object.fromEntries(rows.map((r) => [r.id, r.n]));
}

const receipt = (by: SimMiner, activationId: string, direction: 'activation' | 'gradient', from: SimMiner, to: SimMiner, hash: string) =>
  new Promise<{ ok: boolean; error?: { code: string } }>((resolve) =>
    by.socket.emit('receipt', { v: PROTOCOL_VERSION, epoch: 0, activationId, direction, from: from.minerId, to: to.minerId, bytes: 1000, payloadHash: hash }, resolve),
  );

describe('verified work', () => {
  it('is counted as each transfer’s second receipt comes in, the same as recounting every receipt: one-sided and disputed transfers count for nobody', async () => {
    // No merge while the test runs: it compares the counters of one window.
    const url = await h.start('verified-work', 3, { run: { merge: { every: 1_000_000, maxTrainingMs: 3_600_000 } } });
    const app = h.app!;
    h.miners.push(...(await simMiners(url, 5, 1)));
    const at = (s: number): SimMiner[] => h.miners.filter((m) => m.stage === s);
    expect([0, 1, 2].map((s) => at(s).length)).toEqual([2, 2, 1]);
    const [a1, a2] = at(0) as [SimMiner, SimMiner];
    const [b1, b2] = at(1) as [SimMiner, SimMiner];
    const [c] = at(2) as [SimMiner];
    const hash = (): string => randomBytes(32).toString('hex');
    const oks: boolean[] = [];
    const both = async (id: string, from: SimMiner, to: SimMiner, o: { disputed?: boolean; oneSided?: boolean } = {}): Promise<void> => {
      const h1 = hash();
      // Both ends at once: the pair is counted once however their handlers interleave.
      const replies = await Promise.all([receipt(from, id, 'activation', from, to, h1), ...(o.oneSided ? [] : [receipt(to, id, 'activation', from, to, o.disputed ? hash() : h1)])]);
      oks.push(...replies.map((r) => r.ok));
    };
    const pathways: Array<[SimMiner, SimMiner, { disputed?: boolean; oneSided?: boolean }?]> = [
      [a1, b1],
      [a1, b1],
      [a2, b2],
      [a1, b2, { disputed: true }],
      [a2, b1, { oneSided: true }],
      [a2, b2],
      [a1, b1],
    ];
    for (const [[a, b, o], k] of pathways.map((p, k) => [p, k] as const)) {
      const id = randomBytes(16).toString('hex');
      await both(id, a, b, o);
      // Onward to the last stage; the fourth and sixth microbatches' second hop is one-sided and disputed.
      await both(id, b, c, k === 3 ? { oneSided: true } : k === 5 ? { disputed: true } : {});
      // Gradients back are not work of this kind.
      await receipt(c, id, 'gradient', c, b, hash());
    }
    expect(oks.every(Boolean)).toBe(true);
    const since = new Date(0);
    const now = new Date(Date.now() + 1000);
    const counted = await Promise.all([0, 1, 2].map((s) => app.coordinator.phases.workSinceMerge(s)));
    const recounted = await Promise.all([0, 1, 2].map((s) => recount(s, since, now)));
    expect(counted).toEqual(recounted);
    expect(counted[0]).toEqual({ [a1.minerId]: 3, [a2.minerId]: 2 });
    expect(counted[1]).toEqual({ [b1.minerId]: 3, [b2.minerId]: 2 });
    expect(counted[2]).toEqual({ [c.minerId]: 5 });
  });
});
