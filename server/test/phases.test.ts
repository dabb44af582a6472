import { PROTOCOL_VERSION, type MergeGo } from '@train-at-home/protocol';
import type { Socket } from 'socket.io';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { STALL_MS, STALL_TRUST_AFTER_MS, buildApp, type App } from '../src/app';
import { UNTRUSTED_GRACE_MS } from '../src/phases';
import { testDatabase } from '@train-at-home/testkit/database';

/**
 * The phase machine's deadlines against the coordinator's own stalls. Two
 * miners are rows of the run with one verified transfer between them, so
 * each stage's merge is due at once; their sockets are recorders, and the
 * test answers for them.
 */
const READY_MS = 1000;
const A = 'a'.repeat(64);
const B = 'b'.repeat(64);

let app: App;
const heard: Array<{ miner: string; event: string; msg: { round?: number; participants?: string[] } }> = [];
const recorder = (miner: string) => ({ emit: (event: string, msg: never) => heard.push({ miner, event, msg }), disconnect: () => undefined }) as unknown as Socket;

beforeAll(async () => {
  app = await buildApp({ database: await testDatabase(), run: { name: 'stall', preset: 'tiny', stages: 2, merge: { every: 1, readyMs: READY_MS } }, silentMs: 600_000 });
  const runId = app.coordinator.runId;
  for (const [id, stage] of [[A, 0], [B, 1]] as const) {
    await app.db.query(`INSERT INTO miners (id, run_id, public_key, address, backend, tokens_per_sec, stage, status) VALUES ($1, $2, $3, $4, 'wasm', 1, $5, 'active')`, [id, runId, `0x${id}`, `addr-${id}`, stage]);
    app.coordinator.sockets.set(id, recorder(id));
  }
  for (const reporter of [A, B]) {
    await app.db.query(`INSERT INTO receipts (run_id, epoch, activation_id, direction, from_miner, to_miner, reporter, bytes, payload_hash) VALUES ($1, 0, 'x1', 'activation', $2, $3, $4, 100, 'h')`, [runId, A, B, reporter]);
  }
  // What the receipt handler does when the second of them comes in (these rows were written directly).
  const now = new Date();
  app.coordinator.phases.noteVerified('x1', A, B, now, now);
});
afterAll(() => app?.close());

const first = (miner: string, event: string) => heard.find((h) => h.miner === miner && h.event === event);

describe('merge deadlines', () => {
  it('do not end a phase while the coordinator itself stalled: an answer queued behind the stall is taken; after the stall they count again', async () => {
    await expect.poll(() => first(A, 'merge') && first(B, 'merge'), { timeout: 10_000, interval: 20 }).toBeTruthy();
    const round = first(A, 'merge')!.msg.round!;
    // A stall longer than the readiness deadline, as when a large checkpoint is stored synchronously:
    // A's answer arrived meanwhile and waits in a socket, read only after the timers that are due.
    const until = performance.now() + READY_MS + STALL_MS + 500;
    while (performance.now() < until);
    let refused: Error | undefined;
    setImmediate(() => app.coordinator.phases.onReady(A, { v: PROTOCOL_VERSION, stage: 0, round, stateId: 'state', microbatches: 1, weightsHash: 'ab'.repeat(32), optimizerHash: 'ab'.repeat(32), contributionRoots: { outer: 'ab'.repeat(32), average: 'ab'.repeat(32) } }).catch((e: Error) => (refused = e)));

    await expect.poll(() => first(A, 'merge-go'), { timeout: 5_000, interval: 20 }).toBeTruthy();
    expect(refused).toBeUndefined();
    expect((first(A, 'merge-go')!.msg as MergeGo).participants).toEqual([A]);
    // B never answers: once the stall's messages have had their time, its round goes on without it.
    await expect.poll(() => first(B, 'merge-go'), { timeout: STALL_TRUST_AFTER_MS + 10_000, interval: 50 }).toBeTruthy();
    expect((first(B, 'merge-go')!.msg as MergeGo).participants).toEqual([]);
  });

  it('end a phase UNTRUSTED_GRACE_MS after its deadline even while the coordinator keeps stalling: a replica that left cannot hold it open', async () => {
    // New verified work for both, so each stage's next merge is due; B never answers it.
    const runId = app.coordinator.runId;
    const merges = (miner: string) => heard.filter((h) => h.miner === miner && h.event === 'merge').length;
    const gos = (miner: string) => heard.filter((h) => h.miner === miner && h.event === 'merge-go');
    const [mergesBefore, gosBefore] = [merges(B), gos(B).length];
    for (const reporter of [A, B]) {
      await app.db.query(`INSERT INTO receipts (run_id, epoch, activation_id, direction, from_miner, to_miner, reporter, bytes, payload_hash) VALUES ($1, 0, 'x2', 'activation', $2, $3, $4, 100, 'h')`, [runId, A, B, reporter]);
    }
    const now = new Date();
    app.coordinator.phases.noteVerified('x2', A, B, now, now);
    await expect.poll(() => merges(B), { timeout: 10_000, interval: 20 }).toBeGreaterThan(mergesBefore);
    const called = performance.now();
    // The process stalls for longer than STALL_MS again and again: its timers are never trusted in that time.
    while (gos(B).length === gosBefore && performance.now() - called < READY_MS + UNTRUSTED_GRACE_MS + 10_000) {
      const until = performance.now() + STALL_MS + 1200;
      while (performance.now() < until);
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(gos(B).length).toBeGreaterThan(gosBefore);
    expect((gos(B).at(-1)!.msg as MergeGo).participants).toEqual([]);
    expect(performance.now() - called).toBeGreaterThan(READY_MS + UNTRUSTED_GRACE_MS - 5_000);
  });
});
