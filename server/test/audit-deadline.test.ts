import type { Misbehaviour, Miner } from '@train-at-home/swarm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../src/app';
import { auditDeadlineMs } from '../src/jobs/audits';
import { listeningCoordinator, localMiner } from '@train-at-home/testkit/miner-processes';
import { throttledLink, type ThrottledLink } from '@train-at-home/testkit/throttle';

/**
 * Whole-round audits against slow lines (jobs/audits.ts): an audit's deadline is the run's allowance plus the
 * record's upload at its miner's measured rate, and a late answer is still taken and replayed until the hard bound
 * (the deadline plus auditGraceMs); only a miner that never answers is flagged, then. Two stages of two in-process
 * miners of `tiny` over real WebRTC: a first-stage miner whose uploads are held to at most 400 kB/s by a proxy between
 * it and the coordinator (its first record, over 3.5 MB, takes at least 9 s against a deadline of under 6 s at the
 * assumed rate), and a last-stage miner that never answers an audit, each beside an honest miner of its stage.
 * No spot checks: the audits alone watch.
 */
const TIMEOUT_MS = 1_000;
/** The hard bound past the deadline: over three times what the slow record's upload takes at its throttle. */
const GRACE_MS = 30_000;
const SLOW_BYTES_PER_SEC = 400_000;
/** A run whose audits have not come to this in so long has stopped, not slowed. */
const LOST_MS = 420_000;

let app: App;
let url: string;
const miners: Miner[] = [];
const links: ThrottledLink[] = [];

beforeAll(async () => {
  ({ app, url } = await listeningCoordinator({
    name: 'audit-deadline',
    preset: 'tiny',
    stages: 2,
    bottleneck: 32,
    training: { batchSize: 4 },
    merge: { every: 24 },
    // Every round of a replica drawn until it has passed PROVEN_AUDITS audits, then a quarter of them; epochs of 40 s,
    // each settled once its own rounds' audits are decided.
    incentives: { auditRate: 0.25, unprovenAuditRate: 1, auditTimeoutMs: TIMEOUT_MS, auditGraceMs: GRACE_MS, spotCheckRate: 0, epochMs: 40_000, settleAfterMs: 5_000, holdEpochs: 0, windowEpochs: 1 },
  }));
});
afterAll(async () => {
  for (const m of miners) m.stop();
  for (const l of links) await l.close();
  await app?.close();
});

type Audit = { id: string; miner_id: string; round: number; status: string; reason: string | null; detail: Record<string, number | null>; deadline: Date; created_at: Date; finished_at: Date | null };

