// One file over 400 lines: the PipelineWorker's forward, backward and routing of one microbatch read as one
// procedure; the stage arithmetic is stage-compute.ts's and the wire format microbatch.ts's.
import * as tf from '@tensorflow/tfjs';
import { type Stage, type StageInput, type TokenBatch } from '@train-at-home/model';
import { payloadHashHex, type AssembledMessage } from '@train-at-home/protocol';
import type { RoundOp } from './audit/record';
import type { Mesh, PeerPathStats } from './mesh';
import { decodeMicrobatch, encodeMicrobatch, microbatchInputs } from './microbatch';
import { StageCompute, type BoundaryDeviceCodec } from './stage-compute';

export type { BoundaryDeviceCodec } from './stage-compute';

/** Payloads kept for the validator's probes (both directions, sent and received). */
export const PAYLOAD_CACHE_ENTRIES = 64;

/** What a path costs the pipeline, for `preferDirect`: a peer not reached yet counts as direct until it is known. */
const PATH_COST: Record<PeerPathStats['path'], number> = { direct: 0, connecting: 0, turn: 1, coordinator: 2, unreachable: 3 };

export interface PipelineWorkerOptions {
  selfId: string;
  stage: Stage;
  runId: number;
  mesh: Mesh;
  /** Miners holding the next stage; the worker sends to the one with the fewest microbatches outstanding. */
  nextPeers: () => string[];
  /**
   * This miner's rank among its stage's replicas: among equally loaded next
   * peers it picks the one of the same rank, so that between merges each
   * replica of a stage keeps feeding the same replica downstream (coherent
   * pathways, like separate pipelines that merge) instead of mixing models
   * that drift apart until they merge. Random among them without it.
   */
  rank?: () => number;
  /**
   * Pathway diversity for the validator's attribution (CLASP): the partner of
   * rank r is the one at (r + rotation) among the next stage's replicas, and
   * the miner passes its stage's merge round here, so partners change at
   * every merge (when every replica holds the same weights) and stay fixed
   * between merges.
   */
  rotation?: () => number;
  /**
   * Path quality (default on): among equally loaded next peers, those this miner's mesh reaches directly, or has not
   * tried yet, come before those it reaches only through TURN, and those before the coordinator's relay. A pair that
   * only connects through TURN is then used when nothing better is at hand.
   */
  preferDirect?: boolean;
  /** Miners holding the previous stage: activations from anyone else are refused (absent: from anyone). */
  previousPeers?: () => string[];
  epoch: () => number;
  peakLr: number;
  warmupSteps: number;
  totalSteps: number;
  clipNorm?: number;
  /** Stage 0 gives up on a microbatch whose gradient has not returned in this time (a miner on its pathway died). */
  microbatchTimeoutMs?: number;
  /** Largest microbatch accepted from a peer. */
  maxBatch?: number;
  /** The last stage's loss for each microbatch, with its pathway (miner ids, stage 0 first). */
  onLoss?: (report: { activationId: string; pathway: string[]; loss: number }) => void;
  /** Every activation or gradient this miner sent or received: both ends confirm each transfer to the coordinator. */
  onTransfer?: (t: Transfer) => void;
  /** After each inner optimizer step (a consistent moment to snapshot the weights). */
  onStep?: (step: number) => void;
  /** A message from a peer that failed its checks: dropped, and reported. */
  onReject?: (from: string, reason: string) => void;
  /** Every forward and backward this worker ran, in order, with the bytes in and out (the miner's round record, for audits). */
  onOp?: (op: RoundOp) => void;
  /**
   * Which round's record ops go to now (RoundRecorder.serial): a gradient takes a step only if its forward went to
   * the same record, as an audit's replay of that record expects, whenever the miner ends or goes on with a round.
   */
  round?: () => number | undefined;
  /**
   * Stage 0: checks a microbatch's token windows before it is sent (the run's
   * data seed assigns them from its id); the last stage: checks the targets
   * it receives the same way. Absent: no check.
   */
  checkTokens?: (activationId: Uint8Array, batch: TokenBatch) => string | undefined;
  /** The int8 boundary codec on the backend's own device (see StageCompute). */
  deviceCodec?: BoundaryDeviceCodec;
  /** Fault injection for tests and drills: a cheating miner (see Misbehaviour). */
  misbehave?: Misbehaviour;
}

/**
 * What a dishonest miner does, for the validator's adversarial tests and
 * drills. An honest miner has none of these.
 */
