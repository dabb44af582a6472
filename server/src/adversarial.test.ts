import { verifyPayout } from '@train-at-home/incentives';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { App } from './app';
import { listeningCoordinator } from './test-miners';
import { CHEATS, type CheatName } from './testing/cheats';
import { MinerSwarm } from './testing/swarm';
import { verifiedWork } from './validator/accounting';

/**
 * The validator against cheaters, in a real run: 12 honest miners and one of
 * each kind of cheat (testing/cheats.ts) over 3 stages, in two miner
 * processes (real WebRTC between all of them), with the real coordinator and
 * the validator's own process. Epochs last EPOCH_MS and are settled
 * SETTLE_AFTER_MS after they end; every cheater must be flagged for the right
 * reason before the first is settled, and earn nothing in either, no honest
 * miner may be flagged, and the held-out loss must still fall.
 */
const EPOCH_MS = 60_000;
/** Evidence about an epoch's work keeps arriving after it ends: it is settled this much later. */
const SETTLE_AFTER_MS = 45_000;
const EMISSION = 1_000_000_000n;

let app: App;
let url: string;
const swarm = new MinerSwarm();

beforeAll(async () => {
  ({ app, url } = await listeningCoordinator({
    name: 'adversarial',
    preset: 'tiny',
    stages: 3,
    bottleneck: 32,
    training: { batchSize: 8, peakLr: 0.006, warmupSteps: 10, totalSteps: 600 },
    // Merges at least every 12 s: each is a moment every replica's weights are known (exact replays).
    merge: { every: 4, maxTrainingMs: 12_000, readyMs: 10_000, senderMs: 10_000, reducerMs: 5_000, roundMs: 30_000 },
    incentives: { epochMs: EPOCH_MS, settleAfterMs: SETTLE_AFTER_MS, emissionPerEpoch: EMISSION.toString(), spotCheckRate: 1, probeTimeoutMs: 15_000, windowEpochs: 2 },
  }));
});
afterAll(async () => {
  swarm.stop();
  await app?.close();
});

const get = async <T,>(path: string): Promise<T> => (await app.fastify.inject({ method: 'GET', url: path })).json() as T;

