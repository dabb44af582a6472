// One file over 400 lines, not yet split by role: the Miner's registration, training loop, merges, audits and probes
// share one connection's state. Splitting it (connection, training, merge, audit answers) is issue 40's work.
import { PRESETS, runDataset, assignedWindows, countStageParameters, mulberry32, type TokenBatch, Stage, boundaryCodec, contentHash, exportStageWeights, importStageWeights, stageSpecs, stageTflops, type BackendName, type PresetName } from '@train-at-home/model';
import { PROTOCOL_VERSION, verifySignature, type AdmissionQueued, type AuditRequest, type CheckpointRequest, type Identity, type MergeGo, type MergeStart, type PathSummary, type Traffic } from '@train-at-home/protocol';
import { ButterflyNode } from './allreduce/butterfly';
import { MAX_RECORD_BYTES, RoundRecorder, encodeRecord, recordFloorBytes } from './audit/record';
import { EXACT_REPLAY_BACKEND } from './audit/replay';
import { OuterOptimizer } from './allreduce/outer';
import { nextTurn, prepareContribution, readFlat, runMerge, type MergeOutcome, type PreparedContribution } from './merge';
import type { AllReducePrecision } from './allreduce/values';
import { bytesToHex, randomBytes } from '@noble/hashes/utils';
import { io, type Socket } from 'socket.io-client';
import { CoordinatorError, coordinatorRelay, coordinatorSignals, getRetrying, register, request, requestIce, type Registration } from './coordinator-client';
import { NO_PATH, PeerMesh, summarizePaths, type Mesh, type MeshOptions, type PeerPathStats } from './mesh';
import { PipelineWorker, type BoundaryDeviceCodec, type Misbehaviour } from './pipeline';
import { StageMapView, restStageMap } from './stage-map';
import { TrafficMeter, countMesh } from './traffic';

/** The heartbeat interval a coordinator asks for, within 0.5…60 s; 2 s when it names none. */
export const heartbeatEvery = (asked: unknown): number => (typeof asked === 'number' && Number.isFinite(asked) ? Math.min(60_000, Math.max(500, asked)) : 2000);
/** Gaps between microbatches measured before a stall may say how long one "usually" takes. */
const USUAL_AFTER_GAPS = 3;

/** What a miner reports to the coordinator as it goes: kept in order while the coordinator is away. */
type ReportEvent = 'loss' | 'receipt' | 'merged';

/** Where a first-stage miner gets training tokens (disk in Node, HTTP ranges in a browser). */
export interface TokenSource {
  /**
   * The training split of `dataset` (a prepared dataset's folder name: runDataset), whose vocabulary is `vocabSize`;
   * `onBytes` hears what came over the network for it (nothing when it was read from disk).
   */
  train(vocabSize: number, dataset: string, onBytes?: (bytes: number) => void): Promise<Uint16Array>;
}

export interface MinerOptions {
  coordinatorUrl: string;
  identity: Identity;
  backend: BackendName;
  tokensPerSec: number;
  tokens: TokenSource;
  /** A WebRTC implementation for Node; browsers pass nothing. */
  wrtc?: object;
  /** The int8 boundary codec on the compute device (a tab's WGSL kernels on WebGPU). */
  deviceCodec?: BoundaryDeviceCodec;
  /** Makes this miner's mesh (default: a PeerMesh here; a browser worker passes a MeshPort to the page's). */
  createMesh?: (options: MeshOptions) => Mesh;
  /** How often to tell the coordinator this miner is alive (default: what the coordinator asks for at registration, else 2 s). */
  heartbeatMs?: number;
  /** A neighbour absent from the stage map this long is taken to have left. */
  departureGraceMs?: number;
  /** Stage 0 gives up on (and re-sends the data of) a microbatch not back in this time. */
  microbatchTimeoutMs?: number;
  /** Send to next-stage peers reached directly before those reached only through TURN (PipelineWorkerOptions.preferDirect; default on). */
  preferDirectPeers?: boolean;
  /**
   * Microbatches stage 0 keeps in the pipeline at once (default 1). More fills
   * a lone pipeline's bubbles, but each stage then recomputes a microbatch's
   * forward with weights another microbatch's step already moved: measured on
   * `tiny`, 2 in flight kept the loss on its 4.4 plateau (4.44 after 40 steps)
   * where 1 in flight reached 4.11. Replicas, not depth, give throughput.
   */
  maxInFlight?: number;
  /** Stage 0 stops after submitting this many (default: no limit). */
  maxMicrobatches?: number;
  /**
   * Seeds this miner's microbatch ids (random by default, so replicas see
   * different data); each id's windows are assigned by the run (assignedWindows).
   */
  dataSeed?: number;
  log?: (line: string) => void;
  /** Fault injection for tests and drills: rewrites each all-reduce message this miner sends (a lying owner). */
  tamperAllReduce?: (to: string, message: Uint8Array) => Uint8Array;
  /** Fault injection for the validator's tests and drills: a miner that cheats (read at every use). */
  misbehave?: Misbehaviour;
}

/** What a miner is doing right now, for the person whose machine it is. */
export type MinerPhase = 'registering' | 'downloading' | 'waiting' | 'training' | 'merging' | 'idle' | 'stopped';

export interface MinerStatus {
  phase: MinerPhase;
  /** Why it is waiting or idle: a fault or a wait the person may act on (never set while training). */
  why?: string;
  /**
   * While training, what the stage is doing between microbatches, in plain words: with one
   * microbatch in flight each stage works only part of the time (a pipeline bubble), normal work.
   */
  note?: string;
  /** Share of the last 20 seconds this miner spent computing (the rest: the microbatch was on other stages). */
  busyShare?: number;
  /** Set while the coordinator cannot be reached: since when, and when the next attempt is due. */
  coordinator?: { reachable: false; sinceMs: number; retryInMs: number; error?: string };
  minerId?: string;
  stage?: number;
  stages?: number;
  /** Other miners on this stage, and on the stages before and after it. */
  peers: { replicas: string[]; previous: string[]; next: string[] };
  microbatches: number;
  tokens: number;
  /** Over the last 20 seconds of work. */
  tokensPerSec: number;
  /**
   * The arithmetic that rate is, in TFLOP/s: 6 per parameter of this miner's stage per token (forward 2,
   * backward 4; the backward's recomputed forward and attention's T² terms not counted), what a GPU's rate is compared with.
   */
  tflops?: number;
  /** Boundary frames (activations and gradients) this miner sent and received, in bytes on the wire. */
  bytesSent: number;
  bytesReceived: number;
  /** Every byte this miner sent and received since it started, by kind (traffic.ts), and the tokens its stages processed meanwhile. */
  traffic: Traffic;
  trainedTokens: number;
  /** What the same tensors would have cost as fp32 at full width (no bottleneck, no int8). */
  uncompressedBytes: number;
  /** The last loss this miner computed (last stage) and the stage's merges. */
  lastLoss?: number;
  merges: number;
  /** A long step under way (weights or data download), as a fraction. */
  progress?: { label: string; done: number; total: number };
  /** While its registration waits its turn (joins coming faster than the coordinator takes them): its place and an estimate. */
  queued?: AdmissionQueued;
  /** Hash of the checkpoint this miner's stage started from (absent: from the run's initial weights). */
  resumedFrom?: string;
  /** The validator flagged this miner: it is out of the pipeline and earns nothing (the reason, as recorded). */
  flagged?: { kind: string; reason: string };
}

