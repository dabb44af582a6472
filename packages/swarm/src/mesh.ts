import Peer from 'simple-peer';
import { encodeFrames, FrameError, payloadHashHex, Reassembler, type AssembledMessage, type FrameHeader, type IceServer, type PathSummary } from '@train-at-home/protocol';

/** How signaling reaches another miner: the coordinator's relay, signed end to end. */
export interface SignalTransport {
  send(to: string, kind: 'offer' | 'answer' | 'candidate', payload: string): void;
  onSignal(handler: (from: string, kind: 'offer' | 'answer' | 'candidate', payload: string) => void): void;
}

/** Frames through the coordinator, for two peers that cannot connect directly. */
export interface FrameRelay {
  /** Resolves when the relay took the chunk; rejects, naming why, when it refused it (relay off, over its cap). */
  send(to: string, chunk: Uint8Array): Promise<void>;
  onChunk(handler: (from: string, chunk: Uint8Array) => void): void;
}

export interface MeshOptions {
  /** Where frames go when no direct connection can be made (counted by the coordinator). */
  relay?: FrameRelay;
  /** Skip WebRTC and relay everything (networks that block it). */
  relayOnly?: boolean;
  selfId: string;
  signals: SignalTransport;
  /** A WebRTC implementation for Node (@roamhq/wrtc); browsers use their own. */
  wrtc?: object;
  /** Pause sending while this many bytes wait in a channel's buffer (the 16 MiB limit throws). */
  highWaterBytes?: number;
  /** How long a connection may take before it is abandoned. */
  connectTimeoutMs?: number;
  /** The contributor's upload cap, read before every chunk (Infinity or absent: none). */
  uploadBytesPerSec?: () => number;
  /**
   * The run's STUN and TURN servers (the coordinator's IceConfig). Absent or empty: none at all,
   * never simple-peer's public defaults; peers then connect only where host candidates reach.
   */
  iceServers?: IceServer[];
  /** Asks the coordinator for fresh ICE servers (TURN credentials), called before a failed connection is tried again. */
  refreshIce?: () => Promise<void>;
}

/** When a connection's path is read again after it opened (PeerMesh.classify): ICE settles within seconds. */
export const RECLASSIFY_MS = [1000, 3000, 10_000, 30_000];

/** How a pair's bytes travel: a direct connection (host or server-reflexive candidates), through a TURN server, or through the coordinator's relay. */
export type PeerPath = 'direct' | 'turn' | 'coordinator';

/** One peer's path and the bytes exchanged with it, over this mesh's life. */
export interface PeerPathStats {
  /** 'unreachable': the last attempt to connect (made by either end) ended before it carried data, until one does. */
  path: PeerPath | 'connecting' | 'unreachable';
  /** For TURN: how this end reaches the TURN server (udp, tcp or tls). */
  relayProtocol?: string;
  bytesSent: number;
  bytesReceived: number;
}

/** Sums a mesh's per-peer paths by path, what a miner's heartbeat tells the dashboard (peers not reached are left out). */
export function summarizePaths(paths: ReadonlyMap<string, PeerPathStats>): PathSummary {
  const out: PathSummary = {};
  for (const p of paths.values()) {
    if (p.path === 'connecting' || p.path === 'unreachable') continue;
    const s = (out[p.path] ??= { peers: 0, bytes: 0 });
    s.peers++;
    s.bytes += p.bytesSent + p.bytesReceived;
  }
  return out;
}

/** What a miner needs of its mesh: the PeerMesh itself, or a MeshPort to one on another thread. */
export type Mesh = Pick<PeerMesh, 'onMessage' | 'onReject' | 'send' | 'close' | 'setIceServers' | 'paths' | 'warm'>;

export class MeshError extends Error {
  override name = 'MeshError';
}

/** How a send that found no path to its peer at all begins its message (a MeshPort's rejection carries only the text). */
export const NO_PATH = 'no path to ';

type SimplePeer = Peer.Instance & { _channel?: { bufferedAmount: number }; _pc?: RTCPeerConnection; connected?: boolean };

interface Link {
  peer: SimplePeer;
  /** The connection attempt this peer belongs to, chosen by its initiator and carried by every signal. */
  session: string;
  initiator: boolean;
  ready: Promise<void>;
  resolve: () => void;
  reject: (e: Error) => void;
  reassembler: Reassembler;
  timer: ReturnType<typeof setTimeout>;
  /** It carried data at some point (its 'connect' came). */
  connected?: boolean;
}

/** What travels in a signal's payload: the session and simple-peer's own signal data. */
interface SignalEnvelope {
  session: string;
  data: Peer.SignalData;
}

