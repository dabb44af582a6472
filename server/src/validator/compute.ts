import * as tf from '@tensorflow/tfjs';
import { join } from 'node:path';
import {
  LocalTrainer,
  PRESETS,
  Stage,
  bigramBaseline,
  boundaryCodec,
  contentHash,
  continueTokens,
  seededRandom,
  decodeBoundary,
  encodeBoundary,
  evaluationBatches,
  exportStageWeights,
  importStageWeights,
  stageSpecs,
  type Precision,
  type StageInput,
  type StageSpec,
  type TokenBatch,
  type Tokenizer,
  type BackendName,
  runDataset,
} from '@train-at-home/model';
import { DATA_DIR, initNodeBackend, loadDataset, prepareData } from '@train-at-home/model/node';
import { compareOutputs, type OutputComparison } from '@train-at-home/incentives';
import { decodeMicrobatch, decodeRecord, microbatchInputs, replayRound, type AuditInputs, type AuditVerdict, type ConfirmedTransfer, type ReplayTolerance, type RoundRecord } from '@train-at-home/swarm';
import type { RunConfig } from '../run-config';
import { judge, type CheckKind } from './thresholds';

/** What the validator process gets for one audit (ValidatorCompute.audit; built by audits.ts). */
export interface AuditJob {
  record: Uint8Array;
  /** The checkpoint the record starts from (absent: the weights the record carries, else the run's initial weights; checked by hash there). */
  startWeights?: Uint8Array;
  startStateHash: string | null;
  endWeightsHash: string;
  endStateHash: string;
  transfers: ConfirmedTransfer[];
  reportedLosses: Array<[string, number]>;
  merge?: AuditInputs['merge'];
  /** The miner's backend is not the validator's: its round is replayed within these bounds (REPLAY_TOLERANCE, swarm/audit/replay.ts). */
  tolerance?: ReplayTolerance;
  /** Audits the miner had passed in the run when it answered: fewer go first in the validator's queue (PROVEN_AUDITS). */
  passed?: number;
}

/** One stage's weights for a replay: the hash-agreed weights of a merge round (absent blob: the run's initial weights). */
export interface ReplayReference {
  round: number;
  /** Inner steps the miner took since those weights before its forward, and before its backward (from its receipts): only 0 is replayed. */
  forwardSteps: number;
  backwardSteps: number;
  /** Content hash of the blob (the round's merged hash); the validator keeps recent ones. */
  hash?: string;
  blob?: Uint8Array;
}

/** A sampled microbatch: every payload that crossed a boundary (bytes both ends confirmed) and the reported loss. */
export interface ReplayJob {
  activationId: string;
  pathway: string[];
  loss: number;
  /** activations[k]: the payload stage k sent to stage k + 1. */
  activations: Uint8Array[];
  /** gradients[k]: the payload stage k + 1 sent back to stage k. */
  gradients: Uint8Array[];
  /** Per stage, the weights to replay it with, or null where that miner's weights are not known (skip it). */
  references: Array<ReplayReference | null>;
}

export interface SpotCheckResult {
  stage: number;
  minerId: string;
  kind: CheckKind;
  referenceRound: number;
  passed: boolean;
  reason?: string;
  metrics: Partial<OutputComparison> & { reported?: number; replayed?: number };
}

