/**
 * npm run bench:audit — does any cheat pay? Whole-round audits against every
 * cheat of testkit/src/cheats.ts, in real swarm runs.
 *
 * Each run is the adversarial test's setup (server/test/adversarial.test.ts):
 * 12 honest miners and one of each cheat over 3 stages of `tiny`, in three
 * miner processes over WebRTC, the coordinator with PGlite here and the
 * validator in its own process, audits drawn at AUDIT_RATE; epochs of
 * EPOCH_MS settled SETTLE_AFTER_MS after the second one after it ends (earnings
 * held for the default window of three epochs) once its rounds' audits are done. RUNS runs with different
 * run seeds (weights, data windows). Per cheat and run: flagged for the
 * expected reason, in how many epochs from the one it began working (and so
 * cheating) in (1 = that same epoch; 26 miner processes on a small machine
 * take a while to start, so this is also given from the run's first epoch),
 * and what it earned over the run against the average honest miner. False positives:
 * honest miners flagged, over all honest miner-rounds audited. Cost: the
 * validator's seconds per audited round against a miner's own compute
 * seconds for a round.
 *
 *   npm run bench:audit            # 3 runs
 *   RUNS=1 npm run bench:audit     # one (stated in the output)
 */
import { initNodeBackend } from '@train-at-home/model/node';
import { listeningCoordinator } from '@train-at-home/testkit/coordinator';
import { CHEATS, type CheatName } from '@train-at-home/testkit/cheats';
import { MinerSwarm } from '@train-at-home/testkit/swarm';
import { finish, machine } from './lib';
import { bytesPerToken, printBytesPerToken, readTraffic } from './traffic';
import { DEFAULT_INCENTIVES } from '../server/src/run-config';

const EPOCH_MS = 60_000;
const SETTLE_AFTER_MS = 45_000;
const EPOCHS = 3;
const AUDIT_RATE = 0.5;
/** The run's default window (run-config.ts, holdEpochs): each epoch's earnings wait for the audits of the two epochs after it. */
const HOLD_EPOCHS = DEFAULT_INCENTIVES.holdEpochs;
const RUNS = Number(process.env.RUNS ?? 3);
const backend = await initNodeBackend();

interface RunResult {
  seed: number;
  /** What each miner (honest and cheating) moved per token it trained over the run, by kind. */
  traffic: ReturnType<typeof bytesPerToken>;
  detection: Array<{
    attack: CheatName;
    detected: boolean;
    flags: string[];
    epochsToDetect: number | null;
    flaggedInEpoch: number | null;
    firstWorkEpoch: number | null;
    earningsRatio: number;
    paidInEpochs: number[];
    flaggedAtS: number | null;
    rounds: Array<[number, number, number | null, string | null, number | null]>;
  }>;
  honest: number;
  honestFlagged: number;
  honestRoundsAudited: number;
  audits: { drawn: number; passed: number; failed: number; unanswered: number; skipped: number; validatorMs: number; replayedOps: number };
  minerComputeSecondsPerRound: number;
  /** Mean wall time of a closed merge round (training, merge), over every stage. */
  roundSeconds: number;
  wallS: number;
}

