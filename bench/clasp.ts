/**
 * npm run bench:clasp — how well the validator catches cheaters, and what it costs.
 *
 * 1. Detection, from a real swarm run: the adversarial test's setup
 *    (server/test/adversarial.test.ts): 12 honest miners and one of each cheat
 *    of testkit/src/cheats.ts over 3 stages of `tiny`, in two miner
 *    processes over WebRTC, the coordinator with PGlite here, the validator in
 *    its own process; epochs of EPOCH_MS, each settled SETTLE_AFTER_MS after
 *    it ends. Per cheat: the flag it earned and the epoch it was flagged in
 *    (1 = during the first epoch); false positives: honest miners flagged.
 * 2. Validator time per epoch against the number of miners (12, 48, 192):
 *    scoring one epoch (CLASP over the window's pathways, verdicts, scores,
 *    the integer split and the Merkle tree: what the validator process runs
 *    at settlement) on synthetic pathways (packages/incentives/synthetic.ts),
 *    100 microbatches per miner and epoch, one bad miner planted.
 *
 *   npm run bench:clasp
 */
import { synthesizePathways } from '@train-at-home/incentives';
import { initNodeBackend } from '@train-at-home/model/node';
import { listeningCoordinator } from '@train-at-home/testkit/coordinator';
import { CHEATS, type CheatName } from '@train-at-home/testkit/cheats';
import { MinerSwarm } from '@train-at-home/testkit/swarm';
import { scoreEpoch, type ScoreJob } from '../server/src/validator/scoring';
import { finish, machine } from './lib';

const EPOCH_MS = 60_000;
const SETTLE_AFTER_MS = 45_000;
const EPOCHS = 2;

const backend = await initNodeBackend();