const newSession = (): string => Math.random().toString(36).slice(2) + Date.now().toString(36);

/**
 * Direct data channels to other miners. The side that wants a connection
 * offers; if both offer at once (glare), the offer of the smaller id wins and
 * the other side answers it. Every signal names its session, so candidates of
 * an abandoned attempt are dropped instead of breaking the live one. Messages
 * are cut into frames, sent with backpressure, reassembled and hash-checked.
 */
export class PeerMesh {
  private readonly links = new Map<string, Link>();
  private readonly handlers: Array<(from: string, message: AssembledMessage) => void> = [];
  private readonly rejectHandlers: Array<(from: string, error: FrameError) => void> = [];
  readonly stats = { bytesSent: 0, bytesReceived: 0, messagesSent: 0, messagesReceived: 0 };
  private readonly peerStats = new Map<string, PeerPathStats>();
  private iceServers: IceServer[];

  constructor(private readonly options: MeshOptions) {
    this.iceServers = options.iceServers ?? [];
    options.signals.onSignal((from, kind, payload) => this.onSignal(from, kind, payload));
    options.relay?.onChunk((from, chunk) => {
      let r = this.relayReassemblers.get(from);
      if (!r) this.relayReassemblers.set(from, (r = new Reassembler()));
      this.peer(from).path = 'coordinator';
      this.receiveChunk(from, r, chunk);
    });
  }

  /** Peers reached through the coordinator's relay, because a direct connection failed. */
  readonly relayed = new Set<string>();
  private readonly relayReassemblers = new Map<string, Reassembler>();

  onMessage(handler: (from: string, message: AssembledMessage) => void): void {
    this.handlers.push(handler);
  }

  /** Chunks that fail their checks; the sender is reported, nothing is delivered. */
  onReject(handler: (from: string, error: FrameError) => void): void {
    this.rejectHandlers.push(handler);
  }

  /** ICE servers for connections opened from now on (fresh TURN credentials); open ones keep theirs. */
  setIceServers(iceServers: IceServer[]): void {
    this.iceServers = iceServers;
  }

  /** Each peer's path (direct, TURN or the coordinator) and the bytes exchanged with it. */
  paths(): Map<string, PeerPathStats> {
    return new Map([...this.peerStats].map(([id, p]) => [id, { ...p }]));
  }

  private peer(peerId: string): PeerPathStats {
    let p = this.peerStats.get(peerId);
    if (!p) this.peerStats.set(peerId, (p = { path: 'connecting', bytesSent: 0, bytesReceived: 0 }));
    return p;
  }

  /** Opens (or reuses) the connection to a peer and waits until it carries data. */
  connect(peerId: string): Promise<void> {
    const existing = this.links.get(peerId);
    if (existing) return existing.ready;
    return this.createLink(peerId, true, newSession()).ready;
  }

  /**
   * Opens the connection to a peer ahead of need, in the background (errors dropped: a send tries again, and falls
   * back to the relay as ever). Nothing for a peer reached only through the coordinator's relay.
   */
  warm(peerId: string): void {
    if (this.options.relayOnly || this.relayed.has(peerId) || this.links.has(peerId)) return;
    this.connect(peerId).catch(() => {});
  }

  isConnected(peerId: string): boolean {
    return this.links.get(peerId)?.peer.connected === true;
  }

  /** Sends one message as frames, pausing whenever the channel's buffer is full; returns what the receiver will confirm. */
  async send(peerId: string, header: FrameHeader, payload: Uint8Array): Promise<{ bytes: number; payloadHash: string }> {
    if (this.options.relay && (this.options.relayOnly || this.relayed.has(peerId))) return this.sendRelayed(peerId, header, payload);
    try {
      await this.connect(peerId);
    } catch (e) {
      // One more attempt in a new session, with fresh TURN credentials (the old ones may have expired or
      // been refused): ICE checks can also fail once on a busy machine or a flaky link.
      await this.options.refreshIce?.().catch(() => {});
      try {
        await this.connect(peerId);
      } catch {
        if (!this.options.relay) throw new MeshError(`${NO_PATH}${peerId}: neither a direct connection nor TURN reached it, and this run has no coordinator relay (${(e as Error).message})`);
        // No direct or TURN path: from now on this peer is reached through the coordinator.
        this.relayed.add(peerId);
        return this.sendRelayed(peerId, header, payload);
      }
    }
    const link = this.links.get(peerId);
    if (!link) throw new MeshError(`connection to ${peerId} closed`);
    const highWater = this.options.highWaterBytes ?? 4 * 1024 * 1024;
    for (const chunk of encodeFrames(header, payload)) {
      while ((link.peer._channel?.bufferedAmount ?? 0) > highWater) {
        if (link.peer.destroyed) throw new MeshError(`connection to ${peerId} closed while sending`);
        await new Promise((r) => setTimeout(r, 5));
      }
      if (link.peer.destroyed) throw new MeshError(`connection to ${peerId} closed while sending`);
      await this.throttle(chunk.length);
      if (link.peer.destroyed) throw new MeshError(`connection to ${peerId} closed while sending`);
      link.peer.send(chunk);
      this.stats.bytesSent += chunk.length;
      this.peer(peerId).bytesSent += chunk.length;
    }
    this.stats.messagesSent++;
    return { bytes: payload.length, payloadHash: payloadHashHex(payload) };
  }

