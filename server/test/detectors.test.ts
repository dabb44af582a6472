import * as tf from '@tensorflow/tfjs';
import type { Misbehaviour, Miner } from '@train-at-home/swarm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../src/app';
import { listeningCoordinator, localMiner } from '@train-at-home/testkit/miner-processes';

/**
 * The spot checks' detectors with nothing else watching (jobs/spot-checks.ts): every completed microbatch
 * sampled, no round ever drawn for an audit (auditRate and unprovenAuditRate 0), no epoch settled in the test's time
 * (so CLASP never scores): a flag here is the spot checks' own. Two stages of two in-process miners of `tiny` over
 * real WebRTC, three miners a stage. On the first stage: one that never uploads a payload the validator asks for, one
 * that adds noise of its outputs' own scale to every activation it sends, and an honest one; on the last: one that
 * reports 0.7 of every loss it computes, one that sends back the negated gradient of its input, and an honest one.
 */
const PROBE_TIMEOUT_MS = 20_000;
/** A run whose detectors have not fired in this long has stopped, not slowed. */
const LOST_MS = 300_000;

let app: App;
let url: string;
const miners: Miner[] = [];

beforeAll(async () => {
  ({ app, url } = await listeningCoordinator({
    name: 'detectors',
    preset: 'tiny',
    stages: 2,
    bottleneck: 32,
    training: { batchSize: 4 },
    merge: { every: 3 },
    // The honest miners' probes are answered in milliseconds: the timeout only bounds the refuser's.
    incentives: { spotCheckRate: 1, probeTimeoutMs: PROBE_TIMEOUT_MS, auditRate: 0, unprovenAuditRate: 0 },
  }));
});
afterAll(async () => {
  for (const m of miners) m.stop();
  await app?.close();
});

type Row = { miner_id: string; kind: string; reason: string };

describe('spot checks alone', () => {
  it('flag noisy outputs OUTPUT_MISMATCH, negated gradients GRADIENT_MISMATCH, under-reported losses LOSS_MISREPORTED and a miner that never uploads a probed payload PROBE_UNANSWERED, each by that kind alone; the honest miners beside them pass their checks and are never flagged', async () => {
    const behaviours: Misbehaviour[] = [{}, {}, {}, {}, {}, {}];
    for (const misbehave of behaviours) miners.push(localMiner(url, { misbehave }));
    for (const m of miners) await m.start();
    const at = (stage: number): number[] => miners.flatMap((m, i) => (m.registration!.stage === stage ? [i] : []));
    expect([at(0).length, at(1).length]).toEqual([3, 3]);
    const [refuser, noisy, honest0] = at(0) as [number, number, number];
    const [underReporter, flipper, honest1] = at(1) as [number, number, number];
    // The cheats begin now: each miner's misbehaviour is read as it works.
    Object.assign(behaviours[refuser]!, { refuseProbes: true } satisfies Misbehaviour);
    Object.assign(behaviours[noisy]!, {
      output: (out: tf.Tensor2D) => tf.tidy(() => out.add(tf.randomNormal(out.shape).mul(tf.sqrt(tf.mean(tf.square(out)))))),
    } satisfies Misbehaviour);
    Object.assign(behaviours[underReporter]!, { reportedLoss: (loss: number) => loss * 0.7 } satisfies Misbehaviour);
    Object.assign(behaviours[flipper]!, { inputGrad: (g: tf.Tensor2D) => tf.neg(g) } satisfies Misbehaviour);
    const id = (i: number): string => miners[i]!.registration!.minerId;
    const role = new Map([
      [id(refuser), 'probe refuser'],
      [id(noisy), 'noisy outputs'],
      [id(underReporter), 'under-reporter'],
      [id(flipper), 'gradient flipper'],
      [id(honest0), 'honest (stage 1)'],
      [id(honest1), 'honest (stage 2)'],
    ]);
    const cheaters = [refuser, noisy, underReporter, flipper].map(id);

    const flags = (): Promise<Row[]> => app.db.query<Row>('SELECT miner_id, kind, reason FROM flags ORDER BY id');
    const passedChecks = async (minerId: string): Promise<number> =>
      (await app.db.query<{ n: number }>('SELECT count(*)::int AS n FROM spot_checks WHERE miner_id = $1 AND passed', [minerId]))[0]!.n;
    // Until both cheaters are flagged and each honest miner has passed a check of its own.
    const started = Date.now();
    await expect
      .poll(
        async () => {
          const f = await flags();
          const state = {
            flags: f.map((x) => `${role.get(x.miner_id)}:${x.kind}`),
            honestPassed: [await passedChecks(id(honest0)), await passedChecks(id(honest1))],
            spotChecks: app.validator.spotChecks.stats,
          };
          console.log(`detectors: ${Math.round((Date.now() - started) / 1000)} s, ${JSON.stringify(state)}`);
          return cheaters.every((m) => f.some((x) => x.miner_id === m)) && state.honestPassed.every((n) => n > 0);
        },
        { timeout: LOST_MS, interval: 5_000 },
      )
      .toBe(true);

    const all = await flags();
    for (const f of all) console.log(`detectors: flag ${role.get(f.miner_id)}: ${f.kind}: ${f.reason}`);
    // Each cheater by its own detector, and by nothing else; the honest miners not at all.
    expect(all.filter((f) => f.miner_id === id(refuser)).map((f) => f.kind)).toEqual(['PROBE_UNANSWERED']);
    expect(all.filter((f) => f.miner_id === id(noisy)).map((f) => f.kind)).toEqual(['OUTPUT_MISMATCH']);
    expect(all.filter((f) => f.miner_id === id(underReporter)).map((f) => f.kind)).toEqual(['LOSS_MISREPORTED']);
    expect(all.filter((f) => f.miner_id === id(flipper)).map((f) => f.kind)).toEqual(['GRADIENT_MISMATCH']);
    expect(all.filter((f) => [id(honest0), id(honest1)].includes(f.miner_id))).toEqual([]);
    // What the spot checks found: each of the three that computes falsely failed checks of the kind it falsifies; the
    // refuser computes honestly, so no check
    // of it failed (it may have been replayed on a sample it answered before its cheat began); no check of an honest
    // miner failed.
    const checks = await app.db.query<{ miner_id: string; kind: string; passed: boolean }>('SELECT miner_id, kind, passed FROM spot_checks');
    expect(checks.filter((c) => c.miner_id === id(underReporter) && !c.passed).map((c) => c.kind)).toContain('loss');
    expect(checks.filter((c) => c.miner_id === id(noisy) && !c.passed).map((c) => c.kind)).toContain('forward');
    expect(checks.filter((c) => c.miner_id === id(flipper) && !c.passed).map((c) => c.kind)).toContain('backward');
    expect(checks.filter((c) => c.miner_id === id(refuser) && !c.passed)).toEqual([]);
    expect(checks.filter((c) => [id(honest0), id(honest1)].includes(c.miner_id) && !c.passed)).toEqual([]);
    // Nothing else could have caught them: no round drawn for an audit, no epoch settled.
    expect(await app.db.query('SELECT count(*)::int AS n FROM audits')).toEqual([{ n: 0 }]);
    expect(await app.db.query('SELECT count(*)::int AS n FROM settlements')).toEqual([{ n: 0 }]);
  });
});
