import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { NO_CHECKS } from '@train-at-home/testkit/coordinator';
import { evaluations } from '@train-at-home/testkit/evaluations';

const MINER_CLI = fileURLToPath(new URL('../../apps/miner/src/main.ts', import.meta.url));

/** The training schedule (microbatches per replica) and a merge round's length. */
const TOTAL_STEPS = 200;
const MERGE_EVERY = 10;
/** A run that has not finished its schedule in this long has stopped, not slowed. */
const LOST_RUN_MS = 25 * 60_000;

let app: App;
let miners: ChildProcess | undefined;
let output = '';

beforeAll(async () => {
  app = await buildApp({
    database: await testDatabase(),
    run: {
      name: 'replicas',
      preset: 'tiny',
      stages: 3,
      // Boundaries at full width (b = d = 128), int8: the local trainer's CI configuration, which passes the
      // bigram baseline in ~200 steps. A 32-wide bottleneck costs ~0.2 nats there (3.40 after 200 steps,
      // the swarm matching it step for step), too slow for CI.
      bottleneck: 128,
      training: { batchSize: 32, peakLr: 0.006, warmupSteps: 20, totalSteps: TOTAL_STEPS },
      merge: { every: MERGE_EVERY },
      // This file asks whether the swarm learns and its replicas agree, not whether the validator catches anyone.
      incentives: NO_CHECKS,
    },
  });
  await app.fastify.listen({ port: 0, host: '127.0.0.1' });
});
afterAll(async () => {
  miners?.kill('SIGTERM');
  await new Promise((r) => (miners && miners.exitCode === null ? miners.once('exit', r) : r(null)));
  await app.close();
});