describe('audits on a slow line', () => {
  it("replay an honest miner's record that came after its deadline, pass and pay it, give its next audit the time its line needs, and flag a miner that never answers only at the hard bound", async () => {
    const behaviours: Misbehaviour[] = [{}, {}, {}, {}];
    for (const misbehave of behaviours) {
      const link = await throttledLink(url);
      links.push(link);
      miners.push(localMiner(link.url, { misbehave }));
    }
    for (const m of miners) await m.start();
    const at = (stage: number): number[] => miners.flatMap((m, i) => (m.registration!.stage === stage ? [i] : []));
    expect([at(0).length, at(1).length]).toEqual([2, 2]);
    const [slow, honest0] = at(0) as [number, number];
    const [refuser, honest1] = at(1) as [number, number];
    links[slow]!.bytesPerSec = SLOW_BYTES_PER_SEC;
    Object.assign(behaviours[refuser]!, { refuseAudits: true } satisfies Misbehaviour);
    const id = (i: number): string => miners[i]!.registration!.minerId;
    const role = new Map([
      [id(slow), 'slow'],
      [id(refuser), 'refuser'],
      [id(honest0), 'honest (stage 1)'],
      [id(honest1), 'honest (stage 2)'],
    ]);

    const audits = (minerId: string): Promise<Audit[]> =>
      app.db.query<Audit>('SELECT id, miner_id, round, status, reason, detail, deadline, created_at, finished_at FROM audits WHERE miner_id = $1 ORDER BY created_at', [minerId]);
    const flags = (): Promise<Array<{ miner_id: string; kind: string; created_at: Date }>> => app.db.query('SELECT miner_id, kind, created_at FROM flags ORDER BY id');
    // The slow miner's first late audit that passed, and the epoch it was drawn in, once settled.
    const latePassed = async (): Promise<Audit | undefined> => (await audits(id(slow))).find((a) => a.status === 'passed' && (a.detail.lateMs ?? 0) > 0);
    const settledAfter = async (a: Audit): Promise<{ epoch: number; settled_at: Date } | undefined> =>
      (
        await app.db.query<{ epoch: number; settled_at: Date }>('SELECT epoch, settled_at FROM settlements WHERE run_id = $1 AND starts_at <= $2 AND ends_at > $2', [app.coordinator.runId, a.created_at])
      )[0];
    const started = Date.now();
    await expect
      .poll(
        async () => {
          const late = await latePassed();
          const f = await flags();
          console.log(
            `audit-deadline: ${Math.round((Date.now() - started) / 1000)} s, slow ${JSON.stringify((await audits(id(slow))).map((a) => [a.round, a.status, a.detail.lateMs ?? null]))}, ` +
              `flags ${JSON.stringify(f.map((x) => `${role.get(x.miner_id)}:${x.kind}`))}, auditor ${JSON.stringify(app.validator.audits.stats)}`,
          );
          return Boolean(late && (await settledAfter(late)) && f.some((x) => x.miner_id === id(refuser)) && (await audits(id(slow))).some((a) => a.created_at > late.created_at && a.detail.uploadBytesPerSec));
        },
        { timeout: LOST_MS, interval: 5_000 },
      )
      .toBe(true);

    // The slow miner: answered late, replayed, passed, never flagged, and paid for the epoch its late round was drawn in.
    const late = (await latePassed())!;
    expect(late.detail.lateMs).toBeGreaterThan(0);
    expect(late.reason).toBeNull();
    const epoch = (await settledAfter(late))!;
    expect(new Date(epoch.settled_at).getTime()).toBeGreaterThanOrEqual(new Date(late.finished_at!).getTime());
    const [paid] = await app.db.query<{ score: number; flagged: boolean }>('SELECT score, flagged FROM scores WHERE run_id = $1 AND epoch = $2 AND miner_id = $3', [app.coordinator.runId, epoch.epoch, id(slow)]);
    expect(paid).toMatchObject({ flagged: false });
    expect(paid!.score).toBeGreaterThan(0);
    // Its line's rate was measured on that upload: at most what the proxy lets through (less: the proxy shares this
    // process's event loop with four miners' compute), and the audit drawn next was given its record's upload, and
    // that of the records queued before it, at that rate.
    const [line] = await app.db.query<{ upload_bytes_per_sec: number; record_bytes: number }>('SELECT upload_bytes_per_sec, record_bytes FROM miners WHERE id = $1', [id(slow)]);
    expect(line!.upload_bytes_per_sec).toBeGreaterThan(0);
    expect(line!.upload_bytes_per_sec).toBeLessThan(SLOW_BYTES_PER_SEC * 1.5);
    const next = (await audits(id(slow))).find((a) => a.created_at > late.created_at && a.detail.uploadBytesPerSec)!;
    expect(next.detail.uploadBytesPerSec).toBeLessThan(SLOW_BYTES_PER_SEC * 1.5);
    expect(next.detail.deadlineMs).toBe(auditDeadlineMs(TIMEOUT_MS, next.detail.queuedBytes! + next.detail.recordBytes!, next.detail.uploadBytesPerSec));
    expect(next.detail.deadlineMs).toBeGreaterThan(TIMEOUT_MS + (1000 * next.detail.recordBytes!) / (SLOW_BYTES_PER_SEC * 1.5));

    // The refuser: flagged AUDIT_UNANSWERED, and not before its first audit's hard bound.
    const f = await flags();
    expect(f.filter((x) => x.miner_id === id(refuser)).map((x) => x.kind)).toEqual(['AUDIT_UNANSWERED']);
    const first = (await audits(id(refuser)))[0]!;
    const flaggedAt = new Date(f.find((x) => x.miner_id === id(refuser))!.created_at).getTime();
    expect(flaggedAt).toBeGreaterThanOrEqual(new Date(first.deadline).getTime() + GRACE_MS);
    // Nobody else is flagged, and no audit of an honest or slow miner failed or went unanswered.
    expect(f.filter((x) => x.miner_id !== id(refuser))).toEqual([]);
    for (const i of [slow, honest0, honest1]) {
      expect((await audits(id(i))).filter((a) => ['failed', 'unanswered'].includes(a.status)).map((a) => [a.round, a.status, a.reason])).toEqual([]);
    }
  });
});
