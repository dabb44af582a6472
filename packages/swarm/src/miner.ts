import { BatchSampler, PRESETS, Stage, contentHash, exportStageWeightsSync, importStageWeights, stageSpecs, type BackendName, type PresetName } from '@train-at-home/model';
import { PROTOCOL_VERSION, verifySignature, type Identity } from '@train-at-home/protocol';
import { io, type Socket } from 'socket.io-client';
import { coordinatorSignals, register, type Registration } from './coordinator-client';
import { PeerMesh } from './mesh';
import { PipelineWorker } from './pipeline';

/** Where a first-stage miner gets training tokens (disk in Node, HTTP ranges in a browser). */
export interface TokenSource {
  train(vocabSize: number): Promise<Uint16Array>;
}

export interface MinerOptions {
  coordinatorUrl: string;
  identity: Identity;
  backend: BackendName;
  tokensPerSec: number;
  tokens: TokenSource;
  /** A WebRTC implementation for Node; browsers pass nothing. */
  wrtc?: object;
  /** How often to tell the coordinator this miner is alive. */
  heartbeatMs?: number;
  /** A neighbour absent from the stage map this long is taken to have left. */
  departureGraceMs?: number;
  /** Stage 0 gives up on (and re-sends the data of) a microbatch not back in this time. */
  microbatchTimeoutMs?: number;
  /** Microbatches stage 0 keeps in the pipeline at once. */
  maxInFlight?: number;
  /** Stage 0 stops after submitting this many (default: no limit). */
  maxMicrobatches?: number;
  /** Seeds this miner's choice of training windows (random by default, so replicas see different data). */
  dataSeed?: number;
  log?: (line: string) => void;
}

type RunLayout = Registration['layout'] & {
  preset: PresetName;
  seed: number;
  training: { batchSize: number; peakLr: number; warmupSteps: number; totalSteps: number; checkpointEvery: number };
};

/**
 * One miner: registers with the coordinator, takes the stage it is given,
 * connects to its neighbours peer to peer and trains. The browser tab and
 * the Node miner both run this; they differ only in backend, WebRTC and token source.
 */
export class Miner {
  private socket?: Socket;
  private mesh?: PeerMesh;
  private worker?: PipelineWorker;
  private model?: Stage;
  private stageMap: string[][] = [];
  private running = false;
  private heartbeat?: ReturnType<typeof setInterval>;
  private reconnectTimer?: ReturnType<typeof setTimeout>;
  private connectedToCoordinator = true;
  private readonly unsent: Array<['loss' | 'receipt', object]> = [];
  /** Times this miner registered again after losing the coordinator. */
  rejoined = 0;
  registration?: Registration & { layout: RunLayout };
  /** Hash of the checkpoint this miner started from, if it joined a run in progress. */
  resumedFrom?: string;
  checkpointsUploaded = 0;
  /** Stage 0: microbatches whose gradient came back and was applied; and how many were sent again. */
  completed = 0;
  resubmitted = 0;

  constructor(private readonly o: MinerOptions) {}

  get stats(): PipelineWorker['stats'] | undefined {
    return this.worker?.stats;
  }