describe('3 stages × 2 replicas in separate processes', () => {
  it('train the tiny model together: held-out loss falls below the bigram baseline, replicas merge to identical weights, no frame passes through the coordinator', async () => {
    const port = (app.fastify.server.address() as { port: number }).port;
    // Every merged round's held-out loss, measured once by the validator as the round closes (not on its 30 s timer),
    // heard here as it is recorded.
    app.validator.evaluateEveryMs = 0;
    const held = evaluations(app);
    miners = spawn(process.execPath, ['--import', 'tsx', MINER_CLI, '--coordinator', `http://127.0.0.1:${port}`, '--count', '6'], { stdio: ['ignore', 'pipe', 'inherit'] });
    miners.stdout!.on('data', (c: Buffer) => (output += c.toString()));
    await expect.poll(async () => (await app.fastify.inject({ method: 'GET', url: '/api/stages' })).json().stages.map((s: { miners: unknown[] }) => s.miners.length), { timeout: 60_000 }).toEqual([2, 2, 2]);

    // Train until held-out loss is below the bigram baseline (3.270), or until every stage has merged the whole
    // schedule (TOTAL_STEPS microbatches, MERGE_EVERY a round: past it the learning rate is at its floor and the loss
    // moves no more). Steps, not minutes: on a loaded machine the same training takes longer, and a wall-clock limit
    // failed it half-way through its schedule. LOST_RUN_MS only tells a run that stopped from a slow one.
    const started = Date.now();
    let last: { heldOutLoss: number; bigramLoss: number; rounds: number[] } | undefined;
    let first: number | undefined;
    // Held-out loss of the merged weights, as the validator measures it once every stage has a checkpoint of a newer
    // round (evaluateEveryMs 0, set above; the stages merge independently, one may trail the others by a round).
    const byRound: Array<{ round: number; heldOut: number }> = [];
    while (Date.now() - started < LOST_RUN_MS) {
      last = (await held.next(60_000)) ?? last;
      first ??= last?.heldOutLoss;
      const merges = (await app.fastify.inject({ method: 'GET', url: '/api/merges' })).json();
      const merged = last ? Math.min(...last.rounds) : 0;
      if (last && merged > (byRound.at(-1)?.round ?? 0)) byRound.push({ round: merged, heldOut: last.heldOutLoss });
      console.log(
        `replicas: ${Math.round((Date.now() - started) / 1000)} s, rounds ${JSON.stringify(merges.stages.map((s: { round: number }) => s.round))}, checkpoints of rounds ${JSON.stringify(last?.rounds ?? [])}, held-out ${last?.heldOutLoss.toFixed(3)} vs bigram ${last?.bigramLoss.toFixed(3)}`,
      );
      if (last && last.heldOutLoss < last.bigramLoss) break;
      if (last && merged * MERGE_EVERY >= TOTAL_STEPS) break;
    }
    held.stop();
    expect(last).toBeDefined();
    expect(last!.heldOutLoss).toBeLessThan(first!);
    expect(last!.heldOutLoss).toBeLessThan(last!.bigramLoss);
    // The merged weights kept improving it from merge to merge: every merged round sampled beats all
    // rounds sampled three or more before it. (Late in the schedule one merge can gain only ~0.001, and
    // one can lose as much: a fresh-clone CI run sampled rounds 8, 9 and 10 at 3.407, 3.384 and 3.408,
    // then 3.368. Two samples apart is within that noise; a regression that lasts still fails here.)
    console.log(`replicas: held-out by merged round ${JSON.stringify(byRound.map((r) => [r.round, +r.heldOut.toFixed(3)]))}`);
    expect(byRound.length).toBeGreaterThanOrEqual(5);
    for (let i = 3; i < byRound.length; i++) expect(byRound[i]!.heldOut).toBeLessThan(Math.min(...byRound.slice(0, i - 2).map((r) => r.heldOut)));

    // Every stage merged many times; the replicas shared one anchor (outer steps on averaged pseudo-gradients).
    const merges = (await app.fastify.inject({ method: 'GET', url: '/api/merges' })).json();
    const finished = merges.rounds.filter((r: { endedAt: string | null }) => r.endedAt);
    for (let s = 0; s < 3; s++) {
      const rounds = finished.filter((r: { stage: number }) => r.stage === s);
      for (const r of rounds) expect(r.mergedHash).toMatch(/^[0-9a-f]{64}$/);
      expect(rounds.filter((r: { participants: string[]; mode: string }) => r.participants.length === 2 && r.mode === 'outer').length).toBeGreaterThanOrEqual(5);
    }
    // Both replicas of every round reported the same weights: no divergence, no disputes, nobody missed a round.
    expect(merges.events).toEqual([]);
    // Every stored checkpoint is the merged weights every replica of its round reported. Read first, then the rounds,
    // waited for until each checkpoint's round is stored as closed (its upload can land just before the close).
    const checkpoints: Array<{ stage: number; epoch: number; hash: string }> = (await app.fastify.inject({ method: 'GET', url: '/api/checkpoints' })).json().checkpoints;
    expect(checkpoints.length).toBeGreaterThanOrEqual(3);
    type Round = { stage: number; round: number; endedAt: string | null; mergedHash: string };
    const closedRound = async (c: { stage: number; epoch: number }): Promise<Round | undefined> =>
      ((await app.fastify.inject({ method: 'GET', url: '/api/merges' })).json().rounds as Round[]).find((r) => r.stage === c.stage && r.round === c.epoch && r.endedAt);
    for (const c of checkpoints) {
      await expect.poll(() => closedRound(c), { timeout: 30_000 }).toBeDefined();
      expect(c.hash).toBe((await closedRound(c))!.mergedHash);
    }
    // Every activation and gradient crossed a data channel, confirmed by both ends: a microbatch with a
    // loss report crossed 2 boundaries each way. Nothing was relayed by the coordinator.
    const losses = (await app.fastify.inject({ method: 'GET', url: '/api/metrics' })).json().counts.trainLoss;
    await expect.poll(async () => (await app.coordinator.receiptSummary()).confirmed, { timeout: 30_000 }).toBeGreaterThanOrEqual(4 * losses);
    expect((await app.coordinator.receiptSummary()).disputed).toBe(0);
    expect(app.coordinator.relayed.frameBytes).toBe(0);

    // What each stage's miners moved, by kind, as their heartbeats say (the dashboard's per-stage figures): pipeline
    // frames where the stage sends and receives them, all-reduce partitions between its two replicas, the checkpoints
    // they uploaded, the coordinator's messages; no training data over the network (Node miners read it from disk).
    const stages: Array<{ traffic: { tokens: number; kinds: Record<string, { sent: number; received: number }> } }> = (await app.fastify.inject({ method: 'GET', url: '/api/dashboard' })).json().swarm.stages;
    const k = stages.map((st) => st.traffic.kinds);
    console.log(`replicas: bytes per trained token by stage ${JSON.stringify(stages.map((st) => Object.fromEntries(Object.entries(st.traffic.kinds).map(([kind, t]) => [kind, +((t.sent + t.received) / st.traffic.tokens).toFixed(1)]))))}`);
    for (const st of stages) expect(st.traffic.tokens).toBeGreaterThan(0);
    expect([k[0]!.activation.sent, k[1]!.activation.received, k[1]!.activation.sent, k[2]!.activation.received].every((b) => b > 0)).toBe(true);
    expect([k[2]!.gradient.sent, k[1]!.gradient.received, k[1]!.gradient.sent, k[0]!.gradient.received].every((b) => b > 0)).toBe(true);
    expect([k[0]!.activation.received, k[2]!.activation.sent, k[0]!.gradient.sent, k[2]!.gradient.received]).toEqual([0, 0, 0, 0]);
    for (const t of k) {
      expect(t.merge!.sent).toBeGreaterThan(0);
      expect(t.merge!.received).toBeGreaterThan(0);
      expect(t.checkpoint!.sent).toBeGreaterThan(0);
      expect(t.coordinator!.sent).toBeGreaterThan(0);
      expect(t.coordinator!.received).toBeGreaterThan(0);
      expect(t.data).toEqual({ sent: 0, received: 0 });
    }
  }, LOST_RUN_MS + 5 * 60_000);
});