export interface Misbehaviour {
  /** Rewrites the boundary tensor this stage sends forward (noise, zeros, a stale copy). */
  output?(out: tf.Tensor2D): tf.Tensor2D;
  /** Rewrites the input gradient this stage sends back (a sign flip). */
  inputGrad?(grad: tf.Tensor2D): tf.Tensor2D;
  /** Rewrites the loss the last stage reports. */
  reportedLoss?(loss: number): number;
  /** A free-rider: forwards its input unchanged, passes gradients through, never computes or steps. */
  freeRide?: boolean;
  /** Skips the weight update of every backward (a lazy learner): forward and backward are honest. */
  skipSteps?: boolean;
  /** Stage 0: replaces the tokens of each microbatch (text not from the run's data). */
  tokens?(batch: TokenBatch): TokenBatch;
  /** Never answers the validator's audits (read by the Miner). */
  refuseAudits?: boolean;
  /** Never uploads a payload the validator's spot checks ask for (read by the Miner). */
  refuseProbes?: boolean;
  /** Rewrites the contribution this miner sends to a merge (scaled, random): read by the Miner. */
  contribution?(values: Float32Array): Float32Array;
  /** Free-rides on every microbatch but the first after each merge (the one a replay of that moment checks). */
  freeRideAfterFirst?: boolean;
  /** After every real transfer, also confirms one of a microbatch that never existed (read by the Miner). */
  forgeReceipts?: boolean;
}

interface Pending {
  input: StageInput;
  /** The weights' generation when its forward ran (see PipelineWorker.merged). */
  generation: number;
  /** The round record its forward went to (PipelineWorkerOptions.round). */
  round?: number;
  /** First input token of each row, carried to the next stage (see microbatch.ts). */
  firstTokens: Int32Array;
  /** Who sent the activation (absent on stage 0): the gradient goes back there. */
  from?: string;
  /** The activation payload received (absent on stage 0), kept for the round record. */
  received?: Uint8Array;
  /** Who received our activation: only they may send its gradient. */
  to?: string;
  done?: { resolve: () => void; reject: (e: Error) => void };
  timer?: ReturnType<typeof setTimeout>;
}

export interface Transfer {
  direction: 'activation' | 'gradient';
  activationId: string;
  from: string;
  to: string;
  bytes: number;
  payloadHash: string;
}

