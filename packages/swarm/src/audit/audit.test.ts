import * as tf from '@tensorflow/tfjs';
import { PRESETS, Stage, assignedWindows, contentHash, countStageParameters, exportStageWeights, importStageWeights, stageSpecs, type RunLayout } from '@train-at-home/model';
import { initNodeBackend } from '@train-at-home/model/node';
import { payloadHashHex, type AssembledMessage, type FrameHeader } from '@train-at-home/protocol';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Mesh } from '../mesh';
import { PipelineWorker, type Misbehaviour, type PipelineWorkerOptions } from '../pipeline';
import { MAX_RECORD_BYTES, RoundRecorder, decodeRecord, encodeRecord, RecordError, recordFloorBytes } from './record';
import { OuterOptimizer } from '../allreduce/outer';
import { roundPartitionMap } from '../allreduce/butterfly';
import { contributionRoot } from '../allreduce/commitment';
import { encodeContribution } from '../allreduce/codec';
import { readFlat } from '../merge';
import { payloadHashHex as hashOf } from '@train-at-home/protocol';
import { REPLAY_TOLERANCE, replayRound, type AuditInputs, type ConfirmedTransfer, type ReplayTolerance } from './replay';

/**
 * Whole-round audits on a real 3-stage pipeline of `tiny` (PipelineWorkers
 * over an in-process mesh): every honest miner's round replays exactly, and
 * each cheat a replay of the first microbatch after a merge cannot see is
 * caught by name: noise of 1% of the output's RMS after the first step, a
 * lazy learner, foreign tokens at stage 0, an under-reported loss.
 */
const config = PRESETS.tiny;
const layout: RunLayout = { stages: 3, bottleneck: 32, int8: true };
const training = { peakLr: 0.006, warmupSteps: 2, totalSteps: 40 };
const SEED = 5;
const DATA_SEED = 77;
const BATCH = 4;
const IDS = ['a', 'b', 'c'].map((c) => c.repeat(64));
let tokens: Uint16Array;

beforeAll(async () => {
  await initNodeBackend();
  // Stand-in run data: any token array works for provenance (the windows are read from it).
  tokens = Uint16Array.from({ length: 50_000 }, (_, i) => (i * 7919 + (i >> 3)) % config.vocabSize);
});

/** Delivers messages between in-process workers, in order, as a PeerMesh would. */
function memoryMeshes(ids: string[]): Map<string, Mesh> {
  const handlers = new Map<string, (from: string, m: AssembledMessage) => void>();
  const meshes = new Map<string, Mesh>();
  for (const id of ids) {
    meshes.set(id, {
      onMessage: (h: (from: string, m: AssembledMessage) => void) => void handlers.set(id, h),
      onReject: () => {},
      send: async (to: string, header: FrameHeader, payload: Uint8Array) => {
        const payloadHash = payloadHashHex(payload);
        setTimeout(() => handlers.get(to)?.(id, { ...header, payload, payloadHash }), 0);
        return { bytes: payload.length, payloadHash };
      },
      close: () => {},
    } as unknown as Mesh);
  }
  return meshes;
}

interface Round {
  stages: Stage[];
  recorders: RoundRecorder[];
  transfers: ConfirmedTransfer[];
  losses: Map<string, number>;
  commitments: Array<{ weights: string; state: string }>;
}

/** A fresh 3-stage pipeline of `tiny` over `meshes`: each worker's ops go to its stage's recorder, the last stage's losses to `losses`. */
function pipeline(meshes: Map<string, Mesh>, options: (k: number) => Partial<PipelineWorkerOptions>) {
  const stages = stageSpecs(config, layout).map((s) => new Stage(s, SEED));
  const recorders = IDS.map((id, k) => new RoundRecorder(1, id, k));
  const losses = new Map<string, number>();
  const workers = IDS.map(
    (id, k) =>
      new PipelineWorker({
        selfId: id,
        stage: stages[k]!,
        runId: 1,
        mesh: meshes.get(id)!,
        nextPeers: () => (IDS[k + 1] ? [IDS[k + 1]!] : []),
        epoch: () => 0,
        ...training,
        onOp: (op) => recorders[k]!.add(op),
        onLoss: (r) => losses.set(r.activationId, r.loss),
        ...options(k),
      }),
  );
  return { stages, recorders, losses, workers };
}

