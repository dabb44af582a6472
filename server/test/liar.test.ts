import { BLOCK, MSG, Miner, decodeMessage, encodeMessage, type MinerOptions } from '@train-at-home/swarm';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { App } from '../src/app';
import { verifiedWork } from '../src/jobs/accounting';
import { listeningCoordinator, localMiner } from '@train-at-home/testkit/miner-processes';

let app: App;
let url: string;
const miners: Miner[] = [];

beforeAll(async () => {
  // Audits drawn next to never (0 turns the draw off), new replicas included: the cases here are about merges, and the
  // two that need a round audited commit that round to a draw at rate 1 themselves. At the default rates every round
  // of the six new replicas was drawn until each was proven, and those cases first waited for the validator to work
  // the backlog off (109 s of a 255 s file on this machine).
  ({ app, url } = await listeningCoordinator({
    name: 'liar',
    preset: 'tiny',
    stages: 2,
    bottleneck: 32,
    training: { batchSize: 4 },
    merge: { every: 3, precision: 'fp16', readyMs: 20_000, senderMs: 8_000, reducerMs: 4_000, roundMs: 30_000 },
    incentives: { auditRate: 1e-9, unprovenAuditRate: 1e-9 },
  }));
});
afterAll(async () => {
  miners.forEach((m) => m.stop());
  await app.close();
});

function newMiner(extra: Partial<MinerOptions> = {}): Miner {
  const miner = localMiner(url, extra);
  miners.push(miner);
  return miner;
}

/** A lying owner: every reduced partition it sends out is scaled by 1.5 (its fp16 block scales are). */
function scaleResults(_to: string, bytes: Uint8Array): Uint8Array {
  const m = decodeMessage(bytes);
  if (m.type !== MSG.result) return bytes;
  const values = m.values.slice();
  const view = new DataView(values.buffer);
  const blocks = Math.ceil(values.length / (2 * BLOCK + 4));
  for (let b = 0; b < blocks && 4 * b + 4 <= values.length; b++) view.setFloat32(4 * b, view.getFloat32(4 * b, true) * 1.5, true);
  return encodeMessage({ ...m, values });
}