export class ValidatorError extends Error {
  override name = 'ValidatorError';
  constructor(
    /** VALIDATOR_CLOSED: the coordinator is stopping, and dropped the job with its validator (no failure). */
    readonly code: 'NOT_READY' | 'BAD_JOB' | 'NO_CHECKPOINT' | 'VALIDATOR_EXITED' | 'VALIDATOR_TIMEOUT' | 'VALIDATOR_CLOSED',
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

/** Whether a job failed only because the coordinator is stopping its validator: nothing to log, nothing wrong. */
export const droppedOnClose = (e: unknown): boolean => e instanceof ValidatorError && e.code === 'VALIDATOR_CLOSED';

/**
 * The validator's model work, in its own process: held-out loss of the
 * assembled checkpoints, exact replays of sampled microbatches against the
 * stages' hash-agreed weights, and text samples. Nothing here touches the
 * database or the network.
 */
export class ValidatorCompute {
  private readonly specs: StageSpec[];
  private readonly precision: Precision;
  private data?: { batches: TokenBatch[]; bigram: number; tokenizer: Tokenizer; train: Uint16Array };
  /** Recently used stage weights by `${stage}:${hash}` (a few rounds per stage). */
  private readonly stages = new Map<string, Stage>();
  /** The backend the model work runs on. */
  backend?: BackendName;

  constructor(
    private readonly run: RunConfig,
    private readonly evalBatches = 8,
  ) {
    this.specs = stageSpecs(PRESETS[run.preset], run);
    this.precision = boundaryCodec(run);
  }

  async init(): Promise<void> {
    // TAH_VALIDATOR_BACKEND=webgpu: models too large for WASM's heap (the `gpu` preset) are evaluated on the
    // GPU through Dawn (falling back to WASM, saying why, where there is no adapter). Default: WASM.
    const wanted = process.env.TAH_VALIDATOR_BACKEND;
    if (wanted !== undefined && !['webgpu', 'wasm', 'cpu'].includes(wanted)) throw new Error(`TAH_VALIDATOR_BACKEND is webgpu, wasm or cpu, not ${wanted}`);
    this.backend = await initNodeBackend((wanted ?? 'wasm') as BackendName, (line) => console.error(`[validator] ${line}`));
    const config = PRESETS[this.run.preset];
    // TAH_DATA_PREPARED: shards prepared elsewhere and carried (a bundled coordinator), with no corpus packages to check them
    // against; an operator's own dataset (run.dataset) was prepared by them, under the coordinator's data root.
    const root = process.env.TAH_VALIDATOR_DATA_ROOT ?? DATA_DIR;
    if (!process.env.TAH_DATA_PREPARED && !this.run.dataset) prepareData({ outDir: root, vocabSize: config.vocabSize });
    const ds = loadDataset(join(root, runDataset({ dataset: this.run.dataset, vocabSize: config.vocabSize })));
    this.data = {
      batches: evaluationBatches(ds.heldOut, 32, config.contextLength, this.evalBatches),
      bigram: bigramBaseline(ds.train, ds.heldOut, config.vocabSize).loss,
      tokenizer: ds.tokenizer,
      // Audits check stage 0's tokens against the windows each microbatch id is assigned.
      train: ds.train,
    };
  }

  private ready(): NonNullable<ValidatorCompute['data']> {
    if (!this.data) throw new ValidatorError('NOT_READY', 'the validator is still loading its data');
    return this.data;
  }

  /** Held-out loss of one model assembled from one blob per stage, through the run's codec (every read awaited: WebGPU in Node has no synchronous read). */
  async evaluate(blobs: Uint8Array[]): Promise<{ heldOutLoss: number; bigramLoss: number }> {
    const { batches, bigram } = this.ready();
    const model = this.assemble(blobs);
    try {
      return { heldOutLoss: await model.evaluateAsync(batches), bigramLoss: bigram };
    } finally {
      model.dispose();
    }
  }

  /** A short continuation of `prompt` by the assembled model (greedy at temperature 0, else sampled with `seed`), through the run's codec at each boundary. */
  async generate(blobs: Uint8Array[], prompt: string, maxTokens: number, temperature = 0.8, seed = 1): Promise<{ text: string; tokens: number }> {
    const { tokenizer } = this.ready();
    const model = this.assemble(blobs);
    try {
      const out: number[] = [];
      const sampling = { temperature, random: seededRandom(seed) };
      const options = { maxTokens, contextLength: PRESETS[this.run.preset].contextLength, eotId: tokenizer.eotId, sampling, codec: this.precision };
      for await (const id of continueTokens(model.stages, tokenizer.encode(prompt), options)) out.push(id);
      return { text: tokenizer.decode(out), tokens: out.length };
    } finally {
      model.dispose();
    }
  }

  /**
   * Replays one sampled microbatch stage by stage from the bytes that crossed
   * each boundary: each miner's output (and, past stage 0, the gradient it
   * sent back) is recomputed with its stage's weights of that round and
   * compared; on the last stage, the loss it reported.
   */
  /**
   * Replays one miner's whole round (jobs/audits.ts) from the weights it
   * started from: the checkpoint given, or the run's initial weights; either
   * must have the hash the record names, else the record lies about its start.
   */
  async audit(job: AuditJob): Promise<AuditVerdict> {
    const { train } = this.ready();
    let record: RoundRecord;
    try {
      record = decodeRecord(job.record);
    } catch (e) {
      return { passed: false, reason: 'AUDIT_BAD_RECORD', detail: (e as Error).message, ops: 0, steps: 0, ms: 0 };
    }
    const spec = this.specs[record.stage];
    if (!spec) return { passed: false, reason: 'AUDIT_BAD_RECORD', detail: `no stage ${record.stage} in this run`, ops: 0, steps: 0, ms: 0 };
    const stage = new Stage(spec, this.run.seed);
    try {
      const start = job.startWeights ?? (record.anchorRound > 0 ? record.anchorWeights : undefined);
      if (start) {
        try {
          importStageWeights(stage, start);
        } catch (e) {
          return { passed: false, reason: 'AUDIT_START_MISMATCH', detail: `the weights the round starts from do not load: ${(e as Error).message}`, ops: record.ops.length, steps: 0, ms: 0 };
        }
      }
      if (contentHash(await exportStageWeights(stage)) !== record.anchorHash) {
        return { passed: false, reason: 'AUDIT_START_MISMATCH', detail: `the weights of round ${record.anchorRound} are not the ones the record names`, ops: record.ops.length, steps: 0, ms: 0 };
      }
      const { batchSize, peakLr, warmupSteps, totalSteps } = this.run.training;
      return await replayRound({
        stage,
        training: { peakLr, warmupSteps, totalSteps },
        record,
        startStateHash: job.startStateHash,
        endWeightsHash: job.endWeightsHash,
        endStateHash: job.endStateHash,
        transfers: job.transfers,
        reportedLosses: new Map(job.reportedLosses),
        tokens: train,
        dataSeed: this.run.seed,
        batchSize,
        maxBatch: 256,
        ...(job.merge ? { merge: job.merge } : {}),
        ...(job.tolerance ? { tolerance: job.tolerance } : {}),
      });
    } finally {
      stage.dispose();
    }
  }

  replay(job: ReplayJob): SpotCheckResult[] {
    const S = this.specs.length;
    if (job.pathway.length !== S || job.activations.length !== S - 1 || job.gradients.length !== S - 1 || job.references.length !== S) {
      throw new ValidatorError('BAD_JOB', `a replay names one miner and one reference per stage (${S})`);
    }
    const config = PRESETS[this.run.preset];
    const limits = { maxBatch: 1024, time: config.contextLength, vocabSize: config.vocabSize, maxPathway: S };
    const first = decodeMicrobatch(job.activations[0]!, limits);
    const { batch, time } = first;
    const rows = batch * time;
    const frames = job.activations.map((a) => this.decode(decodeMicrobatch(a, limits).frame, rows));
    const grads = job.gradients.map((g) => this.decode(g, rows));
    const targets = decodeMicrobatch(job.activations[S - 2]!, limits).targets;
    const results: SpotCheckResult[] = [];
    for (let k = 0; k < S; k++) {
      const reference = job.references[k];
      if (!reference) continue;
      const stage = this.stage(k, reference);
      const minerId = job.pathway[k]!;
      const x = k === 0 ? tf.tensor2d(microbatchInputs(first), [batch, time], 'int32') : tf.tensor2d(frames[k - 1]!, [rows, this.specs[k]!.inputWidth]);
      const input: StageInput = { batch, time, x, ...(k === S - 1 ? { targets: tf.tensor2d(targets, [batch, time], 'int32') } : {}) };
      const check = (kind: CheckKind, metrics: SpotCheckResult['metrics']): void => {
        const verdict = judge(kind, metrics);
        results.push({ stage: k, minerId, kind, referenceRound: reference.round, passed: verdict.passed, ...(verdict.reason ? { reason: verdict.reason } : {}), metrics });
      };
      try {
        if (k < S - 1 && reference.forwardSteps === 0) {
          const out = stage.forward(input) as tf.Tensor2D;
          const replayed = this.decode(this.encode(out), rows);
          out.dispose();
          const sameWidth = k > 0 && this.specs[k]!.inputWidth === this.specs[k]!.outputWidth;
          check('forward', compareOutputs(frames[k]!, replayed, sameWidth ? frames[k - 1] : undefined));
        }
        if (k > 0 && reference.backwardSteps === 0) {
          const outputGrad = k < S - 1 ? tf.tensor2d(grads[k]!, [rows, this.specs[k]!.outputWidth]) : undefined;
          const result = stage.backward(input, outputGrad);
          outputGrad?.dispose();
          tf.dispose(Object.values(result.grads));
          const replayed = this.decode(this.encode(result.inputGrad!), rows);
          result.inputGrad!.dispose();
          check('backward', compareOutputs(grads[k - 1]!, replayed));
          if (k === S - 1) check('loss', { reported: job.loss, replayed: result.loss! });
        }
      } finally {
        tf.dispose([input.x, ...(input.targets ? [input.targets] : [])]);
      }
    }
    return results;
  }

  /** Weights for stage k at a reference round: from the blob (checked against its hash) or the run's initial weights. */
  private stage(k: number, reference: ReplayReference): Stage {
    const key = `${k}:${reference.hash ?? 'initial'}`;
    const cached = this.stages.get(key);
    if (cached) return cached;
    const stage = new Stage(this.specs[k]!, this.run.seed);
    if (reference.blob) {
      if (reference.hash && contentHash(reference.blob) !== reference.hash) throw new ValidatorError('BAD_JOB', `stage ${k} weights do not hash to ${reference.hash}`);
      importStageWeights(stage, reference.blob);
    } else if (reference.hash) {
      stage.dispose();
      throw new ValidatorError('NO_CHECKPOINT', `stage ${k} weights ${reference.hash.slice(0, 12)} were not sent`);
    }
    this.stages.set(key, stage);
    // Keep the three most recent per stage.
    const mine = [...this.stages.keys()].filter((s) => s.startsWith(`${k}:`));
    for (const old of mine.slice(0, Math.max(0, mine.length - 3))) {
      this.stages.get(old)!.dispose();
      this.stages.delete(old);
    }
    return stage;
  }

  /** Whether weights with this hash are cached (so the coordinator need not send them again). */
  has(k: number, hash: string): boolean {
    return this.stages.has(`${k}:${hash}`);
  }

  private assemble(blobs: Uint8Array[]): LocalTrainer {
    const run = this.run;
    const model = new LocalTrainer({ config: PRESETS[run.preset], layout: run, seed: run.seed, peakLr: 0, warmupSteps: 1, totalSteps: 1 });
    try {
      model.stages.forEach((stage, s) => importStageWeights(stage, blobs[s]!));
    } catch (e) {
      model.dispose();
      throw e;
    }
    return model;
  }

  private encode(t: tf.Tensor2D): Uint8Array {
    const [rows, cols] = t.shape;
    return encodeBoundary({ rows, cols, data: t.dataSync() as Float32Array }, this.precision);
  }

  private decode(frame: Uint8Array, rows: number): Float32Array {
    return decodeBoundary(frame, { rows, precision: this.precision }).data;
  }
}