  async start(): Promise<void> {
    const log = this.o.log ?? (() => {});
    // Reconnects on its own; peers stay connected to each other meanwhile.
    const socket = io(this.o.coordinatorUrl, { transports: ['websocket'], reconnection: true, reconnectionDelay: 500, reconnectionDelayMax: 2000 });
    this.socket = socket;
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', () => resolve());
      socket.once('connect_error', reject);
    });
    socket.on('stages', (m: { stages: string[][] }) => this.onStageMap(m.stages));
    socket.on('disconnect', () => {
      this.connectedToCoordinator = false;
      // Keep knocking until the coordinator is back. socket.io's own reconnection
      // stops for good once the server has closed the connection itself (as a
      // coordinator shutting down does), so it cannot be relied on here.
      const retry = (): void => {
        if (!this.running || socket.connected) return;
        socket.connect();
        this.reconnectTimer = setTimeout(retry, 1000);
      };
      clearTimeout(this.reconnectTimer);
      this.reconnectTimer = setTimeout(retry, 500);
    });
    const registration = (await register(socket, this.o.identity, { backend: this.o.backend, tokensPerSec: this.o.tokensPerSec })) as Registration & { layout: RunLayout };
    this.registration = registration;
    const { minerId, stage, layout } = registration;
    log(`registered as ${minerId.slice(0, 8)}…, stage ${stage} of ${layout.stages} (${layout.preset}, b=${layout.bottleneck}${layout.int8 ? ', int8' : ''})`);

    this.mesh = new PeerMesh({
      selfId: minerId,
      wrtc: this.o.wrtc,
      signals: coordinatorSignals(socket, this.o.identity, (from, signed, sig) => verifySignature('signal', signed, sig, `0x${from}`)),
    });
    const config = PRESETS[layout.preset];
    this.model = new Stage(stageSpecs(config, layout)[stage]!, layout.seed);
    // A late joiner starts from the stage's latest checkpoint, not from scratch.
    const latest = await fetch(`${this.o.coordinatorUrl}/api/checkpoints/${stage}/latest`);
    if (latest.ok) {
      importStageWeights(this.model, new Uint8Array(await latest.arrayBuffer()));
      this.resumedFrom = latest.headers.get('x-content-hash') ?? 'unknown';
      log(`loaded stage ${stage}'s latest checkpoint (${this.resumedFrom.slice(0, 12)})`);
    }
    this.worker = new PipelineWorker({
      selfId: minerId,
      stage: this.model,
      runId: registration.runId,
      mesh: this.mesh,
      nextPeers: () => this.stageMap[stage + 1] ?? [],
      epoch: () => 0,
      ...layout.training,
      microbatchTimeoutMs: this.o.microbatchTimeoutMs,
      onLoss: (r) => this.report('loss', { v: PROTOCOL_VERSION, epoch: 0, activationId: r.activationId, pathway: r.pathway, loss: r.loss }),
      onTransfer: (t) => this.report('receipt', { v: PROTOCOL_VERSION, epoch: 0, ...t }),
      onReject: (from, reason) => log(`refused a message from ${from.slice(0, 8)}…: ${reason}`),
      onStep: (step) => {
        if (step % layout.training.checkpointEvery === 0) void this.upload(registration, step);
      },
    });
    this.running = true;
    // Every later connection (automatic reconnection, or ours below) registers again.
    socket.on('connect', () => void this.rejoin(socket));
    let seq = 0;
    this.heartbeat = setInterval(() => socket.emit('heartbeat', { v: PROTOCOL_VERSION, seq: seq++ }), this.o.heartbeatMs ?? 2000);
    if (stage === 0) void this.feed(config.contextLength, layout);
  }

  /**
   * After the coordinator comes back (or the connection does): registers again
   * and sends the loss reports it could not deliver. A different stage than
   * before would need other weights: the miner says so and stops.
   */
  private async rejoin(socket: Socket): Promise<void> {
    try {
      const again = await register(socket, this.o.identity, { backend: this.o.backend, tokensPerSec: this.o.tokensPerSec });
      this.rejoined++;
      if (again.stage !== this.registration!.stage) {
        this.o.log?.(`the coordinator moved this miner to stage ${again.stage}; restart it to take that stage`);
        this.stop();
        return;
      }
      this.o.log?.(`re-registered with the coordinator, stage ${again.stage}`);
      this.connectedToCoordinator = true;
      for (const [event, payload] of this.unsent.splice(0)) this.report(event, payload);
    } catch (e) {
      this.o.log?.(`could not re-register: ${(e as Error).message}`);
    }
  }

  /** Sends a loss report or receipt; while the coordinator is away they wait (bounded) and go on re-registration. */
  private report(event: 'loss' | 'receipt', payload: object): void {
    if (!this.socket?.connected || !this.connectedToCoordinator) {
      if (this.unsent.length < 10_000) this.unsent.push([event, payload]);
      return;
    }
    this.socket.emit(event, payload);
  }

  /**
   * A new stage map. A neighbour missing from it for departureGraceMs is
   * forgotten, with its in-flight work. The grace matters while a restarted
   * coordinator rebuilds the map miner by miner: the peers themselves, still
   * connected directly, have not gone anywhere.
   */
  private onStageMap(stages: string[][]): void {
    const before = new Set(this.stageMap.flat());
    this.stageMap = stages;
    const now = new Set(stages.flat());
    for (const id of before) {
      if (now.has(id)) continue;
      setTimeout(() => {
        if (!this.running || this.stageMap.flat().includes(id)) return;
        const dropped = this.worker?.forgetPeer(id) ?? 0;
        this.mesh?.close(id);
        if (dropped > 0) this.o.log?.(`miner ${id.slice(0, 8)}… left; ${dropped} microbatch(es) in flight dropped`);
      }, this.o.departureGraceMs ?? 5000);
    }
  }

  /** Stage 0: keeps maxInFlight microbatches in the pipeline until stopped. */
  private async feed(time: number, layout: RunLayout): Promise<void> {
    const tokens = await this.o.tokens.train(PRESETS[layout.preset].vocabSize);
    const sampler = new BatchSampler(tokens, layout.training.batchSize, time, this.o.dataSeed ?? Math.floor(Math.random() * 2 ** 31));
    // Wait for a miner on the next stage.
    while (this.running && (this.stageMap[1]?.length ?? 0) === 0) await new Promise((r) => setTimeout(r, 100));
    let submitted = 0;
    const limit = this.o.maxMicrobatches ?? Infinity;
    const lane = async (): Promise<void> => {
      let batch = sampler.next();
      while (this.running && submitted < limit) {
        try {
          await this.worker!.submit(batch);
          submitted++;
          this.completed++;
          batch = sampler.next();
        } catch (e) {
          // Its pathway broke: the same microbatch goes again, on another pathway.
          this.resubmitted++;
          this.o.log?.(`microbatch re-routed: ${(e as Error).message}`);
          await new Promise((r) => setTimeout(r, 200));
        }
      }
    };
    await Promise.all(Array.from({ length: this.o.maxInFlight ?? 2 }, lane));
  }

  /** Sends a snapshot of this stage's weights to the coordinator, signed. */
  private async upload(registration: Registration, step: number): Promise<void> {
    const bytes = exportStageWeightsSync(this.model!);
    const signed = { runId: registration.runId, stage: registration.stage, step, hash: contentHash(bytes) };
    try {
      const res = await fetch(`${this.o.coordinatorUrl}/api/checkpoints/${registration.stage}`, {
        method: 'PUT',
        headers: { 'content-type': 'application/octet-stream', 'x-miner-id': registration.minerId, 'x-step': String(step), 'x-signature': this.o.identity.sign('checkpoint', signed) },
        body: bytes as unknown as BodyInit,
      });
      if (!res.ok) this.o.log?.(`checkpoint at step ${step} refused: ${res.status} ${await res.text()}`);
      else this.checkpointsUploaded++;
    } catch (e) {
      this.o.log?.(`checkpoint at step ${step} not sent: ${(e as Error).message}`);
    }
  }

  stop(): void {
    this.running = false;
    clearInterval(this.heartbeat);
    clearTimeout(this.reconnectTimer);
    this.worker?.dispose();
    this.mesh?.close();
    this.model?.dispose();
    this.socket?.disconnect();
  }
}
