import { FrameError, type AssembledMessage, type FrameErrorCode, type FrameHeader, type IceServer } from '@train-at-home/protocol';
import { PeerMesh, type Mesh, type MeshOptions, type PeerPathStats, type SignalTransport } from './mesh';

/**
 * The peer mesh across a thread boundary. Browsers give WebRTC to the page
 * only (a dedicated worker has no RTCPeerConnection), while the miner trains
 * in a Web Worker. So the worker's miner talks to a `MeshPort`, and the page
 * runs the one real `PeerMesh` (`hostMesh`): data channels, framing,
 * backpressure, reassembly and hash checks all stay in that shared code. What
 * crosses the port is whole messages (payloads transferred, not copied) and
 * the signals, which the worker signs and relays through its coordinator socket.
 */

/** The part of a Worker, a worker's global scope or a MessagePort this needs. */
export interface PortLike {
  postMessage(message: unknown, transfer?: Transferable[]): void;
  addEventListener(type: 'message', listener: (event: MessageEvent) => void): void;
  start?: () => void;
}

type SignalKind = 'offer' | 'answer' | 'candidate';

/** Worker → page. */
export type ToHost =
  | { mesh: 'init'; selfId: string; highWaterBytes?: number; connectTimeoutMs?: number; iceServers?: IceServer[] }
  /** The run's ICE servers changed (fresh TURN credentials): for connections opened from now on. */
  | { mesh: 'ice'; iceServers: IceServer[] }
  | { mesh: 'send'; id: number; peerId: string; header: FrameHeader; payload: Uint8Array }
  | { mesh: 'close'; peerId?: string }
  /** Open a connection ahead of need (PeerMesh.warm). */
  | { mesh: 'warm'; peerId: string }
  | { mesh: 'signal-in'; from: string; kind: SignalKind; payload: string };

/** Page → worker. */
export type ToWorker =
  | { mesh: 'sent'; id: number; bytes: number; payloadHash: string }
  | { mesh: 'send-failed'; id: number; error: string }
  | { mesh: 'message'; from: string; message: AssembledMessage }
  | { mesh: 'reject'; from: string; code: string; error: string }
  | { mesh: 'signal-out'; to: string; kind: SignalKind; payload: string }
  /** A connection failed: the worker asks the coordinator for fresh ICE servers and answers with 'ice'. */
  | { mesh: 'refresh-ice' }
  /** Each peer's path and bytes, every few seconds (the miner's heartbeat tells the dashboard). */
  | { mesh: 'paths'; paths: Array<[string, PeerPathStats]> };

/** How often the page tells the worker its mesh's paths. */
export const PATHS_EVERY_MS = 2_000;

/** A detached copy of a view's bytes, so its buffer can be transferred. */
function own(bytes: Uint8Array): Uint8Array {
  return bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength && bytes.buffer instanceof ArrayBuffer ? bytes : bytes.slice();
}

/** The worker's side: a Mesh whose connections live on the other side of `port`. */
export class MeshPort implements Mesh {
  private readonly handlers: Array<(from: string, message: AssembledMessage) => void> = [];
  private readonly rejectHandlers: Array<(from: string, error: FrameError) => void> = [];
  private readonly waiting = new Map<number, { resolve: (r: { bytes: number; payloadHash: string }) => void; reject: (e: Error) => void }>();
  private nextId = 0;
  private closed = false;
  private lastPaths = new Map<string, PeerPathStats>();

  constructor(
    private readonly port: PortLike,
    options: Pick<MeshOptions, 'selfId' | 'signals' | 'highWaterBytes' | 'connectTimeoutMs' | 'iceServers' | 'refreshIce'>,
  ) {
    options.signals.onSignal((from, kind, payload) => this.post({ mesh: 'signal-in', from, kind, payload }));
    port.addEventListener('message', (event) => {
      const m = event.data as ToWorker | undefined;
      if (!m || typeof m !== 'object' || !('mesh' in m)) return;
      switch (m.mesh) {
        case 'sent':
        case 'send-failed': {
          const w = this.waiting.get(m.id);
          this.waiting.delete(m.id);
          if (m.mesh === 'sent') w?.resolve({ bytes: m.bytes, payloadHash: m.payloadHash });
          else w?.reject(new Error(m.error));
          break;
        }
        case 'message':
          if (!this.closed) for (const h of this.handlers) h(m.from, m.message);
          break;
        case 'reject':
          for (const h of this.rejectHandlers) h(m.from, new FrameError(m.code as FrameErrorCode, m.error.replace(`${m.code}: `, '')));
          break;
        case 'signal-out':
          if (!this.closed) options.signals.send(m.to, m.kind, m.payload);
          break;
        case 'refresh-ice':
          // refreshIce calls setIceServers, which answers the page; without one the page stops waiting on its own.
          if (!this.closed) void options.refreshIce?.().catch(() => {});
          break;
        case 'paths':
          this.lastPaths = new Map(m.paths);
          break;
      }
    });
    port.start?.();
    this.post({ mesh: 'init', selfId: options.selfId, highWaterBytes: options.highWaterBytes, connectTimeoutMs: options.connectTimeoutMs, iceServers: options.iceServers });
  }

  setIceServers(iceServers: IceServer[]): void {
    if (!this.closed) this.post({ mesh: 'ice', iceServers });
  }