describe('the validator against cheaters', () => {
  it('flags every cheater for the right reason within two epochs, pays them nothing, never flags an honest miner, and the run still learns', async () => {
    // 19 miners register at once (the coordinator balances the stages: 7, 6, 6), then take their roles by stage.
    const miners = await swarm.start(url, [10, 9]);
    const byStage = [0, 1, 2].map((stage) => miners.filter((m) => m.stage === stage).map((m) => m.minerId).sort());
    expect(byStage.map((s) => s.length)).toEqual([7, 6, 6]);
    const roles = new Map<string, CheatName | null>(miners.map((m) => [m.minerId, null]));
    for (const [name, cheat] of Object.entries(CHEATS) as Array<[CheatName, (typeof CHEATS)[CheatName]]>) {
      roles.set(byStage[cheat.stage]!.find((id) => roles.get(id) === null)!, name);
    }
    await swarm.assign(Object.fromEntries([...roles].filter(([, c]) => c)) as Record<string, CheatName>);
    const honest = [...roles].filter(([, c]) => !c).map(([id]) => id);
    const cheaters = [...roles].filter(([, c]) => c) as Array<[string, CheatName]>;
    expect(honest.length).toBe(12);
    expect(cheaters.length).toBe(7);
    const role = (id: string): string => roles.get(id) ?? 'HONEST';

    // Two epochs settled (the run's clock started with the coordinator).
    const started = Date.now();
    let first: number | undefined;
    await expect
      .poll(
        async () => {
          first ??= (await app.validator.evaluate())?.heldOutLoss;
          const { epochs } = await get<{ epochs: Array<{ epoch: number }> }>('/api/epochs');
          const flags = await app.db.query<{ miner_id: string; kind: string }>('SELECT miner_id, kind FROM flags');
          const losses = (await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE name = 'train_loss'`))[0]!.n;
          console.log(
            `adversarial: ${Math.round((Date.now() - started) / 1000)} s, ${losses} microbatches, rounds ${JSON.stringify(app.coordinator.phases.status().map((s) => s.round))}, ` +
              `settled ${JSON.stringify(epochs.map((e) => e.epoch))}, spot checks ${JSON.stringify(app.validator.spotChecks.stats)}, flags ${JSON.stringify(flags.map((f) => `${role(f.miner_id)}:${f.kind}`))}`,
          );
          return epochs.length;
        },
        { timeout: 2 * EPOCH_MS + SETTLE_AFTER_MS + 120_000, interval: 10_000 },
      )
      .toBeGreaterThanOrEqual(2);

    const flags = await app.db.query<{ miner_id: string; kind: string; reason: string }>('SELECT miner_id, kind, reason FROM flags ORDER BY id');
    for (const f of flags) console.log(`adversarial: flag ${role(f.miner_id)}: ${f.kind}: ${f.reason}`);
    const checks = await app.db.query<{ miner_id: string; kind: string; passed: boolean }>('SELECT miner_id, kind, passed FROM spot_checks');
    for (const [id, name] of [...roles]) {
      const mine = checks.filter((c) => c.miner_id === id);
      console.log(`adversarial: ${name ?? 'honest'} (stage ${miners.find((m) => m.minerId === id)!.stage}): ${mine.filter((c) => c.passed).length} checks passed, ${mine.filter((c) => !c.passed).length} failed`);
    }
    // What an honest miner was flagged for, or failed, with the evidence (to find the cause if it ever happens).
    const honestFlags = await app.db.query<{ miner_id: string; kind: string; reason: string; evidence: unknown }>('SELECT miner_id, kind, reason, evidence FROM flags ORDER BY id');
    for (const f of honestFlags.filter((f) => honest.includes(f.miner_id))) console.log(`adversarial: HONEST FLAGGED ${f.miner_id.slice(0, 8)}: ${f.kind}: ${f.reason} ${JSON.stringify(f.evidence).slice(0, 1500)}`);
    const failed = await app.db.query<{ miner_id: string; kind: string; activation_id: string; reference_round: number; metrics: unknown; created_at: Date }>(
      'SELECT miner_id, kind, activation_id, reference_round, metrics, created_at FROM spot_checks WHERE NOT passed ORDER BY id',
    );
    for (const c of failed.filter((c) => honest.includes(c.miner_id)))
      console.log(`adversarial: HONEST FAILED ${c.miner_id.slice(0, 8)} ${c.kind} ${c.activation_id.slice(0, 8)} round ${c.reference_round} at ${c.created_at.toISOString()}: ${JSON.stringify(c.metrics)}`);
    // No honest miner is flagged, and none failed an exact replay.
    expect(flags.filter((f) => honest.includes(f.miner_id))).toEqual([]);
    expect(checks.filter((c) => honest.includes(c.miner_id) && !c.passed)).toEqual([]);
    // Every cheater is flagged, with the right reason among its flags.
    for (const [id, name] of cheaters) expect(flags.some((f) => f.miner_id === id && (CHEATS[name].flags as readonly string[]).includes(f.kind)), name).toBe(true);

    const paidOnce: string[] = [];
    for (const epoch of [0, 1]) {
      const settlement = await get<{
        startsAt: string;
        endsAt: string;
        merkleRoot: string;
        payouts: Array<{ account: string; amount: string; miners: string[]; proof: string[] }>;
        scores: Array<{ miner: string; score: number; work: number; flagged: boolean }>;
      }>(`/api/epochs/${epoch}`);
      // Payouts sum to the emission exactly, and each proof verifies against the epoch's root.
      expect(settlement.payouts.reduce((n, p) => n + BigInt(p.amount), 0n)).toBe(EMISSION);
      for (const p of settlement.payouts) expect(verifyPayout(settlement.merkleRoot, p.account, p.amount, p.proof)).toBe(true);
      // Cheaters earn nothing; every cheater with verified work in the epoch (the work accounting
      // recomputed here) is scored flagged, at zero. (A cheater caught at once, or whose payloads
      // repeat, as zeroed and stale outputs do, may have none.)
      const { work } = await verifiedWork(app.db, app.coordinator.runId, new Date(settlement.startsAt), new Date(settlement.endsAt));
      const payees = new Set(settlement.payouts.flatMap((p) => p.miners));
      const worked = cheaters.filter(([id]) => (work.get(id) ?? 0) > 0);
      for (const [id, name] of worked) expect(settlement.scores.find((s) => s.miner === id), `${name} in epoch ${epoch}`).toMatchObject({ flagged: true, score: 0 });
      for (const [id, name] of cheaters) expect(payees.has(id), `${name} paid in epoch ${epoch}`).toBe(false);
      console.log(`adversarial: epoch ${epoch}: cheaters with verified work ${JSON.stringify(worked.map(([, name]) => name))}`);
      // Cheaters worked in epoch 0 before they were caught: the checks above are not vacuous.
      if (epoch === 0) expect(worked.length).toBeGreaterThan(0);
      // Every honest miner with verified work in the epoch is paid for it. (How many had work in
      // epoch 0 depends on how fast the miners started on this machine: it begins with the coordinator.)
      const paid = honest.filter((id) => payees.has(id));
      const workedHonest = honest.filter((id) => (work.get(id) ?? 0) > 0);
      console.log(`adversarial: epoch ${epoch}: ${paid.length} of 12 honest miners paid, ${workedHonest.length} had verified work`);
      for (const id of workedHonest) expect(payees.has(id), `honest miner ${id.slice(0, 8)} (stage ${miners.find((m) => m.minerId === id)!.stage}) unpaid in epoch ${epoch}`).toBe(true);
      paidOnce.push(...paid);
    }
    // …and over the two epochs every honest miner was paid.
    expect(new Set(paidOnce).size).toBe(honest.length);
    // The run still learns.
    const last = await app.validator.evaluate();
    console.log(`adversarial: held-out ${first?.toFixed(3)} → ${last?.heldOutLoss.toFixed(3)} (bigram ${last?.bigramLoss.toFixed(3)})`);
    expect(last!.heldOutLoss).toBeLessThan(first!);
  }, 600_000);
});