/** Runs `microbatches` through a fresh pipeline, with a cheat at one stage, and closes the round as a merge would. */
async function runRound(microbatches: number, cheat?: { stage: number; misbehave?: Misbehaviour; foreignTokens?: boolean }, keepEnd = false): Promise<Round> {
  const reported: Array<ConfirmedTransfer & { by: string }> = [];
  const { stages, recorders, losses, workers } = pipeline(memoryMeshes(IDS), (k) => ({
    onTransfer: (t) => reported.push({ ...t, by: IDS[k]! }),
    ...(cheat?.stage === k && cheat.misbehave ? { misbehave: cheat.misbehave } : {}),
  }));
  for (let k = 0; k < 3; k++) {
    const weights = await exportStageWeights(stages[k]!);
    recorders[k]!.start(0, contentHash(weights), await workers[k]!.compute.exportState(), weights);
  }
  for (let i = 0; i < microbatches; i++) {
    const id = crypto.getRandomValues(new Uint8Array(16));
    const assigned = assignedWindows(tokens, BATCH, config.contextLength, DATA_SEED, id);
    const batch = cheat?.foreignTokens ? assignedWindows(tokens, BATCH, config.contextLength, DATA_SEED + 1, id) : assigned;
    await workers[0]!.submit(batch, id);
  }
  await new Promise((r) => setTimeout(r, 20));
  const commitments = [];
  for (let k = 0; k < 3; k++) {
    const [weights, state] = [await exportStageWeights(stages[k]!), await workers[k]!.compute.exportState()];
    commitments.push({ weights: contentHash(weights), state: contentHash(state) });
    // merge-ready of round 1 (a miner on another backend than the validator's keeps its end state in the record).
    recorders[k]!.close(1, contentHash(weights), state, weights, keepEnd);
    workers[k]!.dispose();
  }
  // A transfer counts when both ends confirmed it with the same hash.
  const key = (t: ConfirmedTransfer) => `${t.direction}:${t.activationId}:${t.from}:${t.to}:${t.payloadHash}`;
  const seen = new Map<string, number>();
  for (const t of reported) seen.set(key(t), (seen.get(key(t)) ?? 0) + 1);
  const transfers = [...new Map(reported.filter((t) => seen.get(key(t)) === 2).map((t) => [key(t), { direction: t.direction, activationId: t.activationId, from: t.from, to: t.to, payloadHash: t.payloadHash }])).values()];
  return { stages, recorders, transfers, losses, commitments };
}

async function audit(round: Round, k: number, record = round.recorders[k]!.find(1)!, merge?: AuditInputs['merge'], tolerance?: ReplayTolerance) {
  const fresh = new Stage(stageSpecs(config, layout)[k]!, SEED);
  try {
    return await replayRound({
      stage: fresh,
      training,
      record: decodeRecord(encodeRecord(record)),
      startStateHash: null,
      endWeightsHash: round.commitments[k]!.weights,
      endStateHash: round.commitments[k]!.state,
      transfers: round.transfers.filter((t) => t.from === IDS[k] || t.to === IDS[k]),
      reportedLosses: round.losses,
      tokens,
      dataSeed: DATA_SEED,
      batchSize: BATCH,
      maxBatch: 256,
      ...(merge ? { merge } : {}),
      ...(tolerance ? { tolerance } : {}),
    });
  } finally {
    fresh.dispose();
  }
}