describe('a lying owner in a real merge', () => {
  it('is caught by every honest replica, the true values are used, and the coordinator records the liar', async () => {
    // Three replicas per stage; one of stage 0's lies.
    const all = [newMiner(), newMiner(), newMiner({ tamperAllReduce: scaleResults }), newMiner(), newMiner(), newMiner()];
    for (const m of all) await m.start();
    expect(all.map((m) => m.registration!.stage)).toEqual([0, 1, 0, 1, 0, 1]);
    const liar = all[2]!;
    const [first, third] = [all[0]!, all[4]!];
    const replicas = [first, liar, third];
    await expect
      .poll(() => replicas.every((m) => m.merges.some((r) => r.participants === 3)), { timeout: 240_000, interval: 500 })
      .toBe(true)
      .catch(async (e: unknown) => {
        console.log(JSON.stringify(replicas.map((m) => m.merges.map((r) => [r.round, r.participants, r.mode, r.ok]))));
        console.log(JSON.stringify((await app.fastify.inject({ method: 'GET', url: '/api/merges' })).json()).slice(0, 3000));
        throw e;
      });

    const round = replicas.map((m) => m.merges.find((r) => r.participants === 3)!);
    // All three hold the same weights: the honest owners' values won; the liar itself computed honestly.
    expect(new Set(round.map((r) => r.hash)).size).toBe(1);
    const liarId = liar.registration!.minerId;
    for (const r of [round[0]!, round[2]!]) {
      expect(r.evidence.length).toBeGreaterThan(0);
      for (const e of r.evidence) {
        expect(e.owners).toContain(liarId);
        expect(e.liar).toBe(liarId);
      }
    }
    type Event = { kind: string; stage: number; round: number; minerId: string | null; reporter: string };
    const recorded = async (): Promise<{ events: Event[]; disputes: Event[]; fromAudited: Event[] }> => {
      const { events, rounds } = (await app.fastify.inject({ method: 'GET', url: '/api/merges' })).json();
      const disputes = (events as Event[]).filter((e) => e.kind === 'dispute');
      const audited = new Set((rounds as Array<{ stage: number; round: number; participants: string[] | null }>).filter((r) => r.stage === 0 && r.participants?.length === 3).map((r) => r.round));
      return { events, disputes, fromAudited: disputes.filter((e) => e.stage === 0 && audited.has(e.round)) };
    };
    // The replicas' reports reach the coordinator after their own merge ends: wait for them to be stored.
    await expect.poll(async () => (await recorded()).fromAudited.length, { timeout: 30_000, interval: 250 }).toBeGreaterThan(0);
    const { events, disputes, fromAudited } = await recorded();
    // An honest replica is never accused. (A round that only two replicas made has no auditor:
    // its disputes are recorded without a culprit.)
    expect(disputes.every((e) => e.minerId === liarId || e.minerId === null)).toBe(true);
    expect(fromAudited.every((e) => e.minerId === liarId)).toBe(true);
    // Reported by honest replicas only (under load a receiver may see one owner's result only in time).
    const honest = [first.registration!.minerId, third.registration!.minerId];
    expect(fromAudited.every((e) => honest.includes(e.reporter))).toBe(true);
    expect(events.filter((e: { kind: string }) => e.kind === 'hash-mismatch')).toEqual([]);
  });

  it('a merge report lost with its connection is sent again once the miner is back, and the weights it reports are stored', async () => {
    // Stage 2's replicas (honest, already merging): the next merge report of one of them is lost on its way, with its connection.
    const [miner] = miners.filter((m) => m.registration?.stage === 1);
    const minerId = miner!.registration!.minerId;
    const socket = app.coordinator.sockets.get(minerId)!;
    let lost: number | undefined;
    socket.use(([event, payload], next) => {
      if (event !== 'merged' || lost !== undefined || !(payload as { ok: boolean }).ok) return next();
      lost = (payload as { round: number }).round;
      socket.conn.close(); // the packet goes nowhere, like one in flight when a home connection drops
    });
    const rejoined = miner!.rejoined;
    await expect.poll(() => lost, { timeout: 240_000, interval: 500 }).toBeDefined();
    const outcome = await vi.waitUntil(() => miner!.merges.find((m) => m.stage === 1 && m.round === lost), { timeout: 10_000 });
    // Back with the coordinator, the miner sends it again, before the receipts of its next round, and it is stored.
    const stored = async (): Promise<string | null> =>
      (await app.db.query<{ hash: string | null }>('SELECT merged_hashes ->> $1 AS hash FROM epochs WHERE run_id = $2 AND stage = 1 AND epoch = $3', [minerId, app.coordinator.runId, lost]))[0]?.hash ?? null;
    await expect.poll(stored, { timeout: 60_000, interval: 250 }).toBe(outcome.hash);
    expect(miner!.rejoined).toBeGreaterThan(rejoined);
  });

  it('a merge-ready that arrives after the round went on without the replica is refused; its record goes on as one round, so its next round commits from where that one began and passes its audit', { timeout: 900_000 }, async () => {
    // A slow tab's shape (seen on SwiftShader under load): its merge-ready leaves just before the ready window
    // closes, merge-go (without it) reaches it before the refusal, and training resumes. Its round's record, closed
    // for that merge-ready, must go on: else the next round starts from the refused one, and the sends of the closed
    // record fall in no record an audit draws (an honest replica failed AUDIT_INCOMPLETE so).
    const replicas = miners.filter((m) => m.registration?.stage === 0);
    const late = replicas[1]!;
    const lateId = late.registration!.minerId;
    // The validator first works off any backlog, drawing nothing meanwhile, so the round after the target is drawn at
    // the full rate and its replay is not queued behind others. (At this run's rates there is next to none: at the
    // default ones the draws of new replicas took 109 s to work off; run after the next case, which drew every round
    // of stage 2, it waited 362 s, and its audit waited past 240 s in a loaded CI run.)
    const { auditRate, unprovenAuditRate } = app.coordinator.run.incentives;
    app.coordinator.run.incentives.auditRate = 0;
    const backlog = async (): Promise<number> => (await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM audits WHERE run_id = $1 AND status IN ('open', 'replaying')`, [app.coordinator.runId]))[0]!.n;
    const draining = Date.now();
    await expect.poll(backlog, { timeout: 300_000, interval: 1000 }).toBe(0);
    console.log(`liar: the validator's backlog worked off in ${Math.round((Date.now() - draining) / 1000)} s`);
    // From here nothing is drawn but the round under test: the run's rates next to nothing (0 turns the draw off), and
    // stage 0's round after the target committed, before it closes, to a draw at rate 1 (its audit_rounds row, as the
    // coordinator writes it at that rate). Its audit is then certain and queued behind no other, and the validator
    // is left no backlog for the cases after. (Drawing every round of both stages at rate 1 instead, the next case
    // waited 150 s for that backlog before it could begin.)
    app.coordinator.run.incentives.auditRate = 1e-9;
    app.coordinator.run.incentives.unprovenAuditRate = 1e-9;
    const target = app.coordinator.phases.status()[0]!.round + 1;
    const arm = setInterval(() => {
      void app.db.query(`UPDATE audit_rounds SET rate = 1, full_rate = 1 WHERE run_id = $1 AND stage = 0 AND round = $2 AND revealed_at IS NULL`, [app.coordinator.runId, target + 1]);
    }, 200);
    const readyMs = app.coordinator.run.merge.readyMs;
    // A short ready window for the target round (the others answer within it); the late one's merge-ready is held
    // until merge-go went out without it, well within its own request's 10 s.
    app.coordinator.run.merge.readyMs = 6_000;
    const went = async (): Promise<boolean> =>
      (await app.db.query('SELECT 1 FROM epochs WHERE run_id = $1 AND stage = 0 AND epoch = $2 AND mode IS NOT NULL', [app.coordinator.runId, target])).length > 0;
    app.coordinator.sockets.get(lateId)!.use(([event, payload], next) => {
      if (event !== 'merge-ready' || (payload as { round: number }).round !== target) return next();
      void (async () => {
        while (!(await went())) await new Promise((r) => setTimeout(r, 50));
        next();
      })();
    });
    await expect.poll(went, { timeout: 240_000, interval: 250 }).toBe(true);
    // The round after it waits for every replica's merge-ready (both are live, so the window closes when the second
    // answers, not at its end): the late one takes part in that merge, so its round is certain to be drawn.
    app.coordinator.run.merge.readyMs = 120_000;
    const [round] = await app.db.query<{ participants: string[] | string }>('SELECT participants FROM epochs WHERE run_id = $1 AND stage = 0 AND epoch = $2', [app.coordinator.runId, target]);
    const participants = typeof round!.participants === 'string' ? JSON.parse(round!.participants) : round!.participants;
    expect(participants).not.toContain(lateId);
    expect(participants.length).toBeGreaterThanOrEqual(1);
    // Refused, nothing of it was committed; its next round's commitment starts where its round began before the target.
    const commitment = async (r: number) =>
      (await app.db.query<{ start_round: number | null }>('SELECT start_round FROM round_commitments WHERE run_id = $1 AND stage = 0 AND round = $2 AND miner_id = $3', [app.coordinator.runId, r, lateId]))[0];
    await expect.poll(() => commitment(target + 1), { timeout: 240_000, interval: 500 }).toBeDefined();
    expect(await commitment(target)).toBeUndefined();
    expect((await commitment(target + 1))!.start_round).toBeLessThan(target);
    // Drawn (its round committed at rate 1 above), its audit passes.
    const audit = async () =>
      (await app.db.query<{ status: string; reason: string | null; detail: unknown }>('SELECT status, reason, detail FROM audits WHERE run_id = $1 AND stage = 0 AND round = $2 AND miner_id = $3', [app.coordinator.runId, target + 1, lateId]))[0];
    const closed = async () => (await app.db.query('SELECT 1 FROM epochs WHERE run_id = $1 AND stage = 0 AND epoch = $2 AND ended_at IS NOT NULL', [app.coordinator.runId, target + 1])).length > 0;
    await expect.poll(closed, { timeout: 240_000, interval: 500 }).toBe(true).finally(() => clearInterval(arm));
    app.coordinator.run.merge.readyMs = readyMs;
    const [draw] = await app.db.query<{ rate: number; participants: string[] | string }>(
      'SELECT a.rate, e.participants FROM audit_rounds a JOIN epochs e ON e.run_id = a.run_id AND e.stage = a.stage AND e.epoch = a.round WHERE a.run_id = $1 AND a.stage = 0 AND a.round = $2',
      [app.coordinator.runId, target + 1],
    );
    const merged = typeof draw!.participants === 'string' ? JSON.parse(draw!.participants) : draw!.participants;
    console.log(`liar: round ${target + 1}'s draw at rate ${draw!.rate}, participants ${JSON.stringify(merged)}`);
    // Committed at rate 1, and the late replica took part in its merge: it is drawn, and its audit passes.
    expect(draw!.rate).toBe(1);
    expect(merged).toContain(lateId);
    await expect.poll(audit, { timeout: 60_000, interval: 500 }).toBeDefined();
    await expect.poll(async () => (await audit())!.status, { timeout: 300_000, interval: 1000 }).not.toMatch(/^(open|replaying)$/);
    const a = (await audit())!;
    expect([a.status, a.reason], JSON.stringify(a.detail)).toEqual(['passed', null]);
    // Its work in the refused round is paid, not lost to the race: the record of the round after, which starts where
    // the refused one began, carries that work, and its replay (passed above) checked it.
    const ends = await app.db.query<{ epoch: number; ended_at: Date }>('SELECT epoch, ended_at FROM epochs WHERE run_id = $1 AND stage = 0 AND epoch = ANY($2::int[])', [app.coordinator.runId, [target - 1, target]]);
    const [from, to] = [ends.find((e) => e.epoch === target - 1)?.ended_at ?? new Date(0), ends.find((e) => e.epoch === target)!.ended_at];
    const { work } = await verifiedWork(app.db, app.coordinator.runId, new Date(from), new Date(to));
    console.log(`liar: verified work in the refused round ${target}: ${JSON.stringify(Object.fromEntries([...work].map(([id, n]) => [id.slice(0, 8), n])))}`);
    expect(work.get(lateId) ?? 0).toBeGreaterThan(0);
    Object.assign(app.coordinator.run.incentives, { auditRate, unprovenAuditRate });
  });

  it('a round whose start was never reported (every report of its merge lost) is audited from the start committed with merge-ready', async () => {
    // Stage 2's three honest replicas, every one drawn in the rounds under test, and nobody in others: the run's rate is
    // set next to nothing (0 turns the draw off), the validator works off what it holds, and each round that begins
    // from an unreported merge is committed, before it closes, to a draw at rate 1 (its audit_rounds row, as the
    // coordinator writes it at that rate). Drawing every round of both stages at rate 1 instead, the validator fell
    // behind with each round, and the audit this waits for was decided 270 s in (more in the fresh-clone CI).
    const replicas = miners.filter((m) => m.registration?.stage === 1);
    expect(replicas.length).toBe(3);
    const ids = replicas.map((m) => m.registration!.minerId);
    const { auditRate, unprovenAuditRate } = app.coordinator.run.incentives;
    // Both rates: a replica not yet proven (fewer than PROVEN_AUDITS passed) is drawn at the unproven rate whatever the
    // run's, so with the run's rate alone lowered every round of such replicas was still drawn, the validator's backlog
    // never emptied on a slow machine, and the wait below ran out (a fresh machine's CI, 301 s).
    app.coordinator.run.incentives.auditRate = 1e-9;
    app.coordinator.run.incentives.unprovenAuditRate = 1e-9;
    // What the validator still holds from the cases before is worked off while the rounds under test go by (about
    // three merge rounds before the first of them is drawn): waiting for it first added its whole length (88 s in a
    // fresh-clone CI run) to this case.
    const backlog = (await app.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM audits WHERE run_id = $1 AND status IN ('open', 'replaying')`, [app.coordinator.runId]))[0]!.n;
    console.log(`liar: ${backlog} audits still open or replaying as reports start being lost`);
    // From the next merge round on, every other round's reports go nowhere, with the connections up: nobody sends
    // one again, such a round has no agreed weights, and the weights the round after it starts from were reported by
    // nobody. (The rounds between are reported: only replicas that merged with the majority are drawn.)
    const lost = app.coordinator.phases.status()[1]!.round + 1;
    for (const id of ids) {
      app.coordinator.sockets.get(id)!.use(([event, payload], next) => {
        const round = event === 'merged' ? (payload as { round: number }).round : -1;
        if (round >= lost && (round - lost) % 2 === 0) return;
        next();
      });
    }
    type Audit = { round: number; miner_id: string; status: string; reason: string | null; detail: unknown };
    const audited = async ({ decided }: { decided: boolean }): Promise<Audit[]> =>
      app.db.query<Audit>(
        `SELECT round, miner_id, status, reason, detail FROM audits WHERE stage = 1 AND round > $1 AND (round - $1) % 2 = 1 AND miner_id = ANY($2::text[])
           AND (NOT $3 OR status NOT IN ('open', 'replaying')) ORDER BY round`,
        [lost, ids, decided],
      );
    // Audits of rounds that began from an unreported merge, drawn, then answered and replayed.
    const started = Date.now();
    const arm = setInterval(() => {
      void app.db.query(`UPDATE audit_rounds SET rate = 1, full_rate = 1 WHERE run_id = $1 AND stage = 1 AND round > $2 AND (round - $2) % 2 = 1 AND revealed_at IS NULL`, [app.coordinator.runId, lost]);
    }, 200);
    await expect
      .poll(async () => (await audited({ decided: false })).length, { timeout: 480_000, interval: 1000 })
      .toBeGreaterThanOrEqual(1)
      .finally(() => clearInterval(arm));
    console.log(`liar: an audit of a round begun from an unreported merge drawn after ${Math.round((Date.now() - started) / 1000)} s`);
    await expect
      .poll(async () => (await audited({ decided: true })).length, { timeout: 480_000, interval: 1000 })
      .toBeGreaterThanOrEqual(1)
      .catch(async (e: unknown) => {
        console.log(`liar: reports lost from round ${lost}; rounds now ${JSON.stringify(app.coordinator.phases.status())}`);
        console.log(`liar: audits ${JSON.stringify(await app.db.query('SELECT round, miner_id, status, reason FROM audits WHERE stage = 1 AND round >= $1 ORDER BY round', [lost]))}`);
        console.log(`liar: rounds ${JSON.stringify(await app.db.query('SELECT epoch, participants, merged_hash, merged_hashes FROM epochs WHERE stage = 1 AND epoch >= $1 ORDER BY epoch', [lost]))}`);
        throw e;
      });
    console.log(`liar: and decided after ${Math.round((Date.now() - started) / 1000)} s`);
    const audits = await audited({ decided: true });
    expect(audits.map((a) => [a.status, a.reason]), JSON.stringify(audits)).toEqual(audits.map(() => ['passed', null]));
    let fromMerged = 0;
    for (const a of audits) {
      // The round began where the replica committed, with merge-ready, that it began: a merge round whose report never arrived.
      const [start] = await app.db.query<{ start_round: number; start_hash: string }>('SELECT start_round, start_hash FROM round_commitments WHERE stage = 1 AND round = $1 AND miner_id = $2', [a.round, a.miner_id]);
      expect(start!.start_round).toBeGreaterThanOrEqual(lost);
      const [anchor] = await app.db.query<{ agreed: string | null; reported: string | null; own: string | null }>(
        `SELECT merged_hash AS agreed, merged_hashes ->> $3 AS reported, (SELECT weights_hash FROM round_commitments c WHERE c.stage = $1 AND c.round = $2 AND c.miner_id = $3) AS own
         FROM epochs WHERE stage = $1 AND epoch = $2`,
        [1, start!.start_round, a.miner_id],
      );
      expect(anchor).toMatchObject({ agreed: null, reported: null });
      // Its weights after that merge (not its own end state, as after a merge that failed here): replayed only from this commitment.
      const merge = replicas.find((m) => m.registration!.minerId === a.miner_id)!.merges.find((m) => m.stage === 1 && m.round === start!.start_round && m.ok);
      if (merge && start!.start_hash === merge.hash && start!.start_hash !== anchor!.own) fromMerged++;
    }
    expect(fromMerged).toBeGreaterThan(0);
    Object.assign(app.coordinator.run.incentives, { auditRate, unprovenAuditRate });
  });
  it('a merge-ready the coordinator stored but did not answer in time (or took after the miner gave up on it) still commits the round: the replica takes part in the merge and holds the agreed weights', async () => {
    // Stage 1's honest replicas (stage 2's merge reports are being lost on purpose by the test before). One's
    // merge-ready is taken at once but answered after the miner's 10 s request timeout; another's is held 11 s before
    // the coordinator reads it (the miner has given up on it by then). Both are stored, so both are named in merge-go:
    // a replica that took an unanswered merge-ready for a refusal went back to training in a round the coordinator
    // holds committed, and missed the merge (or, with merge-go already in, trained in the middle of it, and the steps
    // it took then were lost from its next round's record: an honest miner failed that audit AUDIT_INCOMPLETE).
    const replicas = miners.filter((m) => m.registration?.stage === 0);
    const [late, held] = [replicas[0]!, replicas[2]!].map((m) => m.registration!.minerId);
    const target = app.coordinator.phases.status()[0]!.round + 2;
    const isTarget = (event: string, payload: unknown): boolean => event === 'merge-ready' && (payload as { round: number }).round === target;
    app.coordinator.sockets.get(late!)!.use((packet, next) => {
      const ack = packet[packet.length - 1];
      if (isTarget(packet[0], packet[1]) && typeof ack === 'function') packet[packet.length - 1] = (...reply: unknown[]) => setTimeout(() => ack(...reply), 12_000);
      next();
    });
    app.coordinator.sockets.get(held!)!.use((packet, next) => {
      if (isTarget(packet[0], packet[1])) setTimeout(next, 11_000);
      else next();
    });
    // The round goes through with all three, and each reports the agreed weights.
    const merged = (m: Miner) => m.merges.find((r) => r.stage === 0 && r.round === target);
    await expect.poll(() => replicas.every((m) => merged(m)), { timeout: 240_000, interval: 500 }).toBe(true);
    for (const m of replicas) expect(merged(m), JSON.stringify(m.merges.slice(-3))).toMatchObject({ ok: true, participants: 3 });
    const closed = async () =>
      (
        await app.db.query<{ agreed: string | null; hashes: Record<string, string> | string }>(
          'SELECT merged_hash AS agreed, merged_hashes AS hashes FROM epochs WHERE run_id = $1 AND stage = 0 AND epoch = $2 AND ended_at IS NOT NULL',
          [app.coordinator.runId, target],
        )
      )[0];
    // The coordinator closes the round once the reports are in.
    await expect.poll(closed, { timeout: 60_000, interval: 250 }).toBeDefined();
    const round = await closed();
    const hashes = typeof round!.hashes === 'string' ? JSON.parse(round!.hashes) : round!.hashes;
    expect(round!.agreed).not.toBeNull();
    expect([hashes[late!], hashes[held!]]).toEqual([round!.agreed, round!.agreed]);
  });

  it('a replica that sends its merge partners other bytes than the contribution it committed to is refused by both owners and flagged COMMITMENT_MISMATCH; nobody else is', async () => {
    // It commits honestly with merge-ready (its Merkle roots), then alters every slice it sends: one byte.
    const altered = (_to: string, bytes: Uint8Array): Uint8Array => {
      const m = decodeMessage(bytes);
      if (m.type !== MSG.contribution) return bytes;
      const values = m.values.slice();
      values[0] = values[0]! ^ 0x01;
      return encodeMessage({ ...m, values });
    };
    const cheat = newMiner({ tamperAllReduce: altered });
    await cheat.start();
    const id = cheat.registration!.minerId;
    type Flag = { miner_id: string; kind: string; evidence: { stage: number; round: number; partition: number; owners: string[] } | string };
    const flagged = async (): Promise<Flag[]> => app.db.query<Flag>(`SELECT miner_id, kind, evidence FROM flags WHERE run_id = $1 AND kind = 'COMMITMENT_MISMATCH'`, [app.coordinator.runId]);
    await expect.poll(async () => (await flagged()).length, { timeout: 240_000, interval: 500 }).toBeGreaterThan(0);
    const flags = await flagged();
    expect(flags.map((f) => f.miner_id)).toEqual([id]);
    // The evidence: both owners of a partition of a round it took part in said so.
    const evidence = typeof flags[0]!.evidence === 'string' ? JSON.parse(flags[0]!.evidence) : flags[0]!.evidence;
    expect(evidence.owners).toHaveLength(2);
    expect(evidence.owners).not.toContain(id);
    const reports = await app.db.query<{ reporter: string }>(
      `SELECT reporter FROM merge_events WHERE run_id = $1 AND stage = $2 AND round = $3 AND kind = 'commitment-mismatch' AND miner_id = $4 AND (detail ->> 'partition')::int = $5`,
      [app.coordinator.runId, evidence.stage, evidence.round, id, evidence.partition],
    );
    expect(new Set(reports.map((r) => r.reporter))).toEqual(new Set(evidence.owners));
    // Only the cheat's slices were ever refused.
    const refusals = await app.db.query<{ miner_id: string }>(`SELECT DISTINCT miner_id FROM merge_events WHERE run_id = $1 AND kind = 'commitment-mismatch'`, [app.coordinator.runId]);
    expect(refusals.map((r) => r.miner_id)).toEqual([id]);
    // Flagged, it is out of the run.
    const [row] = await app.db.query<{ status: string }>('SELECT status FROM miners WHERE id = $1 AND run_id = $2', [id, app.coordinator.runId]);
    expect(row!.status).toBe('flagged');
  });
});