  /** Upload cap: a token bucket holding at most one second of budget. */
  private bucket = { tokens: 0, at: 0 };
  private async throttle(bytes: number): Promise<void> {
    const rate = this.options.uploadBytesPerSec?.() ?? Infinity;
    if (!(rate > 0) || rate === Infinity) return;
    for (;;) {
      const now = performance.now();
      this.bucket.tokens = Math.min(rate, this.bucket.tokens + ((now - this.bucket.at) / 1000) * rate);
      this.bucket.at = now;
      // A chunk larger than a second's budget goes when the bucket is full (and leaves it in debt).
      if (this.bucket.tokens >= Math.min(bytes, rate)) {
        this.bucket.tokens -= bytes;
        return;
      }
      await new Promise((r) => setTimeout(r, Math.max(5, ((Math.min(bytes, rate) - this.bucket.tokens) / rate) * 1000)));
    }
  }

  /** Each chunk once the relay took the one before: a refusal (relay off, over its cap) fails the send by name, not silently. */
  private async sendRelayed(peerId: string, header: FrameHeader, payload: Uint8Array): Promise<{ bytes: number; payloadHash: string }> {
    this.peer(peerId).path = 'coordinator';
    for (const chunk of encodeFrames(header, payload)) {
      try {
        await this.options.relay!.send(peerId, chunk);
      } catch (e) {
        throw new MeshError(`the coordinator's relay refused a frame to ${peerId}: ${(e as Error).message}`);
      }
      this.stats.bytesSent += chunk.length;
      this.peer(peerId).bytesSent += chunk.length;
    }
    this.stats.messagesSent++;
    return { bytes: payload.length, payloadHash: payloadHashHex(payload) };
  }

  close(peerId?: string): void {
    if (peerId) this.relayed.delete(peerId);
    for (const [id, link] of [...this.links]) {
      if (peerId && id !== peerId) continue;
      this.dropLink(id, link, new MeshError(`connection to ${id} closed`), false);
    }
  }

  private onSignal(from: string, kind: 'offer' | 'answer' | 'candidate', payload: string): void {
    let envelope: SignalEnvelope;
    try {
      envelope = JSON.parse(payload) as SignalEnvelope;
      if (typeof envelope.session !== 'string' || typeof envelope.data !== 'object' || envelope.data === null) return;
    } catch {
      return; // the relay checked the sender's signature; a malformed payload is simply dropped
    }
    let link = this.links.get(from);
    if (kind === 'offer' && link?.session !== envelope.session) {
      if (link && link.initiator && !link.peer.connected && this.options.selfId < from) return; // glare: our offer wins
      link = this.createLink(from, false, envelope.session, link);
    }
    if (!link || link.session !== envelope.session) return; // a signal of an abandoned attempt
    link.peer.signal(envelope.data);
  }

  /** A new connection attempt; a replaced attempt's waiters are carried over to it. */
  private createLink(peerId: string, initiator: boolean, session: string, replacing?: Link): Link {
    let resolve!: () => void;
    let reject!: (e: Error) => void;
    const ready = replacing?.ready ?? new Promise<void>((res, rej) => ((resolve = res), (reject = rej)));
    if (replacing) {
      ({ resolve, reject } = replacing);
      clearTimeout(replacing.timer);
      replacing.peer.removeAllListeners();
      replacing.peer.destroy();
    }
    ready.catch(() => {}); // observed by connect(); never an unhandled rejection
    // Always the run's ICE servers, even none: simple-peer's default config names two public STUN servers.
    const peer = new Peer({ initiator, trickle: true, wrtc: this.options.wrtc as Peer.Options['wrtc'], config: { iceServers: this.iceServers } }) as SimplePeer;
    const timeoutMs = this.options.connectTimeoutMs ?? 15_000;
    const link: Link = {
      peer,
      session,
      initiator,
      ready,
      resolve,
      reject,
      reassembler: new Reassembler(),
      timer: setTimeout(() => this.dropLink(peerId, link, new MeshError(`no connection to ${peerId} within ${timeoutMs} ms`)), timeoutMs),
    };
    this.links.set(peerId, link);
    peer.on('signal', (data) => {
      const kind = 'type' in data && data.type === 'offer' ? 'offer' : 'type' in data && data.type === 'answer' ? 'answer' : 'candidate';
      this.options.signals.send(peerId, kind, JSON.stringify({ session, data } satisfies SignalEnvelope));
    });
    peer.once('connect', () => {
      link.connected = true;
      clearTimeout(link.timer);
      link.resolve();
      void this.classify(peerId, link);
    });
    peer.on('data', (bytes: Uint8Array) => this.onData(peerId, link, bytes));
    peer.on('error', () => this.dropLink(peerId, link, new MeshError(`connection to ${peerId} failed`)));
    peer.on('close', () => this.dropLink(peerId, link, new MeshError(`connection to ${peerId} closed`)));
    return link;
  }

