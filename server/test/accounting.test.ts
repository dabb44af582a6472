import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../src/app';
import { listeningCoordinator } from '@train-at-home/testkit/miner-processes';
import { recordMicrobatch } from '@train-at-home/testkit/work';
import { verifiedWork } from '../src/jobs/accounting';

/**
 * What counts as work, on the real database: a run of its own, written the
 * way the pipeline, the phases and the audit draw record it, read back by
 * verifiedWork (the settlement's accounting).
 */
let app: App;
let runId: number;
const base = Date.now() - 3_600_000;
const at = (minutes: number): Date => new Date(base + minutes * 60_000);
const id = (): string => randomBytes(32).toString('hex');
const [A, B1, B2, C] = [id(), id(), id(), id()];

beforeAll(async () => {
  ({ app } = await listeningCoordinator({ name: 'accounting', preset: 'tiny', stages: 3, bottleneck: 32, incentives: { auditRate: 0 } }));
  [{ id: runId }] = await app.db.query<{ id: number }>(`INSERT INTO runs (name, config) VALUES ('accounting-seeded', '{}') RETURNING id`);
  for (const [miner, stage] of [[A, 0], [B1, 1], [B2, 1], [C, 2]] as const) {
    await app.db.query(`INSERT INTO miners (id, run_id, public_key, address, backend, tokens_per_sec, stage, status) VALUES ($1, $2, $3, $1, 'wasm', 1, $4, 'left')`, [miner, runId, `0x${miner}`, stage]);
  }
});
afterAll(() => app?.close());

/** `n` microbatches along `pathway` whose losses arrived at `when`, every transfer confirmed by both ends. */
async function work(pathway: string[], n: number, when: Date): Promise<void> {
  for (let i = 0; i < n; i++) await recordMicrobatch(app.db, runId, pathway, { at: when });
}

/** Stage 1's round `round` closes at `ended` with agreed weights `hash`; `reported` maps each replica to the hash it reported. */
async function close(round: number, ended: Date, hash: string, reported: Record<string, string>): Promise<void> {
  await app.db.query(`INSERT INTO epochs (run_id, stage, epoch, phase, started_at, ended_at, merged_hash, merged_hashes) VALUES ($1, 1, $2, 'training', $3, $3, $4, $5)`, [runId, round, ended, hash, JSON.stringify(reported)]);
}
const draw = (round: number, rate: number): Promise<unknown> =>
  app.db.query(`INSERT INTO audit_rounds (run_id, stage, round, commitment, secret, rate) VALUES ($1, 1, $2, 'c', 's', $3)`, [runId, round, rate]);
const commit = (round: number, miner: string): Promise<unknown> =>
  app.db.query(`INSERT INTO round_commitments (run_id, stage, round, miner_id, weights_hash, optimizer_hash, ready_at) VALUES ($1, 1, $2, $3, 'w', 'o', $4)`, [runId, round, miner, at(round * 2)]);
const paid = async (from: Date, to: Date): Promise<Record<string, number>> => Object.fromEntries((await verifiedWork(app.db, runId, from, to)).work);

describe('work accounting', () => {
  it('pays work only where an audit could have drawn it: committed with merge-ready and merged to the agreed weights, in a round that has closed', async () => {
    // Round 1 of stage 1 (minutes 0–2), drawn at rate 0.5: B1 committed and merged; B2 trained beside it but never committed.
    await draw(1, 0.5);
    await work([A, B1, C], 3, at(1));
    await work([A, B2, C], 4, at(1));
    await commit(1, B1);
    await close(1, at(2), 'h1', { [B1]: 'h1' });
    // Round 2 (minutes 2–4), drawn too: still open, so nobody in stage 1 could be drawn in it yet.
    await draw(2, 0.5);
    await work([A, B1, C], 2, at(3));
    await work([A, B2, C], 2, at(3));
    // Stages 0 and 2 had no draw: their miners are paid every verified microbatch, as before.
    expect(await paid(at(0), at(2))).toEqual({ [A]: 7, [B1]: 3, [C]: 7 });
    expect(await paid(at(2), at(4))).toEqual({ [A]: 4, [C]: 4 });

    // Round 2 closes: B1 committed and merged; B2 committed but ended on other weights (it is also disputed, 'hash-mismatch').
    await commit(2, B1);
    await commit(2, B2);
    await close(2, at(4), 'h2', { [B1]: 'h2', [B2]: 'other' });
    expect(await paid(at(2), at(4))).toEqual({ [A]: 4, [B1]: 2, [C]: 4 });

    // Round 3 (minutes 4–6) had no draw (audits were off, or it began before this coordinator did): paid as verified.
    await work([A, B2, C], 5, at(5));
    expect(await paid(at(4), at(6))).toEqual({ [A]: 5, [B2]: 5, [C]: 5 });
  });

  it("leaves unpaid what a miner's restart left unauditable: its previous process's work in the round under way, and, with an audit open then, all its work before it", async () => {
    const restart = (when: Date, forfeited: number): Promise<unknown> =>
      app.db.query('INSERT INTO miner_restarts (run_id, miner_id, at, stage, forfeited) VALUES ($1, $2, $3, 1, $4)', [runId, B1, when, forfeited]);
    const before = await paid(at(0), at(4));
    // Round 4 (minutes 6–8): B1's process restarts at minute 7; the new one's work after it is committed and merged.
    await draw(4, 0.5);
    await work([A, B1, C], 2, at(6.5));
    await restart(at(7), 0);
    await work([A, B1, C], 3, at(7.5));
    await commit(4, B1);
    await close(4, at(8), 'h4', { [B1]: 'h4' });
    expect(await paid(at(6), at(8))).toEqual({ [A]: 5, [B1]: 3, [C]: 5 });
    expect(await paid(at(0), at(4))).toEqual(before);
    // Round 5 (minutes 8–10): it restarts again after the round closed, with an audit of it open (forfeited): none of its
    // work before then is paid, in any round not settled yet; its partners' is.
    await draw(5, 0.5);
    await work([A, B1, C], 4, at(9));
    await commit(5, B1);
    await close(5, at(10), 'h5', { [B1]: 'h5' });
    expect((await paid(at(0), at(10)))[B1]).toBe(12);
    await restart(at(10.5), 1);
    expect((await paid(at(0), at(10)))[B1]).toBeUndefined();
    expect(await paid(at(8), at(10))).toEqual({ [A]: 4, [C]: 4 });
    // Its new process's work is paid as anyone's.
    await draw(6, 0.5);
    await work([A, B1, C], 2, at(11));
    await commit(6, B1);
    await close(6, at(12), 'h6', { [B1]: 'h6' });
    expect(await paid(at(10), at(12))).toEqual({ [A]: 2, [B1]: 2, [C]: 2 });
  });
});