/** The validator asks for a payload of a sampled microbatch (see server/src/jobs/spot-checks.ts). */
export interface ProbeRequest {
  v: number;
  probeId: string;
  activationId: string;
  direction: 'activation' | 'gradient';
}

type RunLayout = Registration['layout'] & {
  preset: PresetName;
  /** The prepared dataset the run trains on (runDataset): unset, the shipped corpora's. */
  dataset?: string;
  seed: number;
  training: { batchSize: number; peakLr: number; warmupSteps: number; totalSteps: number };
  merge: { readyMs: number; roundMs: number; precision: AllReducePrecision };
  incentives?: { rotatePathways: boolean };
};

/**
 * One miner: registers with the coordinator, takes the stage it is given,
 * connects to its neighbours peer to peer and trains. The browser tab and
 * the Node miner both run this; they differ only in backend, WebRTC and token source.
 */
export class Miner {
  private socket?: Socket;
  private mesh?: Mesh;
  private worker?: PipelineWorker;
  private model?: Stage;
  private outer?: OuterOptimizer;
  private butterfly?: ButterflyNode;
  /** This stage's rounds as the validator's audits replay them (audit/record.ts). */
  private recorder?: RoundRecorder;
  /** The recorder of the stage this miner held before: an audit of a round there can still be answered after a move. */
  private previousRecorder?: RoundRecorder;
  /** The run's training tokens, on the last stage (it checks the targets it receives are the run's data). */
  private runTokens?: Uint16Array;
  /** Audits this miner answered, and ones it could not (no record of that round kept). */
  readonly audits = { answered: 0, missing: 0 };
  private readonly auditing = new Set<string>();
  /** The audit uploads in flight and waiting, one after another (onAudit). */
  private auditQueue: Promise<void> = Promise.resolve();
  /** The merge this miner is paused for, if any: `committed` once the coordinator took its merge-ready, `merged` once its all-reduce went through here. */
  private merging?: { stage: number; round: number; timer: ReturnType<typeof setTimeout>; prepared?: PreparedContribution; allReduce?: boolean; committed?: boolean; merged?: boolean; unanswered?: boolean; optimizerHash?: string };
  /** Microbatches this miner's stage processed since its last merge. */
  private sinceMerge = 0;
  /** The stages this miner talks to and who holds them (stage-map.ts). */
  private readonly dataBytes = (bytes: number): void => this.meter.add('data', 'received', bytes);
  private readonly stageMap = new StageMapView((stages) => restStageMap(this.o.coordinatorUrl, (bytes) => this.meter.add('coordinator', 'received', bytes))(stages), {
    onLeft: (left) => this.onStageMap(left),
    log: (line) => this.o.log?.(line),
  });
  /** Miners that left the stage map less than departureGraceMs ago. */
  private readonly departing = new Set<string>();
  private running = false;
  private heartbeat?: ReturnType<typeof setInterval>;
  private reconnectTimer?: ReturnType<typeof setTimeout>;
  /** Asks for fresh TURN credentials before the current ones expire. */
  private iceTimer?: ReturnType<typeof setTimeout>;
  private connectedToCoordinator = true;
  /** While the coordinator is unreachable: since when, the next attempt (performance.now() times) and the last error. */
  private unreachable?: { since: number; nextTryAt: number; error?: string };
  private readonly unsent: Array<[ReportEvent, object]> = [];
  /**
   * Loss reports and receipts sent and not answered yet: sent again, in order, on re-registration (the
   * connection, or its coordinator process, went away with them); one stored already is refused REPLAYED.
   */
  private readonly unanswered = new Map<number, [ReportEvent, object]>();
  private reportSeq = 0;
  /** Loss reports and receipts the coordinator answered as stored (or stored already). */
  readonly reportsStored = { loss: 0, receipt: 0 };
  /** Times this miner registered again after losing the coordinator. */
  rejoined = 0;
  registration?: Registration & { layout: RunLayout };
  /** Hash of the checkpoint this miner started from, if it joined a run in progress. */
  resumedFrom?: string;
  checkpointsUploaded = 0;
  /** The weights its last successful merge ended with: uploaded as that round's checkpoint when the coordinator asks. */
  private lastMerged?: { stage: number; round: number; hash: string; weights: Uint8Array };
  /** The last merge that ended here without going through and without this replica knowing its round committed (endMerge). */
  private endedUncommitted?: { round: number; worker: PipelineWorker; current: Float32Array };
  /** Every merge round this miner took part in, as it ended. */
  readonly merges: Array<{ stage: number; round: number; mode: MergeGo['mode']; participants: number } & Omit<MergeOutcome, 'round' | 'weights'>> = [];
  /** Stage 0: microbatches whose gradient came back and was applied; and how many were sent again. */
  completed = 0;
  resubmitted = 0;
  /** Payloads uploaded for the validator's probes, and probes this miner could not answer. */
  readonly probes = { answered: 0, missing: 0 };
  /** The merge round of this miner's stage, as far as it knows (pathways rotate with it). */
  private stageRound = 0;
  private flagged?: { kind: string; reason: string };
  /** Peers no path reached (no direct connection, no TURN, no relay), and when it last failed. */
  private readonly unreachablePeers = new Map<string, number>();

  private phase: MinerPhase = 'registering';
  private progress?: MinerStatus['progress'];
  /** Its registration's place in the coordinator's queue, while it waits (cleared when its turn came). */
  private queued?: AdmissionQueued;
  private queuedLoggedAt = 0;
  /** What it sent and received, by kind; and what its boundary tensors would have been as full-width fp32. */
  private readonly meter = new TrafficMeter();
  private uncompressedBytes = 0;
  /** Tokens the workers of stages this miner held before its current one processed (traffic is counted since it started). */
  private tokensBefore = 0;
  private lastLoss?: number;
  private lastWorkAt = 0;
  /** When a transfer last reached this miner (an activation or gradient from a peer). */
  private lastReceivedAt = 0;
  /** (time, tokens, compute ms) samples of the last 20 s and the one before, for tokens/s and the busy share. */
  private readonly rate: Array<[number, number, number]> = [];
  /** Recent gaps between transfers (ms): how long this stage usually waits for its next microbatch. */
  private readonly gaps: number[] = [];

  /**
   * This Miner's own id, sent with every registration (its reconnections keep it): a new one under the same key tells
   * the coordinator this is a restart, with a fresh optimizer state and none of the previous one's round records.
   */
  readonly instance = bytesToHex(randomBytes(16));

  constructor(private readonly o: MinerOptions) {}