  /** Each peer's path and bytes as the page's mesh last told them (every PATHS_EVERY_MS). */
  paths(): Map<string, PeerPathStats> {
    return new Map([...this.lastPaths].map(([id, p]) => [id, { ...p }]));
  }

  onMessage(handler: (from: string, message: AssembledMessage) => void): void {
    this.handlers.push(handler);
  }

  onReject(handler: (from: string, error: FrameError) => void): void {
    this.rejectHandlers.push(handler);
  }

  send(peerId: string, header: FrameHeader, payload: Uint8Array): Promise<{ bytes: number; payloadHash: string }> {
    if (this.closed) return Promise.reject(new Error('the mesh is closed'));
    const id = this.nextId++;
    // Copies: the caller may still hold these views (the page's side, not the caller, owns what it transfers).
    const body = payload.slice();
    const activationId = header.activationId.slice();
    return new Promise((resolve, reject) => {
      this.waiting.set(id, { resolve, reject });
      this.post({ mesh: 'send', id, peerId, header: { ...header, activationId }, payload: body }, [body.buffer as ArrayBuffer]);
    });
  }

  warm(peerId: string): void {
    if (!this.closed) this.post({ mesh: 'warm', peerId });
  }

  close(peerId?: string): void {
    this.post({ mesh: 'close', peerId });
    if (peerId) return;
    this.closed = true;
    for (const w of this.waiting.values()) w.reject(new Error('the mesh is closed'));
    this.waiting.clear();
  }

  private post(m: ToHost, transfer: Transferable[] = []): void {
    this.port.postMessage(m, transfer);
  }
}

export interface MeshHost {
  /** The page's mesh of the current miner (a new one after each `init`). */
  readonly mesh: PeerMesh | undefined;
  /** Upload cap in bytes per second (0 or Infinity: none); can change at any time. */
  setUploadCap(bytesPerSecond: number): void;
  close(): void;
}

/**
 * The page's side: owns the real PeerMesh for the miner in the worker behind
 * `port`. A new `init` (the miner restarted) replaces the previous mesh.
 */
export function hostMesh(port: PortLike, options: { wrtc?: object; uploadBytesPerSec?: number; pathsEveryMs?: number } = {}): MeshHost {
  let mesh: PeerMesh | undefined;
  // The worker's miner reports its paths with its heartbeats: it is told them this often.
  const pathsTimer = setInterval(() => {
    if (mesh) post({ mesh: 'paths', paths: [...mesh.paths()] });
  }, options.pathsEveryMs ?? PATHS_EVERY_MS);
  let signalHandler: ((from: string, kind: SignalKind, payload: string) => void) | undefined;
  let cap = options.uploadBytesPerSec ?? Infinity;
  const iceWaiters: Array<() => void> = [];
  const post = (m: ToWorker, transfer: Transferable[] = []): void => port.postMessage(m, transfer);
  port.addEventListener('message', (event) => {
    const m = event.data as ToHost | undefined;
    if (!m || typeof m !== 'object' || !('mesh' in m)) return;
    switch (m.mesh) {
      case 'init': {
        mesh?.close();
        const signals: SignalTransport = {
          send: (to, kind, payload) => post({ mesh: 'signal-out', to, kind, payload }),
          onSignal: (h) => (signalHandler = h),
        };
        // Fresh ICE servers come from the worker, which holds the coordinator socket: asked for, then awaited (5 s at most).
        const refreshIce = (): Promise<void> =>
          new Promise<void>((resolve) => {
            iceWaiters.push(resolve);
            setTimeout(resolve, 5000);
            post({ mesh: 'refresh-ice' });
          });
        const created = new PeerMesh({ selfId: m.selfId, signals, wrtc: options.wrtc, highWaterBytes: m.highWaterBytes, connectTimeoutMs: m.connectTimeoutMs, uploadBytesPerSec: () => cap, iceServers: m.iceServers, refreshIce });
        created.onMessage((from, message) => {
          if (mesh !== created) return;
          const payload = own(message.payload);
          post({ mesh: 'message', from, message: { ...message, payload } }, [payload.buffer as ArrayBuffer]);
        });
        created.onReject((from, e) => post({ mesh: 'reject', from, code: e.code, error: e.message }));
        mesh = created;
        break;
      }
      case 'warm':
        mesh?.warm(m.peerId);
        break;
      case 'send': {
        const target = mesh;
        if (!target) {
          post({ mesh: 'send-failed', id: m.id, error: 'no mesh: the worker sent before init' });
          break;
        }
        target.send(m.peerId, m.header, m.payload).then(
          (r) => post({ mesh: 'sent', id: m.id, ...r }),
          (e: Error) => post({ mesh: 'send-failed', id: m.id, error: e.message }),
        );
        break;
      }
      case 'close':
        mesh?.close(m.peerId);
        break;
      case 'ice':
        mesh?.setIceServers(m.iceServers);
        for (const w of iceWaiters.splice(0)) w();
        break;
      case 'signal-in':
        signalHandler?.(m.from, m.kind, m.payload);
        break;
    }
  });
  port.start?.();
  return {
    get mesh() {
      return mesh;
    },
    setUploadCap(bytesPerSecond) {
      cap = bytesPerSecond > 0 ? bytesPerSecond : Infinity;
    },
    close() {
      clearInterval(pathsTimer);
      mesh?.close();
      mesh = undefined;
    },
  };
}