// 1. Detection in a real run.
const { app, url } = await listeningCoordinator({
  name: 'bench-clasp',
  preset: 'tiny',
  stages: 3,
  bottleneck: 32,
  training: { batchSize: 8, peakLr: 0.006, warmupSteps: 10, totalSteps: 600 },
  merge: { every: 4, maxTrainingMs: 12_000, readyMs: 10_000, senderMs: 10_000, reducerMs: 5_000, roundMs: 30_000 },
  incentives: { epochMs: EPOCH_MS, settleAfterMs: SETTLE_AFTER_MS, emissionPerEpoch: '1000000000', spotCheckRate: 1, probeTimeoutMs: 15_000, windowEpochs: 2 },
});
const swarm = new MinerSwarm();
const started = Date.now();
const miners = await swarm.start(url, [9, 9, 8]);
const byStage = [0, 1, 2].map((stage) => miners.filter((m) => m.stage === stage).map((m) => m.minerId).sort());
const roles = new Map<string, CheatName | null>(miners.map((m) => [m.minerId, null]));
for (const [name, cheat] of Object.entries(CHEATS) as Array<[CheatName, (typeof CHEATS)[CheatName]]>) {
  roles.set(byStage[cheat.stage]!.find((id) => roles.get(id) === null)!, name);
}
await swarm.assign(Object.fromEntries([...roles].filter(([, c]) => c)) as Record<string, CheatName>);
const [{ ms: runStart }] = (await app.db.query<{ ms: string }>(`SELECT floor(extract(epoch FROM created_at) * 1000)::text AS ms FROM runs WHERE id = $1`, [app.coordinator.runId])).map((r) => ({ ms: Number(r.ms) }));
while ((await app.db.query('SELECT 1 FROM settlements')).length < EPOCHS) {
  await new Promise((r) => setTimeout(r, 5_000));
  const flags = await app.db.query('SELECT 1 FROM flags');
  console.log(`clasp: ${Math.round((Date.now() - started) / 1000)} s, ${flags.length} flags, spot checks ${JSON.stringify(app.validator.spotChecks.stats)}`);
  if (Date.now() - started > (EPOCHS + 2) * EPOCH_MS + SETTLE_AFTER_MS) throw new Error('epochs were not settled in time');
}
const flags = await app.db.query<{ miner_id: string; kind: string; created_at: Date }>('SELECT miner_id, kind, created_at FROM flags ORDER BY id');
const checks = await app.db.query<{ miner_id: string; passed: boolean }>('SELECT miner_id, passed FROM spot_checks');
const losses = (await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM metrics WHERE name = 'train_loss'`))[0]!.n;
const detection = (Object.keys(CHEATS) as CheatName[]).map((name) => {
  const id = [...roles].find(([, c]) => c === name)![0];
  const mine = flags.filter((f) => f.miner_id === id);
  const right = mine.find((f) => (CHEATS[name].flags as readonly string[]).includes(f.kind));
  return {
    attack: name,
    stage: CHEATS[name].stage,
    flags: mine.map((f) => f.kind),
    expected: CHEATS[name].flags,
    detected: !!right,
    epochsToDetect: right ? Math.floor((new Date(right.created_at).getTime() - runStart) / EPOCH_MS) + 1 : null,
    secondsToDetect: right ? Math.round((new Date(right.created_at).getTime() - started) / 1000) : null,
    checksFailed: checks.filter((c) => c.miner_id === id && !c.passed).length,
  };
});
const honest = [...roles].filter(([, c]) => !c).map(([id]) => id);
const falsePositives = flags.filter((f) => honest.includes(f.miner_id)).length;
const honestChecks = checks.filter((c) => honest.includes(c.miner_id));
const spot = app.validator.spotChecks.stats;
const realScoreMs = [...app.validator.settler.scoreMs.values()];
console.log('\nattack                        stage  flagged for              epochs to detect  s from start');
for (const d of detection) console.log(`${d.attack.padEnd(30)}${String(d.stage).padEnd(7)}${(d.flags.join(', ') || '—').padEnd(25)}${String(d.epochsToDetect ?? '—').padEnd(18)}${d.secondsToDetect ?? '—'}`);
console.log(`honest miners flagged: ${falsePositives} of ${honest.length}; honest spot checks: ${honestChecks.length}, failed ${honestChecks.filter((c) => !c.passed).length}`);
// Each false positive with its evidence, and the pathway of each failed honest check (who else was on it).
const role = (id: string): string => `${id.slice(0, 8)}(${roles.get(id) ?? 'honest'})`;
for (const f of await app.db.query<{ miner_id: string; kind: string; reason: string; evidence: unknown }>('SELECT miner_id, kind, reason, evidence FROM flags ORDER BY id')) {
  if (honest.includes(f.miner_id)) console.log(`false positive ${role(f.miner_id)}: ${f.kind}: ${f.reason} ${JSON.stringify(f.evidence).slice(0, 800)}`);
}
for (const c of await app.db.query<{ miner_id: string; stage: number; kind: string; activation_id: string; reference_round: number; metrics: unknown }>(
  `SELECT c.miner_id, c.stage, c.kind, c.activation_id, c.reference_round, c.metrics FROM spot_checks c WHERE NOT c.passed ORDER BY c.id`,
)) {
  if (!honest.includes(c.miner_id)) continue;
  const [loss] = await app.db.query<{ pathway: string[] | string }>(`SELECT pathway FROM metrics WHERE name = 'train_loss' AND activation_id = $1`, [c.activation_id]);
  const pathway = (typeof loss?.pathway === 'string' ? JSON.parse(loss.pathway) : loss?.pathway ?? []) as string[];
  console.log(`honest check failed: ${role(c.miner_id)} stage ${c.stage} ${c.kind} round ${c.reference_round} ${JSON.stringify(c.metrics)} pathway ${pathway.map(role).join(' → ')}`);
}
swarm.stop();
await app.close();

// 2. Validator time per epoch against the number of miners.
const msPerEpoch: Record<string, number> = {};
for (const n of [12, 48, 192]) {
  const perStage = n / 3;
  const rounds = 20;
  const { observations, miners: ids } = synthesizePathways({ stages: 3, minersPerStage: perStage, rounds, perRound: (n * 100) / rounds, effects: { s1m1: 0.3 }, noise: 0.1, lossStart: 4, lossDecayPerRound: 0.02, rotate: true, seed: 7 });
  const job: ScoreJob = {
    epoch: 0,
    emission: '1000000000',
    miners: ids.flat().map((id, i) => ({ minerId: id, account: `5${String(i).padStart(46, 'A')}`, stage: Number(id.slice(1, id.indexOf('m'))), work: 100, flags: [], spotChecks: { passed: 3, failed: 0 } })),
    observations,
  };
  scoreEpoch(job); // warm
  const times: number[] = [];
  for (let i = 0; i < 5; i++) {
    const t = performance.now();
    scoreEpoch(job);
    times.push(performance.now() - t);
  }
  msPerEpoch[n] = Math.round(Math.min(...times));
  console.log(`score an epoch: ${n} miners, ${observations.length} microbatches: ${msPerEpoch[n]} ms (best of 5)`);
}

finish('clasp', {
  cheaters: detection.length,
  detected: detection.filter((d) => d.detected).length,
  falsePositives,
  maxEpochsToDetect: Math.max(...detection.map((d) => d.epochsToDetect ?? Infinity)),
  msPerEpoch,
  detection,
  run: {
    honestMiners: honest.length,
    epochMs: EPOCH_MS,
    settleAfterMs: SETTLE_AFTER_MS,
    microbatches: losses,
    spotChecks: { checks: spot.checks, failed: spot.failed, honestChecks: honestChecks.length, honestFailed: honestChecks.filter((c) => !c.passed).length, replayMsPerMicrobatch: spot.replayed ? Math.round(spot.replayMs / spot.replayed) : null },
    scoreMsPerSettledEpoch: realScoreMs.map(Math.round),
    wallS: Math.round((Date.now() - started) / 1000),
  },
  machine: machine(backend),
});
process.exit(0);