export class PipelineError extends Error {
  override name = 'PipelineError';
  constructor(
    readonly code: 'MICROBATCH_TIMEOUT' | 'PEER_LOST' | 'NO_NEXT_PEER' | 'STOPPED',
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

const hex = (b: Uint8Array): string => Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');

/**
 * One miner's share of the pipeline, the same code for every stage: stage 0
 * takes token batches and sends activations on; a middle stage decodes,
 * runs its blocks and forwards; the last computes the loss and starts the
 * gradients back. Each stage keeps the input of every microbatch in flight,
 * recomputes its forward when the gradient returns (Stage.backward), sends
 * its input's gradient to the miner the activation came from, and takes an
 * inner AdamW step. Messages are handled one at a time, in arrival order.
 */
export class PipelineWorker {
  private readonly pending = new Map<string, Pending>();
  private readonly outstanding = new Map<string, number>();
  readonly compute: StageCompute;
  private queue: Promise<void> = Promise.resolve();
  private generation = 0;
  /** Recent payloads by `${direction}:${activationId}`, oldest first (Map keeps insertion order). */
  private readonly payloads = new Map<string, Uint8Array>();
  private disposed = false;
  /** Backward passes since the last merge. */
  private sinceMerged = 0;
  private release?: () => void;
  readonly stats = { microbatches: 0, tokens: 0, computeMs: 0, rejected: 0, staleGradients: 0 };

  constructor(private readonly o: PipelineWorkerOptions) {
    this.compute = new StageCompute(o.stage, { peakLr: o.peakLr, warmupSteps: o.warmupSteps, totalSteps: o.totalSteps, clipNorm: o.clipNorm }, o.deviceCodec);
    o.mesh.onMessage((from, message) => {
      if (this.disposed || message.kind === 'partition') return; // a replaced worker hears nothing; partitions are the merge's
      this.queue = this.queue.then(() => this.handle(from, message)).catch((e: unknown) => this.reject(from, (e as Error).message));
    });
  }

  private freeRiding(): boolean {
    const bad = this.o.misbehave;
    return !!bad?.freeRide || (!!bad?.freeRideAfterFirst && this.sinceMerged > 0);
  }

  /** The schedule's step: backward passes so far. */
  get step(): number {
    return this.compute.step;
  }

  private encode(x: tf.Tensor2D): Promise<Uint8Array> {
    return this.compute.encode(x);
  }

  private decode(bytes: Uint8Array, rows: number, cols: number): tf.Tensor2D {
    return this.compute.decode(bytes, rows, cols);
  }

  /**
   * Stage 0: runs one microbatch through the pipeline; resolves when its
   * gradient is back and applied. Its id names the batch's windows when the
   * run assigns them (assignedWindows): give that id here.
   */
  submit(batch: TokenBatch, id?: Uint8Array): Promise<void> {
    if (!this.o.stage.spec.isFirst) throw new Error('only the first stage takes token batches');
    return new Promise<void>((resolve, reject) => {
      this.queue = this.queue
        .then(async () => {
          const activationId = id ?? crypto.getRandomValues(new Uint8Array(16));
          const input: StageInput = { batch: batch.batch, time: batch.time, x: tf.tensor2d(batch.inputs, [batch.batch, batch.time], 'int32') };
          const firstTokens = Int32Array.from({ length: batch.batch }, (_, b) => batch.inputs[b * batch.time]!);
          const entry: Pending = { input, firstTokens, generation: this.generation, done: { resolve, reject } };
          const key = hex(activationId);
          this.pending.set(key, entry);
          entry.timer = setTimeout(
            () => this.abandon(key, new PipelineError('MICROBATCH_TIMEOUT', `no gradient within ${this.o.microbatchTimeoutMs ?? 30_000} ms`)),
            this.o.microbatchTimeoutMs ?? 30_000,
          );
          await this.forwardAndSend(activationId, entry, batch.targets, []);
        })
        .catch((e: unknown) => reject(e as Error));
    });
  }

  /** Microbatches this worker holds whose gradient has not come back yet. */
  get inFlight(): number {
    return this.pending.size;
  }

  /**
   * The stage's weights were replaced by a merge. A microbatch whose forward
   * ran before belongs to the old weights: when its gradient returns, its
   * input gradient is still computed and sent back (the pipeline above it
   * needs it, and it counts as work), but its weight gradient is dropped.
   * So no gradient of the old weights lands on the merged ones, and the
   * first microbatch after a merge runs on exactly the weights every replica
   * agreed on, which the validator holds too and replays exactly
   * (server/src/jobs/spot-checks.ts counts steps the same way).
   */
  merged(): void {
    this.generation++;
    this.sinceMerged = 0;
  }

  /** A payload this miner recently sent or received, for the validator's probe (undefined once evicted). */
  payloadFor(direction: 'activation' | 'gradient', activationId: string): Uint8Array | undefined {
    return this.payloads.get(`${direction}:${activationId}`);
  }

  private keep(direction: 'activation' | 'gradient', activationId: string, payload: Uint8Array): void {
    const key = `${direction}:${activationId}`;
    this.payloads.delete(key);
    this.payloads.set(key, payload);
    while (this.payloads.size > PAYLOAD_CACHE_ENTRIES) this.payloads.delete(this.payloads.keys().next().value!);
  }

  /** Confirms a transfer this miner is about to send (before it goes: the coordinator learns of a microbatch from stage 0 first). */
  private confirmSending(direction: 'activation' | 'gradient', activationId: Uint8Array, to: string, payload: Uint8Array): void {
    const id = hex(activationId);
    this.keep(direction, id, payload);
    this.o.onTransfer?.({ direction, activationId: id, from: this.o.selfId, to, bytes: payload.length, payloadHash: payloadHashHex(payload) });
  }

  private async handle(from: string, message: AssembledMessage): Promise<void> {
    if (message.runId !== this.o.runId) throw new Error(`frame for run ${message.runId}`);
    if (message.kind === 'activation') await this.onActivation(from, message);
    else if (message.kind === 'gradient') await this.onGradient(from, message);
    else return;
    // Accepted: confirm the receipt (a refused message is never confirmed).
    this.keep(message.kind, hex(message.activationId), message.payload);
    this.o.onTransfer?.({
      direction: message.kind,
      activationId: hex(message.activationId),
      from,
      to: this.o.selfId,
      bytes: message.payload.length,
      payloadHash: message.payloadHash,
    });
  }

  private async onActivation(from: string, message: AssembledMessage): Promise<void> {
    const spec = this.o.stage.spec;
    if (spec.isFirst) throw new Error('the first stage receives no activations');
    if (this.o.previousPeers && !this.o.previousPeers().includes(from)) throw new Error('activation from a miner that does not hold the previous stage');
    const mb = decodeMicrobatch(message.payload, {
      maxBatch: this.o.maxBatch ?? 256,
      time: spec.config.contextLength,
      vocabSize: spec.config.vocabSize,
      maxPathway: spec.stages,
    });
    if (mb.pathway[mb.pathway.length - 1] !== from) throw new Error('pathway does not end with the sender');
    if (spec.isLast && this.o.checkTokens) {
      const refused = this.o.checkTokens(message.activationId, { batch: mb.batch, time: mb.time, inputs: microbatchInputs(mb), targets: mb.targets });
      if (refused) throw new Error(refused);
    }
    const rows = mb.batch * mb.time;
    const input: StageInput = { batch: mb.batch, time: mb.time, x: this.decode(mb.frame, rows, spec.inputWidth) };
    const entry: Pending = { input, firstTokens: mb.firstTokens, generation: this.generation, from, received: message.payload };
    const key = hex(message.activationId);
    if (this.pending.has(key)) throw new Error('activation id already in flight');
    this.pending.set(key, entry);
    if (spec.isLast) {
      input.targets = tf.tensor2d(mb.targets, [mb.batch, mb.time], 'int32');
      await this.backwardAndSend(message.activationId, entry, undefined, [...mb.pathway, this.o.selfId]);
    } else {
      await this.forwardAndSend(message.activationId, entry, mb.targets, mb.pathway);
    }
  }

  private async onGradient(from: string, message: AssembledMessage): Promise<void> {
    const key = hex(message.activationId);
    const entry = this.pending.get(key);
    if (!entry || entry.to !== from) throw new Error('gradient for no activation this miner sent to that peer (or one it gave up on)');
    const spec = this.o.stage.spec;
    const rows = entry.input.batch * entry.input.time;
    const outputGrad = this.decode(message.payload, rows, spec.outputWidth);
    this.outstanding.set(from, Math.max(0, (this.outstanding.get(from) ?? 1) - 1));
    await this.backwardAndSend(message.activationId, entry, outputGrad, undefined, message.payload);
    outputGrad.dispose();
  }

  private async forwardAndSend(activationId: Uint8Array, entry: Pending, targets: Int32Array, pathway: string[]): Promise<void> {
    const started = performance.now();
    const bad = this.o.misbehave;
    let out = this.freeRiding() ? (entry.input.x.clone() as tf.Tensor2D) : this.compute.forward(entry.input);
    if (bad?.output) {
      const tampered = bad.output(out);
      if (tampered !== out) out.dispose();
      out = tampered;
    }
    const frame = await this.encode(out);
    out.dispose();
    this.stats.computeMs += performance.now() - started;
    const to = this.pickNext();
    entry.to = to;
    this.outstanding.set(to, (this.outstanding.get(to) ?? 0) + 1);
    const payload = encodeMicrobatch({ batch: entry.input.batch, time: entry.input.time, pathway: [...pathway, this.o.selfId], firstTokens: entry.firstTokens, targets, frame });
    entry.round = this.o.round?.();
    this.o.onOp?.({ kind: 'forward', activationId: hex(activationId), input: entry.received ?? new Uint8Array(0), sent: payload });
    this.confirmSending('activation', activationId, to, payload);
    await this.o.mesh.send(to, { kind: 'activation', runId: this.o.runId, epoch: this.o.epoch(), activationId, pathway: [] }, payload);
  }

  private async backwardAndSend(activationId: Uint8Array, entry: Pending, outputGrad: tf.Tensor | undefined, pathway: string[] | undefined, outputGradBytes?: Uint8Array): Promise<void> {
    const started = performance.now();
    const bad = this.o.misbehave;
    // A gradient of the weights before the merge takes no step (see merged()), nor one of a forward in a round ended
    // since (the last stage's forward is this same message: its round is now).
    const applied = entry.generation === this.generation && (this.o.stage.spec.isLast || entry.round === this.o.round?.());
    if (!applied) this.stats.staleGradients++;
    let result: { inputGrad?: tf.Tensor2D; loss?: number };
    if (this.freeRiding() && outputGrad) {
      result = { inputGrad: outputGrad.clone() as tf.Tensor2D }; // no compute, no step
      this.compute.step++;
    } else {
      result = await this.compute.backward(entry.input, outputGrad, applied && !bad?.skipSteps);
    }
    this.sinceMerged++;
    if (bad?.inputGrad && result.inputGrad) {
      const tampered = bad.inputGrad(result.inputGrad);
      if (tampered !== result.inputGrad) result.inputGrad.dispose();
      result.inputGrad = tampered;
    }
    this.o.onStep?.(this.step);
    this.stats.microbatches++;
    this.stats.tokens += entry.input.batch * entry.input.time;
    let gradFrame: Uint8Array | undefined;
    if (result.inputGrad) {
      gradFrame = await this.encode(result.inputGrad as tf.Tensor2D);
      result.inputGrad.dispose();
    }
    this.stats.computeMs += performance.now() - started;
    this.pending.delete(hex(activationId));
    tf.dispose([entry.input.x, ...(entry.input.targets ? [entry.input.targets] : [])]);
    const loss = result.loss !== undefined && bad?.reportedLoss ? bad.reportedLoss(result.loss) : result.loss;
    this.o.onOp?.({
      kind: 'backward',
      activationId: hex(activationId),
      input: entry.received ?? new Uint8Array(0),
      ...(outputGradBytes ? { outputGrad: outputGradBytes } : {}),
      ...(gradFrame && entry.from ? { sent: gradFrame } : {}),
      applied,
      ...(loss !== undefined ? { loss } : {}),
    });
    if (loss !== undefined && pathway) this.o.onLoss?.({ activationId: hex(activationId), pathway, loss });
    if (gradFrame && entry.from) {
      this.confirmSending('gradient', activationId, entry.from, gradFrame);
      await this.o.mesh.send(entry.from, { kind: 'gradient', runId: this.o.runId, epoch: this.o.epoch(), activationId, pathway: [] }, gradFrame);
    }
    clearTimeout(entry.timer);
    entry.done?.resolve();
  }

  /**
   * A neighbour left: every microbatch that went to it, or came from it, is
   * dropped (its inputs freed). Stage 0's submissions fail at once with
   * PEER_LOST, so the miner sends a new microbatch on another pathway; no step is
   * taken for a dropped microbatch, so none is counted twice.
   */
  forgetPeer(peerId: string): number {
    let dropped = 0;
    for (const [key, entry] of [...this.pending]) {
      if (entry.to === peerId || entry.from === peerId) {
        this.abandon(key, new PipelineError('PEER_LOST', `miner ${peerId.slice(0, 8)}… left`));
        dropped++;
      }
    }
    this.outstanding.delete(peerId);
    return dropped;
  }

  private abandon(key: string, reason: PipelineError): void {
    const entry = this.pending.get(key);
    if (!entry) return;
    this.pending.delete(key);
    clearTimeout(entry.timer);
    if (entry.to) this.outstanding.set(entry.to, Math.max(0, (this.outstanding.get(entry.to) ?? 1) - 1));
    tf.dispose([entry.input.x, ...(entry.input.targets ? [entry.input.targets] : [])]);
    entry.done?.reject(reason);
  }

  private pickNext(): string {
    const peers = this.o.nextPeers();
    if (peers.length === 0) throw new PipelineError('NO_NEXT_PEER', 'no miner holds the next stage');
    // The least loaded; among equals the one of this miner's rank (see `rank`), else one at random.
    const load = (p: string): number => this.outstanding.get(p) ?? 0;
    const least = Math.min(...peers.map(load));
    let candidates = peers.filter((p) => load(p) === least).sort();
    if (this.o.preferDirect !== false && candidates.length > 1) {
      const paths = this.o.mesh.paths();
      const cost = (p: string): number => PATH_COST[paths.get(p)?.path ?? 'connecting'];
      const best = Math.min(...candidates.map(cost));
      candidates = candidates.filter((p) => cost(p) === best);
    }
    const rank = this.o.rank?.();
    if (rank !== undefined && rank >= 0) return candidates[(rank + (this.o.rotation?.() ?? 0)) % candidates.length]!;
    return candidates[Math.floor(Math.random() * candidates.length)]!;
  }

  /**
   * Holds the worker between two messages (for a merge): resolves once the
   * message in hand is done and the weights are still; everything arriving
   * meanwhile waits in order until resume().
   */
  pause(): Promise<void> {
    if (this.release) return Promise.resolve();
    let reached!: () => void;
    const paused = new Promise<void>((r) => (reached = r));
    const gate = new Promise<void>((r) => (this.release = r));
    this.queue = this.queue.then(() => {
      reached();
      return gate;
    });
    return paused;
  }

  resume(): void {
    const release = this.release;
    this.release = undefined;
    release?.();
  }

  private reject(from: string, reason: string): void {
    this.stats.rejected++;
    this.o.onReject?.(from, reason);
  }

  dispose(): void {
    this.disposed = true;
    this.resume();
    for (const key of [...this.pending.keys()]) this.abandon(key, new PipelineError('STOPPED', 'worker stopped'));
    this.compute.dispose();
  }
}
