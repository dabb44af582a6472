import { contentHash } from '@train-at-home/model';
import { auditCommitment, verifyAuditChoice } from '@train-at-home/incentives';
import { generateIdentity, type Identity } from '@train-at-home/protocol';
import { RoundRecorder, encodeRecord } from '@train-at-home/swarm';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';
import { ASSUMED_UPLOAD_BYTES_PER_SEC, MEASURED_UPLOAD_MIN_BYTES, PROVEN_STEPS, REPLAY_LOST_MS, auditDeadlineMs, roundWindow } from '../src/jobs/audits';

/**
 * The audit route against bad answers: late, truncated, unsigned or signed
 * by another key, for another round, stage or miner. Each gets its named
 * rejection and changes nothing (the audit stays open for the right
 * answer); and the draw of a closed round is verifiable by anyone.
 */
/** The run's hard bound: answers are taken this long past an audit's deadline. */
const GRACE_S = 120;
let app: App;
const miner: Identity = generateIdentity();
const other: Identity = generateIdentity();
const id = (i: Identity): string => i.publicKey.slice(2);

beforeAll(async () => {
  app = await buildApp({ database: await testDatabase(), run: { name: 'audits', preset: 'tiny', stages: 2, bottleneck: 32, int8: true, incentives: { auditGraceMs: GRACE_S * 1000 } } });
  for (const m of [miner, other]) {
    await app.db.query(`INSERT INTO miners (id, run_id, public_key, address, backend, tokens_per_sec, stage, status) VALUES ($1, $2, $3, $4, 'wasm', 1, 1, 'active')`, [
      id(m),
      app.coordinator.runId,
      m.publicKey,
      m.address,
    ]);
  }
});
afterAll(async () => app?.close());

function record(round: number, minerId = id(miner), stage = 1, weights = new Uint8Array(8)): Uint8Array {
  const r = new RoundRecorder(app.coordinator.runId, minerId, stage);
  r.start(round - 1, 'ab'.repeat(32), weights);
  r.ready(round);
  r.finish();
  return encodeRecord(r.find(round)!);
}

async function openAudit(round: number, minerId = id(miner), seconds = 60): Promise<string> {
  const auditId = randomBytes(16).toString('hex');
  await app.db.query(`INSERT INTO audits (id, run_id, stage, round, miner_id, status, deadline) VALUES ($1, $2, 1, $3, $4, 'open', now() + make_interval(secs => $5))`, [
    auditId,
    app.coordinator.runId,
    round,
    minerId,
    seconds,
  ]);
  return auditId;
}

async function put(auditId: string, bytes: Uint8Array, signer: Identity = miner, as = id(miner)) {
  const signature = signer.sign('audit', { runId: app.coordinator.runId, auditId, hash: contentHash(bytes) });
  return app.fastify.inject({ method: 'PUT', url: `/api/audits/${auditId}`, headers: { 'content-type': 'application/octet-stream', 'x-miner-id': as, 'x-signature': signature }, payload: Buffer.from(bytes) });
}

const status = async (auditId: string): Promise<string> => (await app.db.query<{ status: string }>('SELECT status FROM audits WHERE id = $1', [auditId]))[0]!.status;