async function run(seed: number): Promise<RunResult> {
  const { app, url } = await listeningCoordinator({
    name: `bench-audit-${seed}`,
    preset: 'tiny',
    stages: 3,
    bottleneck: 32,
    seed,
    training: { batchSize: 8, peakLr: 0.006, warmupSteps: 10, totalSteps: 600 },
    merge: { every: 16, maxTrainingMs: 20_000, readyMs: 10_000, senderMs: 10_000, reducerMs: 5_000, roundMs: 30_000 },
    incentives: { epochMs: EPOCH_MS, settleAfterMs: SETTLE_AFTER_MS, emissionPerEpoch: '1000000000', spotCheckRate: 0.2, probeTimeoutMs: 15_000, windowEpochs: 2, holdEpochs: HOLD_EPOCHS, auditRate: AUDIT_RATE, auditTimeoutMs: 40_000 },
  });
  const swarm = new MinerSwarm();
  const started = Date.now();
  const cheats = Object.keys(CHEATS) as CheatName[];
  const miners = await swarm.start(url, [9, 9, 8]);
  const byStage = [0, 1, 2].map((stage) => miners.filter((m) => m.stage === stage).map((m) => m.minerId).sort());
  const roles = new Map<string, CheatName | null>(miners.map((m) => [m.minerId, null]));
  for (const name of cheats) roles.set(byStage[CHEATS[name].stage]!.find((id) => roles.get(id) === null)!, name);
  await swarm.assign(Object.fromEntries([...roles].filter(([, c]) => c)) as Record<string, CheatName>);
  const [{ ms: runStart }] = (await app.db.query<{ ms: string }>(`SELECT floor(extract(epoch FROM created_at) * 1000)::text AS ms FROM runs WHERE id = $1`, [app.coordinator.runId])).map((r) => ({ ms: Number(r.ms) }));
  while ((await app.db.query('SELECT 1 FROM settlements')).length < EPOCHS) {
    await new Promise((r) => setTimeout(r, 10_000));
    console.log(`audit seed ${seed}: ${Math.round((Date.now() - started) / 1000)} s, rounds ${JSON.stringify(app.coordinator.phases.status().map((s) => s.round))}, audits ${JSON.stringify(app.validator.audits.stats)}`);
    // Settlement waits for the audits of every round with work in an epoch (server/src/jobs/settlement.ts).
    if (Date.now() - started > (EPOCHS + HOLD_EPOCHS + 8) * EPOCH_MS + SETTLE_AFTER_MS) throw new Error('epochs were not settled in time');
  }
  const stats = await swarm.stats();
  const flags = await app.db.query<{ miner_id: string; kind: string; reason: string; created_at: Date }>('SELECT miner_id, kind, reason, created_at FROM flags ORDER BY id');
  // What each miner earned over the settled epochs (no payout links here: one account per miner).
  const earned = new Map<string, bigint>();
  const paidIn = new Map<string, number[]>();
  for (const p of await app.db.query<{ epoch: number; miners: string[] | string; amount: string }>('SELECT epoch, miners, amount::text FROM payouts WHERE run_id = $1 ORDER BY epoch', [app.coordinator.runId])) {
    const ids = (typeof p.miners === 'string' ? JSON.parse(p.miners) : p.miners) as string[];
    for (const id of ids) earned.set(id, (earned.get(id) ?? 0n) + BigInt(p.amount) / BigInt(ids.length));
    for (const id of ids) paidIn.set(id, [...(paidIn.get(id) ?? []), p.epoch]);
  }
  const honest = [...roles].filter(([, c]) => !c).map(([id]) => id);
  const honestMean = honest.reduce((s, id) => s + Number(earned.get(id) ?? 0n), 0) / honest.length;
  // The epoch (0-based from the run's start) each miner first confirmed a transfer in: when its work, and a cheat's cheating, began.
  const firstWork = new Map(
    (await app.db.query<{ reporter: string; ms: string }>(`SELECT reporter, floor(extract(epoch FROM min(created_at)) * 1000)::text AS ms FROM receipts WHERE run_id = $1 GROUP BY reporter`, [app.coordinator.runId])).map((r) => [
      r.reporter,
      Math.floor((Number(r.ms) - runStart) / EPOCH_MS),
    ]),
  );
  // Each cheater's rounds, seconds from the run's start: committed with merge-ready, drawn or not (at what rate), and
  // its audits' outcomes and when they finished (where detection took long, why).
  const trails = new Map<string, Array<[number, number, number | null, string | null, number | null]>>();
  for (const [id, cheat] of roles) {
    if (!cheat) continue;
    const rows = await app.db.query<{ round: number; ready_s: number; rate: number | null; status: string | null; reason: string | null; done_s: number | null; taken: boolean | null; merged: boolean | null }>(
      `SELECT c.round, extract(epoch FROM c.ready_at)::float8 * 1000 - $3 AS ready_s, r.rate, a.status, a.reason, extract(epoch FROM a.finished_at)::float8 * 1000 - $3 AS done_s,
              e.participants @> jsonb_build_array(c.miner_id) AS taken, (e.merged_hashes ->> c.miner_id) = e.merged_hash AS merged
       FROM round_commitments c LEFT JOIN audit_rounds r ON r.run_id = c.run_id AND r.stage = c.stage AND r.round = c.round
       LEFT JOIN audits a ON a.run_id = c.run_id AND a.stage = c.stage AND a.round = c.round AND a.miner_id = c.miner_id
       LEFT JOIN epochs e ON e.run_id = c.run_id AND e.stage = c.stage AND e.epoch = c.round
       WHERE c.run_id = $1 AND c.miner_id = $2 ORDER BY c.round`,
      [app.coordinator.runId, id, runStart],
    );
    // Only a replica the round's merge took and that merged to its agreed weights can be drawn (Auditor.roundClosed).
    const eligibility = (r: { taken: boolean | null; merged: boolean | null }): string | null => (r.taken ? (r.merged ? null : 'not merged to the agreed weights') : 'not taken into the merge');
    trails.set(id, rows.map((r) => [r.round, Math.round(Number(r.ready_s) / 1000), r.rate, r.status ? (r.reason ?? r.status) : eligibility(r), r.done_s === null ? null : Math.round(Number(r.done_s) / 1000)]));
  }
  const detection = cheats.map((attack) => {
    const id = [...roles].find(([, c]) => c === attack)![0];
    const mine = flags.filter((f) => f.miner_id === id);
    const right = mine.find((f) => (CHEATS[attack].flags as readonly string[]).includes(f.kind));
    const flaggedIn = right ? Math.floor((new Date(right.created_at).getTime() - runStart) / EPOCH_MS) : null;
    const began = firstWork.get(id) ?? null;
    return {
      attack,
      detected: !!right,
      flags: mine.map((f) => f.kind),
      epochsToDetect: flaggedIn !== null ? flaggedIn - (began ?? 0) + 1 : null,
      flaggedInEpoch: flaggedIn !== null ? flaggedIn + 1 : null,
      firstWorkEpoch: began !== null ? began + 1 : null,
      earningsRatio: honestMean > 0 ? Number(earned.get(id) ?? 0n) / honestMean : 0,
      paidInEpochs: paidIn.get(id) ?? [],
      flaggedAtS: right ? Math.round((new Date(right.created_at).getTime() - runStart) / 1000) : null,
      /** [round, committed at s, draw's rate, audit outcome, or why it could not be drawn (null: not drawn), finished at s] */
      rounds: trails.get(id) ?? [],
    };
  });
  const honestFlags = flags.filter((f) => honest.includes(f.miner_id));
  for (const f of honestFlags) console.log(`audit seed ${seed}: FALSE POSITIVE ${f.miner_id.slice(0, 8)}: ${f.kind}: ${f.reason}`);
  const [{ n: honestRoundsAudited }] = await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM audits WHERE run_id = $1 AND status IN ('passed', 'failed', 'unanswered') AND miner_id = ANY($2::text[])`, [
    app.coordinator.runId,
    honest,
  ]);
  const honestStats = stats.filter((s) => honest.includes(s.minerId) && s.merges > 0);
  const minerComputeSecondsPerRound = honestStats.reduce((s, m) => s + m.computeMs / 1000 / m.merges, 0) / Math.max(1, honestStats.length);
  const [{ s: roundSeconds }] = await app.db.query<{ s: number }>(
    `SELECT coalesce(avg(extract(epoch FROM ended_at - started_at)), 0)::float8 AS s FROM epochs WHERE run_id = $1 AND ended_at IS NOT NULL`,
    [app.coordinator.runId],
  );
  const traffic = bytesPerToken(readTraffic(app.coordinator.live.miners), undefined, new Map((await app.coordinator.stageMap()).flatMap(({ stage, miners }) => miners.map((m) => [m.id, stage] as [string, number]))));
  printBytesPerToken(traffic);
  const result: RunResult = {
    seed,
    traffic,
    detection,
    honest: honest.length,
    honestFlagged: new Set(honestFlags.map((f) => f.miner_id)).size,
    honestRoundsAudited,
    audits: { ...app.validator.audits.stats },
    minerComputeSecondsPerRound,
    roundSeconds: Number(roundSeconds),
    wallS: Math.round((Date.now() - started) / 1000),
  };
  swarm.stop();
  await app.close();
  return result;
}

const runs: RunResult[] = [];
for (let i = 0; i < RUNS; i++) runs.push(await run(101 + i));

console.log('\ncheat                              detected  epochs to detect (from its first work; from the run start)  earnings / honest average  (per run)');
for (const attack of Object.keys(CHEATS) as CheatName[]) {
  const d = runs.map((r) => r.detection.find((x) => x.attack === attack)!);
  console.log(
    `${attack.padEnd(35)}${`${d.filter((x) => x.detected).length}/${d.length}`.padEnd(10)}${d.map((x) => `${x.epochsToDetect ?? '—'} (${x.flaggedInEpoch ?? '—'})`).join(', ').padEnd(50)}${d.map((x) => x.earningsRatio.toFixed(2)).join(', ')}`,
  );
}
const audited = runs.reduce((s, r) => s + r.audits.passed + r.audits.failed, 0);
const validatorSecondsPerAuditedRound = runs.reduce((s, r) => s + r.audits.validatorMs, 0) / 1000 / Math.max(1, audited);
const minerSecondsPerRound = runs.reduce((s, r) => s + r.minerComputeSecondsPerRound, 0) / runs.length;
const all = runs.flatMap((r) => r.detection);
// One validator core keeps up with as many miners as it can audit a round of each per round's wall time, at the rate.
const roundSeconds = runs.reduce((s, r) => s + r.roundSeconds, 0) / runs.length;
const minersPerValidatorCore = Math.floor(roundSeconds / (AUDIT_RATE * Math.max(1e-9, validatorSecondsPerAuditedRound)));
console.log(`false positives: ${runs.map((r) => r.honestFlagged).join(', ')} honest miners flagged over ${runs.map((r) => r.honestRoundsAudited).join(', ')} honest rounds audited`);
console.log(`validator ${validatorSecondsPerAuditedRound.toFixed(2)} s per audited round; a miner computes ${minerSecondsPerRound.toFixed(2)} s per round`);
console.log(`rounds last ${roundSeconds.toFixed(1)} s: one validator core audits ${minersPerValidatorCore} miners at rate ${AUDIT_RATE}`);

finish('audit', {
  cheaters: Object.keys(CHEATS).length,
  detected: Math.min(...runs.map((r) => r.detection.filter((d) => d.detected).length)),
  falsePositives: runs.reduce((s, r) => s + r.honestFlagged, 0),
  honestRoundsAudited: runs.reduce((s, r) => s + r.honestRoundsAudited, 0),
  maxEpochsToDetect: Math.max(...all.map((d) => d.epochsToDetect ?? Infinity)),
  maxEpochsToDetectFromRunStart: Math.max(...all.map((d) => d.flaggedInEpoch ?? Infinity)),
  maxCheaterEarningsRatio: Math.max(...all.map((d) => d.earningsRatio)),
  auditRate: AUDIT_RATE,
  holdEpochs: HOLD_EPOCHS,
  validatorSecondsPerAuditedRound: +validatorSecondsPerAuditedRound.toFixed(3),
  minerSecondsPerRound: +minerSecondsPerRound.toFixed(3),
  roundSeconds: +roundSeconds.toFixed(1),
  minersPerValidatorCore,
  totalBytesPerToken: +(runs.reduce((s, r) => s + r.traffic.totalBytesPerToken, 0) / runs.length).toFixed(2),
  auditBytesPerToken: +(runs.reduce((s, r) => s + r.traffic.auditBytesPerToken, 0) / runs.length).toFixed(2),
  runs: runs.length,
  budget: `${runs.length} run(s) of ${EPOCHS} settled epochs of ${EPOCH_MS / 1000} s, tiny, 3 stages, 12 honest miners and ${Object.keys(CHEATS).length} cheaters`,
  perRun: runs,
  machine: machine(backend),
});
process.exit(0);