  /** What this miner is doing now: phase (and why, when waiting or idle), stage, peers, work and traffic. */
  get status(): MinerStatus {
    const r = this.registration;
    const stats = this.worker?.stats;
    const stage = r?.stage;
    const map = this.stageMap;
    const peers = {
      replicas: stage === undefined ? [] : map.peers(stage).filter((id) => id !== r?.minerId),
      previous: stage === undefined || stage === 0 ? [] : map.peers(stage - 1),
      next: stage === undefined ? [] : map.peers(stage + 1),
    };
    const traffic = this.meter.read();
    const now = performance.now();
    const noPath = this.noPathPeers(now, [...peers.replicas, ...peers.previous, ...peers.next]);
    // Over the last 20 s: tokens and compute time since the last sample before the window (a
    // stage that works every 8 s still shows its real rate, never 0 between two microbatches).
    while (this.rate.length > 2 && now - this.rate[1]![0] > 20_000) this.rate.shift();
    const first = this.rate[0];
    const last = this.rate[this.rate.length - 1];
    const span = first ? now - first[0] : 0;
    const tokensPerSec = first && last && span > 0 && now - last[0] < 60_000 ? ((last[1] - first[1]) / span) * 1000 : 0;
    const busyShare = first && last && span > 0 ? Math.min(1, (last[2] - first[2]) / span) : undefined;
    let phase = this.phase;
    let why: string | undefined;
    let note: string | undefined;
    const gone = this.unreachable;
    const silentMs = now - this.lastWorkAt;
    if (phase === 'training') {
      if (this.merging) phase = 'merging';
      else if (r && stage !== undefined && stage > 0 && peers.previous.length === 0) [phase, why] = ['waiting', `no miner holds stage ${stage} yet`];
      else if (r && stage !== undefined && stage < r.layout.stages - 1 && peers.next.length === 0) [phase, why] = ['waiting', `no miner holds stage ${stage + 2} yet`];
      else if (gone && (this.lastWorkAt === 0 || silentMs > this.stallMs())) [phase, why] = ['waiting', unreachableText(gone, now)];
      // Sends that no path took, and nothing received lately: a stage 0 keeps starting microbatches (each one work
      // here) that never come back, so its own sends do not count as progress.
      else if (noPath > 0 && (this.lastReceivedAt === 0 || now - this.lastReceivedAt > this.stallMs())) [phase, why] = ['waiting', noPathText(noPath)];
      else if (this.lastWorkAt === 0) [phase, why] = ['waiting', 'connected; waiting for the first microbatch to reach this stage'];
      else if (silentMs > this.stallMs()) {
        phase = 'idle';
        // "Usually" only once there is a usual: a few gaps between microbatches measured.
        const usual = this.gaps.length >= USUAL_AFTER_GAPS ? ` (one usually comes within ${Math.round(this.usualGapMs() / 1000)} s)` : '';
        why = `no microbatch for ${Math.round(silentMs / 1000)} s${usual}: a peer is slow or has left, or a stage is merging`;
      } else if (silentMs > 1000 && r && r.layout.stages > 1) {
        // A pipeline bubble: the microbatch is on another stage. Normal work, not a fault.
        note = 'between microbatches: the current one is on another stage (in a pipeline each stage works in turn)';
      }
    }
    const coordinator = gone ? { reachable: false as const, sinceMs: Math.round(now - gone.since), retryInMs: Math.max(0, Math.round(gone.nextTryAt - now)), ...(gone.error ? { error: gone.error } : {}) } : undefined;
    return {
      phase,
      ...(why ? { why } : {}),
      ...(note ? { note } : {}),
      ...(busyShare !== undefined ? { busyShare } : {}),
      ...(coordinator ? { coordinator } : {}),
      minerId: r?.minerId,
      stage,
      stages: r?.layout.stages,
      peers,
      microbatches: stats?.microbatches ?? 0,
      tokens: stats?.tokens ?? 0,
      tokensPerSec,
      ...(this.model ? { tflops: stageTflops(this.model.spec, tokensPerSec) } : {}),
      bytesSent: traffic.activation.sent + traffic.gradient.sent,
      bytesReceived: traffic.activation.received + traffic.gradient.received,
      traffic,
      trainedTokens: this.tokensBefore + (stats?.tokens ?? 0),
      uncompressedBytes: this.uncompressedBytes,
      ...(this.lastLoss !== undefined ? { lastLoss: this.lastLoss } : {}),
      merges: this.merges.length,
      ...(this.progress ? { progress: this.progress } : {}),
      ...(this.queued ? { queued: this.queued } : {}),
      ...(this.resumedFrom ? { resumedFrom: this.resumedFrom } : {}),
      ...(this.flagged ? { flagged: this.flagged } : {}),
    };
  }

  /** What the dashboard shows of this miner (sent with each heartbeat). */
  private heartbeatStatus(): { phase: MinerPhase; why?: string; tokensPerSec: number; microbatches: number; paths?: PathSummary; traffic: Traffic; trainedTokens: number } {
    const s = this.status;
    const paths = this.paths();
    return {
      phase: s.phase,
      ...(s.why ? { why: s.why.slice(0, 200) } : {}),
      tokensPerSec: Math.min(1e7, Math.max(0, Number.isFinite(s.tokensPerSec) ? s.tokensPerSec : 0)),
      microbatches: Math.min(2 ** 31 - 1, s.microbatches),
      ...(paths?.size ? { paths: summarizePaths(paths) } : {}),
      traffic: s.traffic,
      trainedTokens: s.trainedTokens,
    };
  }

  /** The longest of the recent waits between two transfers (the stage's usual pipeline bubble); 5 s before any. */
  private usualGapMs(): number {
    return this.gaps.length ? Math.max(...this.gaps) : 5_000;
  }

  /** Silence longer than this is a stall, not a bubble: 3× the usual wait, within 10-60 s. */
  private stallMs(): number {
    return Math.min(60_000, Math.max(10_000, 3 * this.usualGapMs()));
  }

  /** Reads a response body, reporting progress under `label`. */
  private async download(res: Response, label: string): Promise<Uint8Array> {
    const total = Number(res.headers.get('content-length') ?? 0);
    if (!res.body) return new Uint8Array(await res.arrayBuffer());
    const parts: Uint8Array[] = [];
    let done = 0;
    this.progress = { label, done, total };
    const reader = res.body.getReader();
    for (;;) {
      const { done: end, value } = await reader.read();
      if (end) break;
      parts.push(value);
      done += value.length;
      this.progress = { label, done, total: Math.max(total, done) };
    }
    this.progress = undefined;
    const out = new Uint8Array(done);
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  /** Reports a long step's progress (the token source's download, for one). */
  setProgress(progress: MinerStatus['progress'] | undefined): void {
    this.progress = progress;
  }

  get stats(): PipelineWorker['stats'] | undefined {
    return this.worker?.stats;
  }

  async start(): Promise<void> {
    const log = this.o.log ?? (() => {});
    // Reconnects on its own; peers stay connected to each other meanwhile.
    const socket = io(this.o.coordinatorUrl, { transports: ['websocket'], reconnection: true, reconnectionDelay: 500, reconnectionDelayMax: 2000 });
    this.socket = socket;
    this.meter.countSocket(socket);
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', () => resolve());
      socket.once('connect_error', reject);
    });
    socket.on('stages', (m: unknown) => this.stageMap.snapshot(m));
    socket.on('stage-delta', (d: unknown) => this.stageMap.delta(d));
    socket.on('disconnect', (reason: string) => {
      this.connectedToCoordinator = false;
      log(`disconnected from the coordinator (${reason}); reconnecting`);
      // Keep knocking until the coordinator is back. socket.io's own reconnection
      // stops for good once the server has closed the connection itself (as a
      // coordinator shutting down does), so it cannot be relied on here. The wait
      // grows to 3 s: a restarted coordinator is found within seconds, and the
      // page can say when the next try is (`status.coordinator`).
      const start = performance.now();
      this.unreachable = { since: start, nextTryAt: start + 500, error: reason };
      let wait = 500;
      const retry = (): void => {
        if (!this.running || socket.connected) return;
        socket.connect();
        wait = Math.min(3000, wait * 2);
        if (this.unreachable) this.unreachable.nextTryAt = performance.now() + wait;
        this.reconnectTimer = setTimeout(retry, wait);
      };
      clearTimeout(this.reconnectTimer);
      this.reconnectTimer = setTimeout(retry, wait);
    });
    socket.on('connect_error', (e: Error) => {
      if (this.unreachable) this.unreachable.error = e.message;
    });
    const registration = (await this.register(socket)) as Registration & { layout: RunLayout };
    this.registration = registration;
    this.stageRound = registration.rounds?.[registration.stage] ?? 0;
    const { minerId, stage, layout } = registration;
    log(`registered as ${minerId.slice(0, 8)}…, stage ${stage + 1} of ${layout.stages} (${layout.preset}, b=${layout.bottleneck}, ${boundaryCodec(layout)})`);
    if (registration.restarted) {
      const { forfeited } = registration.restarted;
      log(`a restart under this key: the previous process's work in the round under way is not paid${forfeited ? `, and the ${forfeited} audit${forfeited > 1 ? 's' : ''} it left open forfeit${forfeited > 1 ? '' : 's'} its unsettled work` : ''}`);
    }