describe('audit answers', () => {
  it('refuses each bad answer by name and leaves the audit open', async () => {
    const auditId = await openAudit(5);
    const good = record(5);
    // Truncated, and bytes that are not a record.
    expect((await put(auditId, good.subarray(0, good.length - 3))).json()).toMatchObject({ error: 'BAD_RECORD' });
    expect((await put(auditId, randomBytes(100))).json()).toMatchObject({ error: 'BAD_RECORD' });
    // Another round, another stage, another miner's record.
    expect((await put(auditId, record(4))).json()).toMatchObject({ error: 'WRONG_RECORD' });
    expect((await put(auditId, record(5, id(miner), 0))).json()).toMatchObject({ error: 'WRONG_RECORD' });
    expect((await put(auditId, record(5, id(other)))).json()).toMatchObject({ error: 'WRONG_RECORD' });
    // Signed by someone else, or sent as another miner: nobody can answer (and so fail) an audit for another.
    expect((await put(auditId, good, other)).statusCode).toBe(401);
    const asOther = await put(auditId, record(5, id(other)), other, id(other));
    expect(asOther.json()).toMatchObject({ error: 'NOT_YOUR_AUDIT' });
    expect(asOther.statusCode).toBe(403);
    // An audit never drawn.
    expect((await put(randomBytes(16).toString('hex'), good)).json()).toMatchObject({ error: 'NO_SUCH_AUDIT' });
    expect(await status(auditId)).toBe('open');
    // The right answer is taken once.
    expect((await put(auditId, good)).statusCode).toBe(202);
    expect((await put(auditId, good)).json()).toMatchObject({ error: 'NO_SUCH_AUDIT' });
  });

  it('takes a late answer until its hard bound and replays it, refuses one after, and fails an audit unanswered by then as unanswered while the miner is still here only', async () => {
    // 5 s past its deadline, within the grace: still open, taken, and replayed as any answer, its lateness kept.
    // (A miner still here waits for its hard bound at every tick: the swarm's audit-deadline.test.ts.)
    const late = await openAudit(6, id(miner), -5);
    expect((await put(late, record(6))).statusCode).toBe(202);
    const [{ detail }] = (await app.db.query<{ detail: { lateMs: number } }>('SELECT detail FROM audits WHERE id = $1', [late])) as [{ detail: { lateMs: number } }];
    expect(detail.lateMs).toBeGreaterThanOrEqual(5000);
    expect(await status(late)).not.toBe('open');
    // A miner that left (it has no socket here) is not waited for: its audit is closed at the deadline, nobody blamed.
    const left = await openAudit(9, id(miner), -1);
    await app.validator.audits.tick();
    expect(await status(left)).toBe('abandoned');
    // Past the hard bound: refused, and closed.
    const past = await openAudit(7, id(miner), -(GRACE_S + 1));
    await app.validator.audits.tick();
    expect((await put(past, record(7))).json()).toMatchObject({ error: 'NO_SUCH_AUDIT' });
    // The miner has no socket here: it left, so it is not blamed.
    expect(await status(past)).toBe('abandoned');
    expect(await app.db.query('SELECT 1 FROM flags WHERE miner_id = $1', [id(miner)])).toEqual([]);
  });

  it("gives each audit a deadline that follows the record's size and its miner's upload rate, measured on its last record's upload", async () => {
    // The allowance plus the upload: at the assumed rate until one is measured, then at the miner's own.
    expect(auditDeadlineMs(30_000, 6_250_000)).toBe(30_000 + (1000 * 6_250_000) / ASSUMED_UPLOAD_BYTES_PER_SEC);
    expect(auditDeadlineMs(30_000, 6_250_000, 62_500)).toBe(130_000);
    expect(auditDeadlineMs(30_000, 0, 62_500)).toBe(30_000);
    // An upload big enough to tell is measured: its size and rate are kept with the miner.
    const big = record(8, id(miner), 1, new Uint8Array(MEASURED_UPLOAD_MIN_BYTES));
    const auditId = await openAudit(8);
    expect((await put(auditId, big)).statusCode).toBe(202);
    const [kept] = await app.db.query<{ upload_bytes_per_sec: number; record_bytes: number }>('SELECT upload_bytes_per_sec, record_bytes FROM miners WHERE id = $1', [id(miner)]);
    expect(kept!.record_bytes).toBe(big.length);
    expect(kept!.upload_bytes_per_sec).toBeGreaterThan(0);
    // The next audit drawn for it is given its record's upload at that rate (a slow line: 50 kB/s), and says so.
    await app.db.query('UPDATE miners SET upload_bytes_per_sec = 50000 WHERE id = $1', [id(miner)]);
    await app.db.query(`INSERT INTO audit_rounds (run_id, stage, round, commitment, secret, rate, full_rate) VALUES ($1, 1, 40, $2, $3, 1, 1)`, [app.coordinator.runId, auditCommitment('22'.repeat(32)), '22'.repeat(32)]);
    await app.db.query(`INSERT INTO round_commitments (run_id, stage, round, miner_id, weights_hash, optimizer_hash, ready_at) VALUES ($1, 1, 40, $2, $3, $3, now())`, [app.coordinator.runId, id(miner), 'cd'.repeat(32)]);
    await app.validator.audits.roundClosed(1, 40, [id(miner)]);
    const [drawn] = await app.db.query<{ ms: number; detail: { recordBytes: number; queuedBytes: number; uploadBytesPerSec: number; deadlineMs: number; graceMs: number } }>(
      `SELECT (extract(epoch FROM deadline - created_at) * 1000)::int AS ms, detail FROM audits WHERE run_id = $1 AND stage = 1 AND round = 40`,
      [app.coordinator.runId],
    );
    const expected = auditDeadlineMs(app.coordinator.run.incentives.auditTimeoutMs, drawn!.detail.recordBytes, 50_000);
    // (No audit of it is open: nothing is queued ahead of this record.)
    expect(drawn!.detail).toEqual({ recordBytes: expect.any(Number), queuedBytes: 0, uploadBytesPerSec: 50_000, deadlineMs: expected, graceMs: GRACE_S * 1000 });
    expect(drawn!.detail.recordBytes).toBeGreaterThanOrEqual(big.length);
    expect(Math.abs(drawn!.ms - expected)).toBeLessThan(1000);
    // Drawn again while that one is open: its record uploads after that one's, and its deadline says so.
    await app.db.query(`INSERT INTO audit_rounds (run_id, stage, round, commitment, secret, rate, full_rate) VALUES ($1, 1, 42, $2, $3, 1, 1)`, [app.coordinator.runId, auditCommitment('33'.repeat(32)), '33'.repeat(32)]);
    await app.db.query(`INSERT INTO round_commitments (run_id, stage, round, miner_id, weights_hash, optimizer_hash, ready_at) VALUES ($1, 1, 42, $2, $3, $3, now())`, [app.coordinator.runId, id(miner), 'cd'.repeat(32)]);
    await app.validator.audits.roundClosed(1, 42, [id(miner)]);
    const [second] = await app.db.query<{ detail: { recordBytes: number; queuedBytes: number; deadlineMs: number } }>(`SELECT detail FROM audits WHERE run_id = $1 AND stage = 1 AND round = 42`, [app.coordinator.runId]);
    expect(second!.detail.queuedBytes).toBe(drawn!.detail.recordBytes);
    expect(second!.detail.deadlineMs).toBe(auditDeadlineMs(app.coordinator.run.incentives.auditTimeoutMs, drawn!.detail.recordBytes + second!.detail.recordBytes, 50_000));
  });

  it('publishes each round\'s commitment before it closes and its secret after, so anyone can check the draw', async () => {
    await app.validator.audits.commit(1, 9);
    const before = (await app.fastify.inject({ method: 'GET', url: '/api/audits?stage=1&round=9' })).json();
    expect(before.secret).toBeNull();
    await app.db.query(`INSERT INTO round_commitments (run_id, stage, round, miner_id, weights_hash, optimizer_hash, ready_at) VALUES ($1, 1, 9, $2, $3, $3, now()), ($1, 1, 9, $4, $3, $3, now())`, [
      app.coordinator.runId,
      id(miner),
      'cd'.repeat(32),
      id(other),
    ]);
    await app.validator.audits.roundClosed(1, 9, [id(miner), id(other)]);
    const after = (await app.fastify.inject({ method: 'GET', url: '/api/audits?stage=1&round=9' })).json();
    expect(after.commitment).toBe(before.commitment);
    expect(auditCommitment(after.secret)).toBe(after.commitment);
    const chosen = verifyAuditChoice({ commitment: after.commitment, secret: after.secret, stage: 1, round: 9, rate: after.rate, fullRate: after.fullRate, unproven: after.unproven, miners: after.committed });
    expect(after.audits.map((a: { miner: string }) => a.miner).sort()).toEqual(chosen.sort());
    // The next round's draw is committed as this one closes.
    expect((await app.fastify.inject({ method: 'GET', url: '/api/audits?stage=1&round=10' })).json().secret).toBeNull();
    expect((await app.fastify.inject({ method: 'GET', url: '/api/audits?stage=x&round=1' })).statusCode).toBe(400);
  });

  it('draws a replica with fewer than PROVEN_AUDITS audits passed (of rounds with PROVEN_STEPS microbatches) at the full rate when a backlog lowered the round\'s, and says so', async () => {
    const commitRound = async (round: number): Promise<void> => {
      // A round whose rate the validator's backlog lowered to nothing (the run's rate is 0.2).
      await app.db.query(`INSERT INTO audit_rounds (run_id, stage, round, commitment, secret, rate, full_rate) VALUES ($1, 1, $2, $3, $4, 0, 1)`, [app.coordinator.runId, round, auditCommitment('11'.repeat(32)), '11'.repeat(32)]);
      await app.db.query(`INSERT INTO round_commitments (run_id, stage, round, miner_id, weights_hash, optimizer_hash, ready_at) VALUES ($1, 1, $2, $3, $4, $4, now()), ($1, 1, $2, $5, $4, $4, now())`, [
        app.coordinator.runId,
        round,
        id(miner),
        'cd'.repeat(32),
        id(other),
      ]);
    };
    // A round's published draw: the replicas named unproven, and those anyone checking the reveal finds chosen.
    const publishedDraw = async (round: number): Promise<{ unproven: string[]; chosen: string[] }> => {
      const draw = (await app.fastify.inject({ method: 'GET', url: `/api/audits?stage=1&round=${round}` })).json();
      return { unproven: draw.unproven, chosen: verifyAuditChoice({ ...draw, stage: 1, round, miners: draw.committed }) };
    };
    const drawnIn = async (round: number): Promise<string[]> => (await app.db.query<{ miner_id: string }>('SELECT miner_id FROM audits WHERE run_id = $1 AND stage = 1 AND round = $2 ORDER BY miner_id', [app.coordinator.runId, round])).map((r) => r.miner_id);
    // The audits earlier tests left open are decided (their miners left): undecided ones count toward the draw's PROVEN_AUDITS.
    await app.db.query(`UPDATE audits SET status = 'abandoned' WHERE run_id = $1 AND status IN ('open', 'replaying')`, [app.coordinator.runId]);
    // Neither has passed PROVEN_AUDITS audits: both are drawn at the full rate (1 here), as the published draw shows.
    await commitRound(20);
    await app.validator.audits.roundClosed(1, 20, [id(miner), id(other)]);
    expect(await drawnIn(20)).toEqual([id(miner), id(other)].sort());
    const first = (await app.fastify.inject({ method: 'GET', url: '/api/audits?stage=1&round=20' })).json();
    expect(first).toMatchObject({ rate: 0, fullRate: 1 });
    expect(first.unproven.sort()).toEqual([id(miner), id(other)].sort());
    expect(verifyAuditChoice({ ...first, stage: 1, round: 20, miners: first.committed }).sort()).toEqual(await drawnIn(20));
    // Passed audits of rounds with too little work in them (fewer than PROVEN_STEPS microbatches trained) prove nothing: both are still drawn at the full rate.
    await app.db.query(`UPDATE audits SET status = 'passed', detail = $3 WHERE run_id = $1 AND stage = 1 AND round = 20 AND miner_id = $2`, [app.coordinator.runId, id(miner), JSON.stringify({ ops: 3, steps: PROVEN_STEPS - 1 })]);
    await app.db.query(`INSERT INTO audits (id, run_id, stage, round, miner_id, status, detail, deadline) VALUES ($1, $2, 1, 19, $3, 'passed', $4, now())`, [randomBytes(16).toString('hex'), app.coordinator.runId, id(miner), JSON.stringify({ ops: 1, steps: 0 })]);
    await commitRound(26);
    await app.validator.audits.roundClosed(1, 26, [id(miner), id(other)]);
    expect(await drawnIn(26)).toEqual([id(miner), id(other)].sort());
    // `miner` passes PROVEN_AUDITS audits of rounds with work: from then on it is drawn at the round's lowered rate (none here).
    // `other`'s two audits are drawn and not answered yet: they prove nothing, and it is drawn again.
    await app.db.query(`UPDATE audits SET detail = $3 WHERE run_id = $1 AND stage = 1 AND round IN (19, 20) AND miner_id = $2`, [app.coordinator.runId, id(miner), JSON.stringify({ ops: 2 * PROVEN_STEPS, steps: PROVEN_STEPS })]);
    await commitRound(22);
    await app.validator.audits.roundClosed(1, 22, [id(miner), id(other)]);
    expect(await drawnIn(22)).toEqual([id(other)]);
    expect(await publishedDraw(22)).toEqual({ unproven: [id(other)], chosen: [id(other)] });
    // Its records come: two of rounds with work replaying count while they replay (a new identity costs the validator
    // at most PROVEN_AUDITS replays at a time beyond the run's rate), one of a round with too little work does not.
    const replaying = async (round: number, steps: number): Promise<void> => {
      await app.db.query(`UPDATE audits SET status = 'replaying', detail = $4 WHERE run_id = $1 AND stage = 1 AND round = $2 AND miner_id = $3`, [app.coordinator.runId, round, id(other), JSON.stringify({ steps })]);
    };
    await replaying(20, PROVEN_STEPS);
    await replaying(22, PROVEN_STEPS - 1);
    await commitRound(24);
    await app.validator.audits.roundClosed(1, 24, [id(miner), id(other)]);
    expect(await drawnIn(24)).toEqual([id(other)]);
    await replaying(26, PROVEN_STEPS);
    await commitRound(28);
    await app.validator.audits.roundClosed(1, 28, [id(miner), id(other)]);
    expect(await drawnIn(28)).toEqual([]);
    expect((await app.fastify.inject({ method: 'GET', url: '/api/audits?stage=1&round=28' })).json().unproven).toEqual([]);
    // One of them is decided without proving anything (skipped: the validator's fault): `other` is drawn at the full rate again.
    await app.db.query(`UPDATE audits SET status = 'skipped', reason = 'VALIDATOR' WHERE run_id = $1 AND stage = 1 AND round = 26 AND miner_id = $2`, [app.coordinator.runId, id(other)]);
    await commitRound(30);
    await app.validator.audits.roundClosed(1, 30, [id(miner), id(other)]);
    expect(await drawnIn(30)).toEqual([id(other)]);
    expect(await publishedDraw(30)).toEqual({ unproven: [id(other)], chosen: [id(other)] });
  });

  it('asks the miner again for a record whose replay was lost with its process, and skips it, never flags, when it is not sent again', async () => {
    // Replaying in a process that is gone: nothing has marked it for REPLAY_LOST_MS.
    const lost = await openAudit(30);
    await app.db.query(`UPDATE audits SET status = 'replaying', replay_seen = now() - make_interval(secs => $2) WHERE id = $1`, [lost, REPLAY_LOST_MS / 1000 + 1]);
    // Replaying in a live process (marked just now): left alone.
    const live = await openAudit(31);
    await app.db.query(`UPDATE audits SET status = 'replaying', replay_seen = now() WHERE id = $1`, [live]);
    await app.validator.audits.tick();
    expect(await status(lost)).toBe('open');
    expect(await status(live)).toBe('replaying');
    // The miner answers again: its record is taken (and replayed) as any answer is.
    expect((await put(lost, record(30))).statusCode).toBe(202);
    expect(await status(lost)).not.toBe('open');
    // Another lost one whose miner no longer keeps the record: past its new deadline it is skipped (the validator lost it: no grace is waited out), the miner not flagged.
    const gone = await openAudit(32);
    await app.db.query(`UPDATE audits SET status = 'replaying', replay_seen = now() - make_interval(secs => $2) WHERE id = $1`, [gone, REPLAY_LOST_MS / 1000 + 1]);
    await app.validator.audits.tick();
    expect(await status(gone)).toBe('open');
    await app.db.query(`UPDATE audits SET deadline = now() - interval '1 second' WHERE id = $1`, [gone]);
    await app.validator.audits.tick();
    expect(await app.db.query('SELECT status, reason FROM audits WHERE id = $1', [gone])).toEqual([{ status: 'skipped', reason: 'VALIDATOR' }]);
    expect(await app.db.query('SELECT 1 FROM flags WHERE miner_id = $1', [id(miner)])).toEqual([]);
  });
});