describe('whole-round audits', () => {
  it('knows which stages a record cannot be uploaded for: none of tiny or small, on any backend; every stage of gpu', async () => {
    const floors = (preset: 'tiny' | 'small' | 'gpu', stages: number, keepsEnd: boolean): number[] =>
      stageSpecs(PRESETS[preset], { stages, bottleneck: 32, int8: true }).map((s) => recordFloorBytes(countStageParameters(s), keepsEnd));
    for (const keepsEnd of [false, true]) {
      expect(floors('tiny', 3, keepsEnd).every((b) => b <= MAX_RECORD_BYTES)).toBe(true);
      expect(floors('small', 3, keepsEnd).every((b) => b <= MAX_RECORD_BYTES)).toBe(true);
      expect(floors('gpu', 3, keepsEnd).every((b) => b > MAX_RECORD_BYTES)).toBe(true);
      expect(floors('gpu', 4, keepsEnd).every((b) => b > MAX_RECORD_BYTES)).toBe(true);
    }
    // The floor is what a record of one step holds at least: its start weights and optimizer state (and, kept, its end).
    const spec = stageSpecs(config, layout)[1]!;
    const stage = new Stage(spec, 7);
    const weights = await exportStageWeights(stage);
    const moments = new Uint8Array(countStageParameters(spec) * 8);
    const recorder = new RoundRecorder(1, 'f'.repeat(64), 1);
    recorder.start(0, contentHash(weights), moments, weights);
    recorder.close(1, contentHash(weights), moments, weights, true);
    expect(weights.length).toBeGreaterThanOrEqual(countStageParameters(spec) * 4);
    expect(encodeRecord(recorder.find(1)!).length).toBeGreaterThanOrEqual(recordFloorBytes(countStageParameters(spec), true));
    stage.dispose();
  });

  it('replays every honest miner\'s round exactly, through its record\'s binary form', async () => {
    const round = await runRound(4);
    for (let k = 0; k < 3; k++) {
      const verdict = await audit(round, k);
      expect(verdict, `stage ${k}`).toMatchObject({ passed: true, steps: 4 });
      expect(verdict.ops).toBe(k === 2 ? 4 : 8);
    }
    round.stages.forEach((s) => s.dispose());
  });

  it('catches noise of 1% of the output RMS sent only after the first inner step', async () => {
    let n = 0;
    const round = await runRound(3, {
      stage: 1,
      misbehave: { output: (out) => (n++ === 0 ? out : tf.tidy(() => out.add(tf.randomNormal(out.shape).mul(tf.sqrt(tf.mean(tf.square(out))).mul(0.01)))) as tf.Tensor2D) },
    });
    const verdict = await audit(round, 1);
    expect(verdict).toMatchObject({ passed: false, reason: 'AUDIT_OUTPUT_MISMATCH', op: 2 });
    expect(verdict.metrics!.cosine).toBeGreaterThan(0.99); // invisible to a cosine threshold, not to an exact replay
    expect(await audit(round, 0)).toMatchObject({ passed: true });
    round.stages.forEach((s) => s.dispose());
  });

  it('catches a lazy learner by the weights it committed at the merge', async () => {
    const round = await runRound(3, { stage: 1, misbehave: { skipSteps: true } });
    expect(await audit(round, 1)).toMatchObject({ passed: false, reason: 'AUDIT_OUTPUT_MISMATCH' });
    round.stages.forEach((s) => s.dispose());
    // With one microbatch its outputs are those of the anchor: only the committed weights tell.
    const one = await runRound(1, { stage: 1, misbehave: { skipSteps: true } });
    expect(await audit(one, 1)).toMatchObject({ passed: false, reason: 'AUDIT_WEIGHTS_MISMATCH' });
    one.stages.forEach((s) => s.dispose());
  });

  it('catches stage 0 feeding tokens that are not its assigned windows, and an under-reported loss', async () => {
    const foreign = await runRound(2, { stage: 0, foreignTokens: true });
    expect(await audit(foreign, 0)).toMatchObject({ passed: false, reason: 'FOREIGN_TOKENS', op: 0 });
    foreign.stages.forEach((s) => s.dispose());
    const liar = await runRound(2, { stage: 2, misbehave: { reportedLoss: (l) => l * 0.999 } });
    expect(await audit(liar, 2)).toMatchObject({ passed: false, reason: 'AUDIT_LOSS_MISMATCH', op: 0 });
    liar.stages.forEach((s) => s.dispose());
  });

  it('catches a contribution to the merge other than the one its round leads to, as its partitions\' owners received it', async () => {
    const round = await runRound(2);
    const k = 1;
    const initial = new Stage(stageSpecs(config, layout)[k]!, SEED);
    const honest = new OuterOptimizer(await readFlat(initial)).pseudoGradient(await readFlat(round.stages[k]!));
    initial.dispose();
    const participants = [IDS[k]!, 'd'.repeat(64), 'e'.repeat(64)];
    // At a dense precision and at a top-k one (what a top-k run's contributions carry: codec.ts).
    for (const precision of ['int8', 'topk32'] as const) {
      // What the owners of each partition say they received from the miner: a given contribution's encoded slices.
      const merge = (sent: Float32Array, committed?: Float32Array): AuditInputs['merge'] => ({
        mode: 'outer',
        seed: 42,
        participants,
        precision,
        received: roundPartitionMap(participants, sent.length, 42).flatMap((p) =>
          p.owners.map((owner) => ({ partition: p.index, owner, hash: hashOf(encodeContribution(sent.subarray(p.start, p.end), precision)) })),
        ),
        ...(committed ? { committed: contributionRoot(committed, precision) } : {}),
      });
      expect(await audit(round, k, undefined, merge(honest))).toMatchObject({ passed: true });
      expect(await audit(round, k, undefined, merge(honest, honest))).toMatchObject({ passed: true });
      expect(await audit(round, k, undefined, merge(honest.map((x) => x * 10)))).toMatchObject({ passed: false, reason: 'AUDIT_CONTRIBUTION_MISMATCH' });
      expect(await audit(round, k, undefined, merge(honest.map(() => Math.random() - 0.5)))).toMatchObject({ passed: false, reason: 'AUDIT_CONTRIBUTION_MISMATCH' });
      // A scaled contribution committed to with merge-ready (so its owners took it): the commitment itself is the evidence.
      const scaled = honest.map((x) => x * 3);
      expect(await audit(round, k, undefined, merge(scaled, scaled))).toMatchObject({ passed: false, reason: 'AUDIT_CONTRIBUTION_MISMATCH', detail: expect.stringMatching(/committed with merge-ready/) });
    }
    round.stages.forEach((s) => s.dispose());
  });

  it('keeps each round\'s record from its merge-ready on: a merge that fails or never comes loses no round an audit may draw', () => {
    const op = (id: string): { kind: 'forward'; activationId: string; input: Uint8Array } => ({ kind: 'forward', activationId: id, input: new Uint8Array([1]) });
    const r = new RoundRecorder(1, 'miner', 0);
    r.start(0, 'a'.repeat(64), new Uint8Array([1]), new Uint8Array([10]));
    r.add(op('one'));
    // merge-ready for round 1: its record is kept now, and the next round goes on from the committed end state.
    r.close(1, 'b'.repeat(64), new Uint8Array([2]), new Uint8Array([20]));
    expect(r.find(1)).toMatchObject({ round: 1, anchorRound: 0, anchorHash: 'a'.repeat(64), ops: [{ activationId: 'one' }] });
    // Round 1's merge failed on this replica: nothing replaces the weights; training goes on, and round 2 ends.
    r.add(op('two'));
    r.close(2, 'c'.repeat(64), new Uint8Array([3]), new Uint8Array([30]));
    expect(r.find(1)!.ops.map((o) => o.activationId)).toEqual(['one']);
    expect(r.find(2)).toMatchObject({ round: 2, anchorRound: 1, anchorHash: 'b'.repeat(64), anchorWeights: new Uint8Array([20]), optimizer: new Uint8Array([2]), ops: [{ activationId: 'two' }] });
    // Round 2's merge went through: the next round starts from the merged weights (finish keeps no empty round).
    r.finish();
    r.start(2, 'd'.repeat(64), new Uint8Array([3]), new Uint8Array([40]));
    r.add(op('three'));
    r.close(3, 'e'.repeat(64), new Uint8Array([4]));
    expect(r.find(3)).toMatchObject({ anchorRound: 2, anchorHash: 'd'.repeat(64), ops: [{ activationId: 'three' }] });
    expect([1, 2, 3].map((n) => r.find(n)?.round)).toEqual([1, 2, 3]);
    // A merge-ready refused, or whose answer never came: round 4's work goes on into the next commitment's record.
    // Round 4's own record is kept too: an unanswered merge-ready may have been stored, and its audit is answered from it.
    r.add(op('four'));
    r.close(4, 'f'.repeat(64), new Uint8Array([5]));
    expect(r.reopen(4)).toBe(true);
    expect(r.reopen(4)).toBe(false); // once
    r.add(op('five'));
    expect(r.find(4)).toMatchObject({ anchorRound: 3, ops: [{ activationId: 'four' }] });
    r.close(5, '0'.repeat(64), new Uint8Array([6]));
    expect(r.find(5)).toMatchObject({ anchorRound: 3, anchorHash: 'e'.repeat(64), ops: [{ activationId: 'four' }, { activationId: 'five' }] });
    expect(r.find(4)!.ops.map((o) => o.activationId)).toEqual(['four']);
    // A reopen comes too late once the next round has work.
    r.add(op('six'));
    expect(r.reopen(5)).toBe(false);
  });

  it('replays a round computed on another backend within that backend\'s measured tolerance, and still catches 1% noise, a lazy learner and an end state other than the one committed', async () => {
    // The miners compute on tfjs's pure-JS CPU backend; the validator replays on WASM, as it would a WebGL or WebGPU tab's round.
    const tolerance = REPLAY_TOLERANCE.webgl!;
    let n = 0;
    const noise = (out: tf.Tensor2D): tf.Tensor2D => (n++ === 0 ? out : (tf.tidy(() => out.add(tf.randomNormal(out.shape).mul(tf.sqrt(tf.mean(tf.square(out))).mul(0.01)))) as tf.Tensor2D));
    await tf.setBackend('cpu');
    let honest: Round, noisy: Round, lazy: Round;
    try {
      honest = await runRound(3, undefined, true);
      noisy = await runRound(3, { stage: 1, misbehave: { output: noise } }, true);
      lazy = await runRound(2, { stage: 1, misbehave: { skipSteps: true } }, true);
    } finally {
      await tf.setBackend('wasm');
    }
    const exact = [];
    for (let k = 0; k < 3; k++) {
      exact.push(await audit(honest, k));
      // (A failure's message carries the verdict whole: its reason, the op and how far it landed.)
      const verdict = await audit(honest, k, undefined, undefined, tolerance);
      expect(verdict, `stage ${k}: ${JSON.stringify({ reason: verdict.reason, op: verdict.op, detail: verdict.detail, metrics: verdict.metrics })}`).toMatchObject({ passed: true, steps: 3 });
    }
    // Bit for bit, the other backend's honest round does not replay: hence the tolerance.
    expect(exact.some((v) => !v.passed)).toBe(true);
    expect(await audit(noisy, 1, undefined, undefined, tolerance)).toMatchObject({ passed: false, reason: 'AUDIT_OUTPUT_MISMATCH', op: 2 });
    expect((await audit(lazy, 1, undefined, undefined, tolerance)).passed).toBe(false);
    // The end it carries must be the one it committed; and within the tolerance of where its steps lead.
    const record = honest.recorders[1]!.find(1)!;
    const other = lazy.recorders[1]!.find(1)!;
    expect(await audit(honest, 1, { ...record, end: { weights: other.end!.weights, state: record.end!.state } }, undefined, tolerance)).toMatchObject({ passed: false, reason: 'AUDIT_WEIGHTS_MISMATCH', detail: expect.stringMatching(/not the ones committed/) });
    expect(decodeRecord(encodeRecord(record)).end).toEqual(record.end);
    for (const r of [honest, noisy, lazy]) r.stages.forEach((s) => s.dispose());
  });

  it('refuses records that leave out a confirmed send, claim unconfirmed bytes, or start from another state', async () => {
    const round = await runRound(2);
    const record = round.recorders[1]!.find(1)!;
    expect(await audit(round, 1, { ...record, ops: record.ops.slice(0, -1) })).toMatchObject({ passed: false, reason: 'AUDIT_INCOMPLETE' });
    const forged = record.ops.map((o, i) => (i === 0 ? { ...o, input: o.input.map((b, j) => (j === o.input.length - 1 ? b ^ 1 : b)) } : o));
    expect(await audit(round, 1, { ...record, ops: forged })).toMatchObject({ passed: false, reason: 'AUDIT_INPUT_MISMATCH', op: 0 });
    const warm = record.optimizer.slice();
    warm[8] = 1;
    expect(await audit(round, 1, { ...record, optimizer: warm })).toMatchObject({ passed: false, reason: 'AUDIT_START_MISMATCH' });
    // The record carries the weights it starts from, byte for byte (a replay of a replica whose merge ended elsewhere starts from them).
    const bytes = encodeRecord(record);
    expect(contentHash(decodeRecord(bytes).anchorWeights!)).toBe(record.anchorHash);
    expect(decodeRecord(encodeRecord({ ...record, anchorWeights: undefined })).anchorWeights).toBeUndefined();
    // Bytes that are not a record are refused by name before anything is replayed.
    expect(() => decodeRecord(bytes.subarray(0, bytes.length - 1))).toThrow(RecordError);
    expect(() => decodeRecord(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8, 9]))).toThrow(/BAD_RECORD/);
    round.stages.forEach((s) => s.dispose());
  });

  it('steps a gradient only in the round its forward was recorded in, however a merge\'s messages interleave: both rounds replay', async () => {
    // A microbatch is in flight when the round closes with merge-ready (the last replica ready hears merge-go before the
    // answer; the merge may then fail and training go on from the committed end). Its forward is in the closed round's
    // record, its backward in the next one's: that backward must take no step, as the replay of the next round expects.
    const across = async (followRecords: boolean) => {
      const meshes = memoryMeshes(IDS);
      const held: Array<() => void> = [];
      let holding = false;
      const toFirst = meshes.get(IDS[1]!)!;
      const send = toFirst.send.bind(toFirst);
      // Gradients stage 1 sends back to stage 0 wait while `holding`, as a gradient on the wire would.
      toFirst.send = (async (to: string, header: FrameHeader, payload: Uint8Array) => {
        if (holding && to === IDS[0] && header.kind === 'gradient') {
          held.push(() => void send(to, header, payload));
          return { bytes: payload.length, payloadHash: payloadHashHex(payload) };
        }
        return send(to, header, payload);
      }) as Mesh['send'];
      const specs = stageSpecs(config, layout);
      let closed = 0;
      const reported: Array<ConfirmedTransfer & { by: string; round: number }> = [];
      const { stages, recorders, losses, workers } = pipeline(meshes, (k) => ({
        ...(followRecords ? { round: () => recorders[k]!.serial } : {}),
        onTransfer: (t) => reported.push({ ...t, by: IDS[k]!, round: closed + 1 }),
      }));
      const states: Array<Array<{ weights: Uint8Array; state: Uint8Array }>> = [[], [], []];
      for (let k = 0; k < 3; k++) {
        const weights = await exportStageWeights(stages[k]!);
        const state = await workers[k]!.compute.exportState();
        states[k]!.push({ weights, state });
        recorders[k]!.start(0, contentHash(weights), state, weights);
      }
      const closeAll = async () => {
        closed++;
        for (let k = 0; k < 3; k++) {
          const [weights, state] = [await exportStageWeights(stages[k]!), await workers[k]!.compute.exportState()];
          states[k]!.push({ weights, state });
          recorders[k]!.close(closed, contentHash(weights), state, weights);
        }
      };
      const submit = (): Promise<void> => {
        const id = crypto.getRandomValues(new Uint8Array(16));
        return workers[0]!.submit(assignedWindows(tokens, BATCH, config.contextLength, DATA_SEED, id), id);
      };
      await submit();
      holding = true;
      const inFlight = submit();
      while (held.length === 0) await new Promise((r) => setTimeout(r, 5));
      await closeAll(); // round 1 ends with the second microbatch's gradient on its way back to stage 0
      holding = false;
      held.forEach((deliver) => deliver());
      await inFlight;
      await submit();
      await new Promise((r) => setTimeout(r, 20));
      await closeAll();
      workers.forEach((w) => w.dispose());
      const verdicts = [];
      for (const round of [1, 2]) {
        for (let k = 0; k < 3; k++) {
          const fresh = new Stage(specs[k]!, SEED);
          const record = recorders[k]!.find(round)!;
          if (round > 1) importStageWeights(fresh, record.anchorWeights!);
          // Each side's own receipts say in which round it sent: a send of the other round need not be in this record.
          const transfers = reported.filter((t) => t.by === IDS[k]).map((t) => ({ direction: t.direction, activationId: t.activationId, from: t.from, to: t.to, payloadHash: t.payloadHash, inRound: t.round === round }));
          try {
            verdicts.push(
              await replayRound({
                stage: fresh,
                training,
                record: decodeRecord(encodeRecord(record)),
                startStateHash: round === 1 ? null : contentHash(states[k]![round - 1]!.state),
                endWeightsHash: contentHash(states[k]![round]!.weights),
                endStateHash: contentHash(states[k]![round]!.state),
                transfers,
                reportedLosses: losses,
                tokens,
                dataSeed: DATA_SEED,
                batchSize: BATCH,
                maxBatch: 256,
              }),
            );
          } finally {
            fresh.dispose();
          }
        }
      }
      stages.forEach((s) => s.dispose());
      return { verdicts, first: recorders[0]!.find(2)!.ops.map((o) => [o.kind, o.applied]) };
    };
    const followed = await across(true);
    expect(followed.verdicts.map((v) => v.passed)).toEqual([true, true, true, true, true, true]);
    // Stage 0's second round: the held gradient's backward took no step; the next microbatch's did.
    expect(followed.first).toEqual([['backward', false], ['forward', undefined], ['backward', true]]);
    expect(followed.verdicts[3]).toMatchObject({ steps: 1 });
    // A worker that steps by the merge alone (as before: a merge-ready answered after merge-go and a failed merge never
    // ended its round) stepped that gradient into the next round, whose record then fails its replay.
    const unfollowed = await across(false);
    expect(unfollowed.first[0]).toEqual(['backward', true]);
    expect(unfollowed.verdicts[3]).toMatchObject({ passed: false, reason: 'AUDIT_BAD_RECORD', op: 0 });
  });
});