    const meshOptions: MeshOptions = {
      selfId: minerId,
      wrtc: this.o.wrtc,
      signals: coordinatorSignals(socket, this.o.identity, (from, signed, sig) => verifySignature('signal', signed, sig, `0x${from}`)),
      iceServers: registration.ice?.iceServers ?? [],
      refreshIce: () => this.refreshIce(),
      // The coordinator's relay only where the run has it (a last resort, capped per miner).
      ...(registration.ice?.relay ? { relay: coordinatorRelay(socket) } : {}),
    };
    const mesh = this.o.createMesh ? this.o.createMesh(meshOptions) : new PeerMesh(meshOptions);
    // Which peers no path reaches, for the page to say so (heartbeatStatus); a later success clears it.
    const send = mesh.send.bind(mesh);
    mesh.send = async (peerId, header, payload) => {
      try {
        const sent = await send(peerId, header, payload);
        this.unreachablePeers.delete(peerId);
        return sent;
      } catch (e) {
        if ((e as Error).message.startsWith(NO_PATH)) this.unreachablePeers.set(peerId, performance.now());
        throw e;
      }
    };
    countMesh(mesh, this.meter);
    this.mesh = mesh;
    this.mesh.onMessage((from, message) => {
      if (message.kind === 'partition') this.butterfly?.deliver(from, message.payload);
    });
    this.running = true;
    this.scheduleIceRefresh(registration.ice?.expiresAt ?? null);
    await this.takeStage(stage);
    // Every later connection (automatic reconnection, or ours below) registers again.
    socket.on('connect', () => void this.rejoin(socket));
    let seq = 0;
    this.heartbeat = setInterval(() => socket.emit('heartbeat', { v: PROTOCOL_VERSION, seq: seq++, status: this.heartbeatStatus() }), this.o.heartbeatMs ?? heartbeatEvery(registration.heartbeatMs));
    // Rebalancing: the coordinator moved this miner to a stage that had emptied.
    socket.on('reassigned', (m: { stage: number }) => {
      if (Number.isInteger(m?.stage) && m.stage !== this.registration?.stage) void this.takeStage(m.stage);
    });
    socket.on('merge', (m: MergeStart) => void this.onMergeStart(m));
    socket.on('merge-go', (m: MergeGo) => void this.onMergeGo(m));
    socket.on('probe', (m: ProbeRequest) => void this.onProbe(m));
    socket.on('audit', (m: AuditRequest) => void this.onAudit(m).catch((e: Error) => log(`audit of round ${m?.round} not answered: ${e.message}`)));
    // The round's checkpoint did not come in from the replica named to send it: this one has the same weights.
    socket.on('checkpoint', (m: CheckpointRequest) => {
      const last = this.lastMerged;
      const registration = this.registration;
      if (registration && last && m?.stage === last.stage && m.round === last.round && m.hash === last.hash && registration.stage === last.stage) void this.upload(registration, last.round, last.weights);
    });
    socket.on('flagged', (m: { kind?: unknown; reason?: unknown }) => {
      if (typeof m?.kind === 'string' && typeof m.reason === 'string') {
        this.flagged = { kind: m.kind.slice(0, 64), reason: m.reason.slice(0, 500) };
        log(`flagged by the validator: ${this.flagged.kind}: ${this.flagged.reason}`);
      }
    });
  }

  /**
   * The validator sampled a microbatch this miner took part in and asks for a
   * payload it sent or received; the coordinator checks it against the hash
   * both ends confirmed, so only the true bytes are accepted.
   */
  private async onProbe(m: ProbeRequest): Promise<void> {
    if (typeof m?.probeId !== 'string' || !/^[0-9a-f]{32}$/.test(m.probeId) || typeof m.activationId !== 'string') return;
    if (m.direction !== 'activation' && m.direction !== 'gradient') return;
    if (this.o.misbehave?.refuseProbes) return;
    const payload = this.worker?.payloadFor(m.direction, m.activationId);
    if (!payload) {
      this.probes.missing++;
      return;
    }
    try {
      const res = await fetch(`${this.o.coordinatorUrl}/api/probes/${m.probeId}`, {
        method: 'PUT',
        headers: { 'content-type': 'application/octet-stream', 'x-miner-id': this.registration?.minerId ?? '' },
        body: payload as unknown as BodyInit,
      });
      this.meter.add('audit', 'sent', payload.length);
      if (res.ok) this.probes.answered++;
      else this.o.log?.(`probe ${m.probeId.slice(0, 8)} refused: ${res.status} ${(await res.text()).slice(0, 200)}`);
    } catch (e) {
      this.o.log?.(`probe ${m.probeId.slice(0, 8)} not sent: ${(e as Error).message}`);
    }
  }

  /**
   * Takes up a stage: its model, starting from the stage's latest checkpoint
   * (a late joiner or a moved miner does not start from scratch), the outer
   * optimizer's anchor, a pipeline worker, and on stage 0 the feeding of
   * microbatches. A previous stage's worker is stopped first; its in-flight
   * work is re-sent by stage 0.
   */
  private async takeStage(stage: number): Promise<void> {
    const registration = this.registration!;
    const { minerId, layout } = registration;
    const log = this.o.log ?? (() => {});
    if (this.worker) log(`moving to stage ${stage + 1}`);
    this.rate.length = 0; // a new worker counts its tokens from 0
    this.gaps.length = 0;
    this.lastWorkAt = 0;
    this.lastReceivedAt = 0;
    this.endMerge();
    this.tokensBefore += this.worker?.stats.tokens ?? 0;
    this.worker?.dispose();
    this.model?.dispose();
    registration.stage = stage;
    const config = PRESETS[layout.preset];
    const model = new Stage(stageSpecs(config, layout)[stage]!, layout.seed);
    this.model = model;
    this.phase = 'downloading';
    const latest = await getRetrying(`${this.o.coordinatorUrl}/api/checkpoints/${stage}/latest`);
    let anchorRound = 0;
    if (latest.ok) {
      anchorRound = Number(latest.headers.get('x-round') ?? 0) || 0;
      const weights = await this.download(latest, `stage ${stage + 1} weights`);
      this.meter.add('checkpoint', 'received', weights.length);
      importStageWeights(model, weights);
      this.resumedFrom = latest.headers.get('x-content-hash') ?? 'unknown';
      log(`loaded stage ${stage + 1}'s latest checkpoint (${this.resumedFrom.slice(0, 12)})`);
    }
    this.outer = new OuterOptimizer(await readFlat(model));
    if (this.model !== model) return; // moved again meanwhile
    this.sinceMerge = 0;
    this.phase = 'training';
    this.butterfly = new ButterflyNode(
      minerId,
      async (to, bytes) => {
        const out = this.o.tamperAllReduce ? this.o.tamperAllReduce(to, bytes) : bytes;
        await this.mesh!.send(to, { kind: 'partition', runId: registration.runId, epoch: 0, activationId: crypto.getRandomValues(new Uint8Array(16)), pathway: [] }, out);
      },
      (from, code, message) => log(`all-reduce refused a message from ${from.slice(0, 8)}…: ${code} ${message}`),
    );
    const worker = new PipelineWorker({
      selfId: minerId,
      stage: model,
      runId: registration.runId,
      mesh: this.mesh!,
      nextPeers: () => this.stageMap.peers(stage + 1),
      rank: () => this.stageMap.peers(stage).indexOf(minerId),
      rotation: () => (layout.incentives?.rotatePathways === false ? 0 : this.stageRound),
      previousPeers: stage > 0 ? () => this.previousPeers(stage) : undefined,
      epoch: () => 0,
      ...layout.training,
      microbatchTimeoutMs: this.o.microbatchTimeoutMs,
      preferDirect: this.o.preferDirectPeers,
      onLoss: (r) => {
        this.lastLoss = r.loss;
        this.report('loss', { v: PROTOCOL_VERSION, epoch: 0, activationId: r.activationId, pathway: r.pathway, loss: r.loss });
      },
      onTransfer: (t) => {
        this.uncompressedBytes += layout.training.batchSize * config.contextLength * config.dModel * 4;
        const at = performance.now();
        if (this.lastWorkAt > 0) {
          this.gaps.push(at - this.lastWorkAt);
          if (this.gaps.length > 20) this.gaps.shift();
        }
        this.lastWorkAt = at;
        if (t.to === minerId) this.lastReceivedAt = at;
        this.rate.push([at, this.worker?.stats.tokens ?? 0, this.worker?.stats.computeMs ?? 0]);
        if (this.rate.length > 1000) this.rate.shift();
        this.report('receipt', { v: PROTOCOL_VERSION, epoch: 0, ...t });
        if (this.o.misbehave?.forgeReceipts) {
          const invented = bytesToHex(randomBytes(16));
          const peer = t.from === minerId ? t.to : t.from;
          this.report('receipt', { v: PROTOCOL_VERSION, epoch: 0, ...t, activationId: invented, from: minerId, to: peer });
        }
      },
      onReject: (from, reason) => log(`refused a message from ${from.slice(0, 8)}…: ${reason}`),
      onStep: () => this.sinceMerge++,
      onOp: (op) => recorder?.add(op),
      round: () => recorder?.serial,
      // The last stage refuses microbatches whose tokens are not the windows their id is assigned (FOREIGN_TOKENS).
      checkTokens: model.spec.isLast ? (id, batch) => this.foreignTokens(layout, id, batch) : undefined,
      deviceCodec: this.o.deviceCodec,
      misbehave: this.o.misbehave,
    });
    this.worker = worker;
    this.warmReplicas(stage);
    // tokens/s counts from here: with one sample only, a miner training its first microbatches showed 0.
    this.rate.push([performance.now(), 0, 0]);
    // The first round starts from the weights just loaded and a fresh optimizer. A stage whose record could not be
    // uploaded keeps none (the validator draws none of its rounds): gigabytes of host memory, for nothing.
    const floor = recordFloorBytes(countStageParameters(model.spec), this.o.backend !== EXACT_REPLAY_BACKEND);
    const recorder = floor <= MAX_RECORD_BYTES ? new RoundRecorder(registration.runId, minerId, stage) : undefined;
    if (recorder) {
      const startWeights = await exportStageWeights(model);
      recorder.start(anchorRound, contentHash(startWeights), await worker.compute.exportState(), startWeights);
    } else log(`stage ${stage + 1}'s rounds are not recorded: a record would take at least ${Math.round(floor / 2 ** 20)} MiB, over the ${MAX_RECORD_BYTES / 2 ** 20} MiB an audit uploads`);
    // Each recorder holds its last rounds with their start weights: one past stage is enough.
    this.previousRecorder = this.recorder ?? this.previousRecorder;
    this.recorder = recorder;
    if (stage === 0) void this.feed(config.contextLength, layout, worker);
    else if (model.spec.isLast) void this.o.tokens.train(config.vocabSize, runDataset({ dataset: layout.dataset, vocabSize: config.vocabSize }), this.dataBytes).then((t) => (this.runTokens = t)).catch((e: Error) => log(`run data not loaded (targets unchecked): ${e.message}`));
  }

  /** Why a microbatch's tokens are not the run data its id is assigned (undefined: they are, or the data is not loaded yet). */
  private foreignTokens(layout: RunLayout, id: Uint8Array, batch: TokenBatch): string | undefined {
    if (!this.runTokens) return undefined;
    const assigned = assignedWindows(this.runTokens, batch.batch, batch.time, layout.seed, id);
    const same = (a: Int32Array, b: Int32Array): boolean => a.length === b.length && a.every((x, i) => x === b[i]);
    return same(assigned.inputs, batch.inputs) && same(assigned.targets, batch.targets) ? undefined : 'FOREIGN_TOKENS: the tokens are not the windows of the run data this microbatch id is assigned';
  }

  /**
   * The coordinator chose one of this miner's finished rounds for an audit
   * (after it closed): uploads its record. A miner that cannot answer fails
   * the audit, so records are kept for the last few rounds (RECORDS_KEPT).
   */
  private async onAudit(m: AuditRequest): Promise<void> {
    if (typeof m?.auditId !== 'string' || !/^[0-9a-f]{32}$/.test(m.auditId) || !Number.isInteger(m.round)) return;
    if (this.o.misbehave?.refuseAudits) return;
    // The coordinator asks again until it has the answer: one upload at a time per audit.
    if (this.auditing.has(m.auditId)) return;
    this.auditing.add(m.auditId);
    // One upload at a time, in the order asked: the miner's uplink is one line, and uploads side by side would make
    // every record late. The record waits its turn pinned (RoundRecorder.pin): kept however many rounds pass.
    const recorder = [this.recorder, this.previousRecorder].find((r) => r?.stage === m.stage);
    recorder?.pin(m.round);
    const turn = this.auditQueue.then(() => this.answerAudit(m));
    this.auditQueue = turn.catch(() => {});
    try {
      await turn;
    } finally {
      this.auditing.delete(m.auditId);
      recorder?.unpin(m.round);
    }
  }

  private async answerAudit(m: AuditRequest): Promise<void> {
    // Of this stage, or of one it held before it was moved (rebalancing moved honest miners with audits still to answer).
    const record = [this.recorder, this.previousRecorder].find((r) => r?.stage === m.stage)?.find(m.round);
    if (!record) {
      this.audits.missing++;
      this.o.log?.(`audit of round ${m.round}: no record of it kept`);
      return;
    }
    const bytes = encodeRecord(record);
    const signature = this.o.identity.sign('audit', { runId: this.registration!.runId, auditId: m.auditId, hash: contentHash(bytes) });
    // A failed upload (the coordinator busy or restarting) is tried again, a few times, within the deadline.
    for (let attempt = 0; attempt < 4; attempt++) {
      try {
        const res = await fetch(`${this.o.coordinatorUrl}/api/audits/${m.auditId}`, {
          method: 'PUT',
          headers: { 'content-type': 'application/octet-stream', 'x-miner-id': this.registration!.minerId, 'x-signature': signature },
          body: bytes as unknown as BodyInit,
        });
        this.meter.add('audit', 'sent', bytes.length);
        if (res.ok) {
          this.audits.answered++;
          return;
        }
        this.o.log?.(`audit ${m.auditId.slice(0, 8)} refused: ${res.status} ${(await res.text()).slice(0, 200)}`);
        if (res.status < 500 && res.status !== 429) return; // refused by name: sending it again changes nothing
      } catch (e) {
        this.o.log?.(`audit ${m.auditId.slice(0, 8)} not sent: ${(e as Error).message}`);
      }
      await new Promise((r) => setTimeout(r, 1000 * 2 ** attempt));
    }
  }

  /**
   * Connects to the stage's other replicas ahead of the all-reduce, which sends to each of them: opened only once
   * the round began, the connections of a swarm's first merge took longer than its senders' window on a busy
   * machine, and most replicas failed that round (TOO_FEW_PEERS), so their first round's work could be neither
   * audited nor paid. Done when the stage is taken and again when a merge is called (replicas that came since).
   */
  private warmReplicas(stage: number): void {
    const self = this.registration?.minerId;
    for (const peer of this.stageMap.peers(stage)) if (peer !== self) this.mesh?.warm(peer);
  }

  /** The coordinator calls a merge of this miner's stage: pause between two messages, then say what we hold. */
  private async onMergeStart(m: MergeStart): Promise<void> {
    const registration = this.registration;
    if (!registration || m?.stage !== registration.stage || !Number.isInteger(m.round) || this.merging) return;
    const worker = this.worker!;
    const layout = registration.layout;
    // If the round never comes (the coordinator went away), training resumes on its own.
    const timer = setTimeout(() => this.endMerge(), layout.merge.readyMs + layout.merge.roundMs + 5_000);
    this.merging = { stage: m.stage, round: m.round, timer };
    this.warmReplicas(m.stage);
    await worker.pause();
    if (this.merging?.round !== m.round || this.worker !== worker) return;
    try {
      // The round's end, committed before anyone knows whether it will be audited.
      const endWeights = await exportStageWeights(this.model!);
      const endState = await worker.compute.exportState();
      const weightsHash = contentHash(endWeights);
      await nextTurn(); // a gpu stage's hashes take seconds: heartbeats go out between them
      const optimizerHash = contentHash(endState);
      await nextTurn();
      // Where the round began (committed beside its end): the weights and the optimizer state of its record's start.
      const start = this.recorder?.begun();
      // And what it will contribute to the merge, in either mode: owners take only slices these roots prove.
      const prepared = await prepareContribution(this.model!, this.outer!, layout.merge.precision, this.o.misbehave?.contribution);
      if (this.merging?.round !== m.round || this.worker !== worker) return;
      this.merging.prepared = prepared;
      this.merging.optimizerHash = optimizerHash;
      // The round's record is kept from here, whatever the merge does (an audit may draw it); a merge that goes through
      // starts the next from the merged weights, else it goes on from this committed end state.
      // On a backend whose replay is not bit-exact, the record keeps that end state too (an audit compares within a tolerance).
      // Where it began is committed beside its end.
      this.recorder?.close(m.round, weightsHash, endState, endWeights, this.o.backend !== EXACT_REPLAY_BACKEND, optimizerHash);
      try {
        await request(this.socket!, 'merge-ready', {
          v: PROTOCOL_VERSION,
          stage: m.stage,
          round: m.round,
          stateId: this.outer!.stateId(),
          microbatches: this.sinceMerge,
          weightsHash,
          optimizerHash,
          contributionRoots: prepared.roots,
          ...(start ? { start } : {}),
        });
      } catch (e) {
        // Refused by name, and not named a participant meanwhile: nothing was committed, the round goes on.
        if (e instanceof CoordinatorError && !this.merging?.allReduce) throw e;
        if (this.merging?.round === m.round && !this.merging.allReduce) {
          // Unanswered (slow, or the connection dropped): it may have been stored or not. merge-go says which (its
          // participants are exactly the replicas whose merge-ready was stored): named, the round is committed and the
          // merge goes on; not named (or no merge-go at all), the round goes on as after a refusal (onMergeGo, endMerge).
          this.merging.unanswered = true;
          this.o.log?.(`merge ${m.round}: no answer to merge-ready (${(e as Error).message}); merge-go will say whether it was taken`);
          return;
        }
      }
      this.committed(m.round, worker);
    } catch (e) {
      this.o.log?.(`merge ${m.round}: the coordinator did not take this replica's answer (${(e as Error).message})`);
      if (this.merging?.round === m.round) {
        // Still paused: nothing ran since the record closed, so it goes on as one round. (Once the merge ended without
        // this replica, training went on into the next record: the closed one stays closed, uncommitted.)
        this.recorder?.reopen(m.round);
        this.endMerge();
      }
    }
  }

  /**
   * The round of this merge is committed (its record closed with merge-ready, and a forward from before it went to
   * that record: its gradient takes no step, the worker sees to that through RoundRecorder.serial). If the merge
   * then does not go through here, the next round goes on from the committed end state (endMerge).
   */
  private committed(round: number, worker: PipelineWorker): void {
    if (this.worker !== worker) return;
    const ended = this.endedUncommitted;
    if (!this.merging && ended?.round === round && ended.worker === worker) {
      // The answer came after the merge had given up on it (its timer): the round was committed all the same.
      this.endedUncommitted = undefined;
      this.outer?.reset(ended.current);
      return;
    }
    if (this.merging?.round !== round || this.merging.merged) return;
    this.merging.committed = true;
  }

  private async onMergeGo(go: MergeGo): Promise<void> {
    const registration = this.registration;
    if (!registration || !this.merging || go?.stage !== this.merging.stage || go.round !== this.merging.round) return;
    const prepared = this.merging.prepared;
    if (!Array.isArray(go.participants) || !go.participants.includes(registration.minerId) || !prepared) {
      // Answered too late for this round: keep training, the work counts next time. Not named, its merge-ready was not
      // stored (merge-go's participants are exactly the replicas whose merge-ready was) and is refused if it still
      // comes: a record closed for it (prepared: set as the record closes) goes on as one round, reopened now, before
      // training resumes (once the worker's next ops are in the next record it cannot be, and the closed one's sends
      // would be in a record nobody draws).
      if (prepared) this.recorder?.reopen(this.merging.round);
      this.endMerge();
      return;
    }
    // Named, so its merge-ready was stored: the round is committed, though the answer may not have come yet (the last
    // replica ready hears merge-go before it) or never come (unanswered).
    this.merging.unanswered = false;
    if (this.worker) this.committed(go.round, this.worker);
    // The all-reduce is bounded by the round's own timeouts (roundMs): training must not resume in the middle of
    // it (steps taken then would be overwritten by the merged weights, and would end up in the audited round's record).
    clearTimeout(this.merging.timer);
    this.merging.allReduce = true;
    const model = this.model!;
    this.stageRound = go.round;
    try {
      const outcome = await runMerge(go, model, this.outer!, this.butterfly!, prepared);
      if (this.model !== model) return; // moved stage meanwhile
      if (outcome.ok) {
        if (this.merging) this.merging.merged = true;
        this.worker?.merged();
        // The round is over; the next starts from the merged weights and the optimizer state committed with merge-ready.
        this.recorder?.finish();
        // (A merge moves weights, not the optimizer state: it is the one committed with merge-ready.)
        if (this.worker) this.recorder?.start(go.round, outcome.hash, await this.worker.compute.exportState(), outcome.weights, this.merging?.optimizerHash);
      }
      const { round: detail, weights, ...summary } = outcome;
      if (outcome.ok) this.lastMerged = { stage: go.stage, round: go.round, hash: outcome.hash, weights };
      this.merges.push({ stage: go.stage, round: go.round, mode: go.mode, participants: go.participants.length, ...summary });
      if (this.merges.length > 1000) this.merges.shift();
      this.o.log?.(
        `merge ${go.round} of stage ${go.stage + 1} (${go.mode}, ${go.participants.length} miner(s) of the stage): ${outcome.ok ? 'ok' : outcome.error}, weights ${outcome.hash.slice(0, 12)}` +
          (detail ? `, ${detail.bytesSent} B sent, ${detail.bytesReceived} B received in ${Math.round(detail.ms)} ms` : '') +
          (outcome.evidence.length ? `, ${outcome.evidence.length} disputed partition(s)` : '') +
          (detail?.refused.length ? `, refused ${detail.refused.length} slice(s) their senders had not committed to` : ''),
      );
      this.sinceMerge = 0;
      this.report('merged', {
        v: PROTOCOL_VERSION,
        stage: go.stage,
        round: go.round,
        ok: outcome.ok,
        ...(outcome.error ? { error: outcome.error } : {}),
        hash: outcome.hash,
        clipped: outcome.clipped,
        evidence: outcome.evidence.slice(0, 256).map((e) => ({ partition: e.partition, owners: e.owners, hashes: e.hashes, ...(e.liar ? { liar: e.liar } : {}) })),
        ...(detail ? { received: detail.received.slice(0, 256) } : {}),
        ...(detail?.refused.length ? { refused: detail.refused.slice(0, 256) } : {}),
        ...(detail?.clippedFrom.length ? { clippedFrom: detail.clippedFrom.slice(0, 256) } : {}),
      });
      if (outcome.ok && go.uploader === registration.minerId) await this.upload(registration, go.round, weights);
    } catch (e) {
      this.o.log?.(`merge ${go.round} failed: ${(e as Error).message}`);
    } finally {
      this.endMerge();
    }
  }

  private endMerge(): void {
    if (!this.merging) return;
    clearTimeout(this.merging.timer);
    // Its merge-ready went unanswered and no merge-go named it: not stored, so the round goes on as after a refusal.
    if (this.merging.unanswered) this.recorder?.reopen(this.merging.round);
    // A committed round whose merge did not go through here (failed, missed, never came): the next round goes on from
    // that committed end state (its audit record starts there), so its contribution to the next merge is counted from
    // there too, as after a merge that averaged weights: the end state becomes the outer anchor and the momentum restarts.
    if (this.merging.committed && !this.merging.merged && this.merging.prepared) this.outer?.reset(this.merging.prepared.current);
    // Not known yet (merge-ready still unanswered when the merge's timer ran out): its answer may still say so.
    this.endedUncommitted =
      !this.merging.committed && !this.merging.merged && !this.merging.unanswered && this.merging.prepared && this.worker
        ? { round: this.merging.round, worker: this.worker, current: this.merging.prepared.current }
        : undefined;
    this.merging = undefined;
    this.worker?.resume();
  }

  /** Each peer's path (direct, TURN, coordinator) and bytes: its own mesh's, or, in a tab, as the page's mesh last told it. */
  paths(): Map<string, PeerPathStats> | undefined {
    return this.mesh?.paths();
  }

  /**
   * Peers that no path reached: a send to them failed so within the last minute, or, of this miner's neighbours now,
   * its mesh's last attempt to connect to them (made by either end: a last stage only answers) never carried data.
   */
  private noPathPeers(now: number, neighbours: string[] = []): number {
    const ids = new Set<string>();
    for (const [id, at] of this.unreachablePeers) {
      if (now - at < 60_000) ids.add(id);
      else this.unreachablePeers.delete(id);
    }
    const paths = this.mesh?.paths();
    for (const id of neighbours) if (paths?.get(id)?.path === 'unreachable') ids.add(id);
    return ids.size;
  }

  /** Fresh ICE servers from the coordinator for the mesh's next connections (TURN credentials expire, or were refused). */
  private async refreshIce(): Promise<void> {
    if (!this.socket?.connected) return;
    try {
      const ice = await requestIce(this.socket);
      this.mesh?.setIceServers(ice.iceServers);
      this.scheduleIceRefresh(ice.expiresAt);
    } catch (e) {
      this.o.log?.(`could not refresh the ICE servers: ${(e as Error).message}`);
    }
  }

  /** At four fifths of their lifetime, TURN credentials are replaced (none to replace: nothing scheduled). */
  private scheduleIceRefresh(expiresAt: number | null): void {
    clearTimeout(this.iceTimer);
    if (expiresAt === null || !this.running) return;
    this.iceTimer = setTimeout(() => void this.refreshIce(), Math.max(10_000, (expiresAt - Date.now()) * 0.8));
  }

  /** Registers (again), keeping its place in the coordinator's queue in the status (and now and then in the log) while it waits. */
  private async register(socket: Socket): Promise<Registration> {
    try {
      return await register(socket, this.o.identity, { backend: this.o.backend, tokensPerSec: this.o.tokensPerSec, instance: this.instance }, (update) => {
        const first = !this.queued;
        this.queued = update;
        if (first || Date.now() - this.queuedLoggedAt > 10_000) {
          this.queuedLoggedAt = Date.now();
          this.o.log?.(`queued to join: position ${update.position}, about ${Math.ceil(update.estimateMs / 1000)} s`);
        }
      });
    } finally {
      this.queued = undefined;
    }
  }

  /**
   * After the coordinator comes back (or the connection does): registers again
   * and sends the loss reports it could not deliver; takes up another stage if
   * the coordinator now gives it one.
   */
  private async rejoin(socket: Socket): Promise<void> {
    try {
      const again = await this.register(socket);
      this.rejoined++;
      // A restarted coordinator may name other ICE servers, or mint with another secret.
      if (again.ice) {
        this.mesh?.setIceServers(again.ice.iceServers);
        this.scheduleIceRefresh(again.ice.expiresAt);
      }
      this.o.log?.(`re-registered with the coordinator, stage ${again.stage + 1}`);
      // What waited goes first, before anything else this miner says on the new connection: a receipt of the round in
      // progress arriving after a merge-ready that closed it would fall in the next round's audit window, as a send
      // that round's record does not hold.
      this.connectedToCoordinator = true;
      this.unreachable = undefined;
      const resend = [...this.unanswered.values()];
      this.unanswered.clear();
      for (const [event, payload] of [...resend, ...this.unsent.splice(0)]) this.report(event, payload);
      // A merge still waiting for merge-go will not get it; one in its all-reduce ends on its own deadlines
      // (resumed now, training would run in the middle of it, and end up in the audited round's record).
      if (!this.merging?.allReduce) this.endMerge();
      if (again.stage !== this.registration!.stage) await this.takeStage(again.stage);
    } catch (e) {
      this.o.log?.(`could not re-register: ${(e as Error).message}`);
    }
  }

  /**
   * Sends a loss report, receipt or merge report, in the order they happened; while the coordinator is away they
   * wait (receipts and losses bounded) and go on re-registration. A merge report lost with its connection is sent
   * again before what followed it: without it the weights this miner's next round starts from are known to nobody
   * (when its merge ended elsewhere than the stage's majority), and an audit of that round cannot be replayed.
   */
  private report(event: ReportEvent, payload: object, first = false): void {
    if (!this.socket?.connected || !this.connectedToCoordinator) {
      if (first) this.unsent.unshift([event, payload]);
      else if (event === 'merged' || this.unsent.length < 10_000) this.unsent.push([event, payload]);
      return;
    }
    if (event !== 'merged') {
      const key = this.reportSeq++;
      this.unanswered.set(key, [event, payload]);
      this.socket.emit(event, payload, (reply: { ok?: boolean; error?: { code?: string } } | undefined) => {
        if (!this.unanswered.delete(key)) return; // sent again since, on another connection
        if (reply?.ok || reply?.error?.code === 'REPLAYED') this.reportsStored[event]++;
      });
      return;
    }
    const round = (payload as { round: number }).round;
    request(this.socket, 'merged', payload).catch((e: Error) => {
      this.o.log?.(`merge ${round}: report ${e instanceof CoordinatorError ? 'refused' : 'not acknowledged'} (${e.message})`);
      // Refused by name, or only slow (the connection still up, so it arrives in order): nothing to send again.
      if (!(e instanceof CoordinatorError) && !this.socket?.connected) this.report('merged', payload, true);
    });
  }

  /**
   * Miners of the previous stage, including those that left the map within
   * the grace period (their activations in flight are still good).
   */
  private previousPeers(stage: number): string[] {
    return [...this.stageMap.peers(stage - 1), ...this.departing];
  }

  /**
   * A new stage map. A neighbour missing from it for departureGraceMs is
   * forgotten, with its in-flight work. The grace matters while a restarted
   * coordinator rebuilds the map miner by miner: the peers themselves, still
   * connected directly, have not gone anywhere.
   */
  private onStageMap(left: string[]): void {
    for (const id of left) {
      this.departing.add(id);
      setTimeout(() => {
        this.departing.delete(id);
        if (!this.running || this.stageMap.ids().has(id)) return;
        const dropped = this.worker?.forgetPeer(id) ?? 0;
        this.mesh?.close(id);
        if (dropped > 0) this.o.log?.(`miner ${id.slice(0, 8)}… left; ${dropped} microbatch(es) in flight dropped`);
      }, this.o.departureGraceMs ?? 5000);
    }
  }

  /** Stage 0: keeps maxInFlight microbatches in the pipeline until stopped. */
  private async feed(time: number, layout: RunLayout, worker: PipelineWorker): Promise<void> {
    this.phase = 'downloading';
    const vocabSize = PRESETS[layout.preset].vocabSize;
    const tokens = await this.o.tokens.train(vocabSize, runDataset({ dataset: layout.dataset, vocabSize }), this.dataBytes);
    if (this.worker !== worker) return;
    this.phase = 'training';
    // Each microbatch's windows are the ones its id is assigned (the last stage and audits check them).
    const ids = this.o.dataSeed === undefined ? undefined : mulberry32(this.o.dataSeed);
    const nextId = (): Uint8Array => (ids ? Uint8Array.from({ length: 16 }, () => Math.floor(ids() * 256)) : crypto.getRandomValues(new Uint8Array(16)));
    const draw = (): [TokenBatch, Uint8Array] => {
      const id = nextId();
      const batch = assignedWindows(tokens, layout.training.batchSize, time, layout.seed, id);
      return [this.o.misbehave?.tokens ? this.o.misbehave.tokens(batch) : batch, id];
    };
    // Wait for a miner on the next stage.
    while (this.running && this.stageMap.peers(1).length === 0) await new Promise((r) => setTimeout(r, 100));
    let submitted = 0;
    const limit = this.o.maxMicrobatches ?? Infinity;
    const lane = async (): Promise<void> => {
      // Until stopped, or until this worker is replaced (the miner moved to another stage).
      while (this.running && this.worker === worker && submitted < limit) {
        // A re-sent microbatch gets a new id, and so the windows of that id.
        const [batch, id] = draw();
        try {
          await worker.submit(batch, id);
          submitted++;
          this.completed++;
        } catch (e) {
          // Its pathway broke: the lane sends another microbatch, on another pathway.
          this.resubmitted++;
          this.o.log?.(`microbatch re-routed: ${(e as Error).message}`);
          await new Promise((r) => setTimeout(r, 200));
        }
      }
    };
    await Promise.all(Array.from({ length: this.o.maxInFlight ?? 1 }, lane));
  }

  /** Sends the stage's merged weights to the coordinator as its checkpoint for that round, signed. */
  private async upload(registration: Registration, step: number, bytes: Uint8Array): Promise<void> {
    const signed = { runId: registration.runId, stage: registration.stage, step, hash: contentHash(bytes) };
    try {
      const res = await fetch(`${this.o.coordinatorUrl}/api/checkpoints/${registration.stage}`, {
        method: 'PUT',
        headers: { 'content-type': 'application/octet-stream', 'x-miner-id': registration.minerId, 'x-step': String(step), 'x-signature': this.o.identity.sign('checkpoint', signed) },
        body: bytes as unknown as BodyInit,
      });
      this.meter.add('checkpoint', 'sent', bytes.length);
      if (!res.ok) this.o.log?.(`checkpoint at step ${step} refused: ${res.status} ${await res.text()}`);
      else this.checkpointsUploaded++;
    } catch (e) {
      this.o.log?.(`checkpoint at step ${step} not sent: ${(e as Error).message}`);
    }
  }

  stop(): void {
    this.running = false;
    this.phase = 'stopped';
    this.endMerge();
    clearInterval(this.heartbeat);
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.iceTimer);
    this.worker?.dispose();
    this.mesh?.close();
    this.model?.dispose();
    this.socket?.disconnect();
    this.stageMap.close();
  }
}

/** What a person reads when no path reaches some of its peers: what is wrong, and what they can do. */
export function noPathText(peers: number): string {
  return `cannot reach ${peers === 1 ? 'a peer' : `${peers} peers`}: no direct or TURN path got through (a firewall or strict NAT blocks WebRTC). Try another network (a phone hotspot) or ask the run's operator for TURN`;
}

/** What a person reads while the coordinator is away: that it is unreachable, for how long, and when the next try is. */
function unreachableText(gone: { since: number; nextTryAt: number }, now: number): string {
  const next = Math.max(0, Math.ceil((gone.nextTryAt - now) / 1000));
  return `coordinator unreachable for ${Math.round((now - gone.since) / 1000)} s — retrying ${next === 0 ? 'now' : `in ${next} s`}`;
}