describe("an audited round's window of sends", () => {
  const t = (s: number): Date => new Date(Date.UTC(2026, 10, 28, 20, 36, s));
  it('starts at the report of its anchor merge; else after its previous merge-ready and not before the anchor round closed; else when the stage was given', () => {
    expect(roundWindow({ anchorRound: 3, anchorMerged: t(40).toISOString(), anchorEnded: t(41), previousReady: t(30), given: t(0) })).toEqual({ from: t(40).toISOString(), by: 'anchor-merged' });
    expect(roundWindow({ anchorRound: 3, anchorEnded: t(41), previousReady: t(30), given: t(0) })).toEqual({ from: t(41).toISOString(), by: 'anchor-closed' });
    expect(roundWindow({ anchorRound: 3, anchorEnded: t(20), previousReady: t(30), given: t(0) })).toEqual({ from: t(30).toISOString(), by: 'previous-ready' });
    // Taken up from a checkpoint of a round that closed before the miner came: from when it was given the stage.
    expect(roundWindow({ anchorRound: 3, anchorEnded: t(2), given: t(5) })).toEqual({ from: t(5).toISOString(), by: 'stage-given' });
    expect(roundWindow({ anchorRound: 0, given: t(5) })).toEqual({ from: t(5).toISOString(), by: 'stage-given' });
  });
  it('of a replica that never committed a round before (a late merge-ready refused), starts when its anchor round closed, not when it was given the stage', () => {
    // Seen in e2e/webgpu.test.ts under load: a SwiftShader tab's merge-ready for round 2 came after the round went on
    // without it; it committed round 3 from its own end state of round 2. Its sends of rounds 1 and 2 (paid to nobody:
    // it committed neither) are not this round's.
    expect(roundWindow({ anchorRound: 2, anchorEnded: t(82), given: t(5) })).toEqual({ from: t(82).toISOString(), by: 'anchor-closed' });
  });
  it("of the first round a restarted miner's new process committed, starts at the restart: its previous process's sends are in no record it has", () => {
    // e2e/webgpu.test.ts's drill: the tab's GPU device is lost mid-round and a new miner goes on on WASM under the same key.
    expect(roundWindow({ anchorRound: 3, anchorMerged: t(40).toISOString(), anchorEnded: t(41), previousReady: t(30), given: t(0), restarted: t(50) })).toEqual({ from: t(50).toISOString(), by: 'restarted' });
    // A restart before the round's own start bounds nothing.
    expect(roundWindow({ anchorRound: 3, anchorMerged: t(40).toISOString(), restarted: t(35) })).toEqual({ from: t(40).toISOString(), by: 'anchor-merged' });
  });
});