  /**
   * Which path the connection took: the ICE agent's selected candidate pair; a relay candidate at either end is TURN.
   * Read when the connection opens and again as ICE settles (RECLASSIFY_MS after it opened): the first pair is
   * provisional. The controlled end may report its own early pick before the controlling end's nomination reaches
   * it, and a peer's relay candidate whose signal has not arrived yet is known only as peer-reflexive (it looks
   * direct) until it does. Seen through symmetric NATs: each end's first reading named a different pair.
   */
  private async classify(peerId: string, link: Link): Promise<void> {
    const pc = link.peer._pc;
    if (!pc) return;
    const opened = Date.now();
    for (const at of [0, ...RECLASSIFY_MS]) {
      const wait = opened + at - Date.now();
      if (wait > 0) await new Promise((r) => (setTimeout(r, wait) as { unref?: () => void }).unref?.()); // never what keeps a process up
      if (this.links.get(peerId) !== link || !(await this.readPath(peerId, link, pc))) return;
    }
  }

  /** One reading of the selected pair into this peer's stats; false once the connection has closed. */
  private async readPath(peerId: string, link: Link, pc: RTCPeerConnection): Promise<boolean> {
    for (let attempt = 0; attempt < 10 && this.links.get(peerId) === link; attempt++) {
      try {
        const all = new Map<string, Record<string, unknown>>();
        (await pc.getStats()).forEach((v: Record<string, unknown>) => all.set(v.id as string, v));
        const transport = [...all.values()].find((v) => v.type === 'transport' && v.selectedCandidatePairId);
        const pair = transport ? all.get(transport.selectedCandidatePairId as string) : [...all.values()].find((v) => v.type === 'candidate-pair' && v.nominated && v.state === 'succeeded');
        const local = pair && all.get(pair.localCandidateId as string);
        const remote = pair && all.get(pair.remoteCandidateId as string);
        if (local && remote) {
          const p = this.peer(peerId);
          const turn = local.candidateType === 'relay' || remote.candidateType === 'relay';
          p.path = turn ? 'turn' : 'direct';
          p.relayProtocol = local.candidateType === 'relay' ? String(local.relayProtocol ?? local.protocol ?? '') || undefined : undefined;
          return true;
        }
      } catch {
        return false; // the connection closed meanwhile
      }
      await new Promise((r) => setTimeout(r, 200));
    }
    return this.links.get(peerId) === link;
  }

  private onData(peerId: string, link: Link, bytes: Uint8Array): void {
    this.receiveChunk(peerId, link.reassembler, bytes);
  }

  private receiveChunk(peerId: string, reassembler: Reassembler, bytes: Uint8Array): void {
    this.stats.bytesReceived += bytes.length;
    this.peer(peerId).bytesReceived += bytes.length;
    try {
      const message = reassembler.push(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength));
      if (!message) return;
      this.stats.messagesReceived++;
      for (const h of this.handlers) h(peerId, message);
    } catch (e) {
      if (!(e instanceof FrameError)) throw e;
      for (const h of this.rejectHandlers) h(peerId, e);
    }
  }

  /** Ends a connection attempt; one that never carried data (and was not closed on purpose) marks its peer unreachable. */
  private dropLink(peerId: string, link: Link, reason: Error, failed = true): void {
    if (failed && !link.connected && this.links.get(peerId) === link) this.peer(peerId).path = 'unreachable';
    clearTimeout(link.timer);
    link.reject(reason);
    if (this.links.get(peerId) === link) this.links.delete(peerId);
    link.peer.removeAllListeners();
    link.peer.destroy();
  }
}
