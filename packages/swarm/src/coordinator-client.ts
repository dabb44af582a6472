import { PROTOCOL_VERSION, type AdmissionQueued, type IceConfig, type Identity } from '@train-at-home/protocol';
import type { BackendName, Precision } from '@train-at-home/model';
import type { Socket } from 'socket.io-client';

export interface Registration {
  minerId: string;
  stage: number;
  runId: number;
  layout: { name: string; preset: string; stages: number; bottleneck: number; int8: boolean; codec?: Precision };
  /** Each stage's merge round when this miner registered (pathways rotate with it). */
  rounds?: number[];
  /** The run's STUN and TURN servers (TURN credentials minted for this miner) and whether the coordinator relays frames. */
  ice?: IceConfig;
  /** How often the coordinator wants a heartbeat (its operator's setting). */
  heartbeatMs?: number;
  /** This registration was another process than the key's last one: a restart, and how many of its audits it forfeited. */
  restarted?: { forfeited: number };
}

/** Fresh ICE servers and TURN credentials for this registered miner. */
export async function requestIce(socket: Socket): Promise<IceConfig> {
  return (await request<{ ice: IceConfig }>(socket, 'ice', { v: PROTOCOL_VERSION })).ice;
}

/**
 * A GET that a dropped connection does not fail (a keep-alive connection the server closed just as it was reused, a
 * flaky home link): tried again after 0.5, 1 and 2 s. Any HTTP answer, whatever its status, is returned as it came.
 */
export async function getRetrying(url: string, attempts = 4): Promise<Response> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fetch(url);
    } catch (e) {
      if (attempt >= attempts) throw e;
      await new Promise((r) => setTimeout(r, 500 * 2 ** (attempt - 1)));
    }
  }
}

export class CoordinatorError extends Error {
  override name = 'CoordinatorError';
  constructor(
    readonly code: string,
    message: string,
    /** For a refusal that says when to try again (RATE_LIMITED, RELAY_CAP): how long to wait. */
    readonly retryAfterMs?: number,
  ) {
    super(`${code}: ${message}`);
  }
}

/** Refusals that trying again cannot change: the coordinator will not take this miner into its run. */
export const PERMANENT_REFUSALS: readonly string[] = ['UNSUITABLE_BACKEND', 'FLAGGED'];

/** The miner CLI's exit status when the coordinator refused it for good (local miners are then not started again). */
export const MINER_EXIT_REFUSED = 3;

export function isPermanentRefusal(e: unknown): e is CoordinatorError {
  return e instanceof CoordinatorError && PERMANENT_REFUSALS.includes(e.code);
}

type Reply = { ok: true; [k: string]: unknown } | { ok: false; error: { code: string; message: string; retryAfterMs?: number } };

/** Emits an event and waits for the coordinator's acknowledgement; a rejection throws its named code. */
export async function request<T>(socket: Socket, event: string, payload: unknown, timeoutMs = 10_000): Promise<T> {
  return answered<T>((await socket.timeout(timeoutMs).emitWithAck(event, payload)) as Reply);
}

/** A reply's answer, or its rejection thrown by its named code. */
function answered<T>(reply: Reply): T {
  if (!reply.ok) throw new CoordinatorError(reply.error.code, reply.error.message, typeof reply.error.retryAfterMs === 'number' ? reply.error.retryAfterMs : undefined);
  return reply as unknown as T;
}

/**
 * The registration handshake: hello with the public key, receive a one-use
 * challenge, answer with a signature over it and this miner's capabilities.
 * When joins come faster than the coordinator takes them, the registration
 * waits its turn: `onQueued` hears its place as the coordinator tells it, and
 * the answer is waited for as long as those come (a join that waits is not a
 * failure; only `idleMs` with no word at all is).
 */
export async function register(
  socket: Socket,
  identity: Identity,
  info: { backend: BackendName; tokensPerSec: number; instance?: string },
  onQueued?: (update: AdmissionQueued) => void,
  idleMs = 10_000,
): Promise<Registration> {
  const { challenge } = await request<{ challenge: string }>(socket, 'hello', { v: PROTOCOL_VERSION, publicKey: identity.publicKey });
  const signed = { publicKey: identity.publicKey, challenge, backend: info.backend, tokensPerSec: info.tokensPerSec, ...(info.instance ? { instance: info.instance } : {}) };
  const payload = { v: PROTOCOL_VERSION, ...signed, signature: identity.sign('register', signed) };
  const reply = await new Promise<Reply>((resolve, reject) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const end = (): void => {
      clearTimeout(timer);
      socket.off('queued', queued);
      socket.off('disconnect', closed);
    };
    const arm = (): void => {
      clearTimeout(timer);
      timer = setTimeout(() => (end(), reject(new Error(`no answer to register, and no word of a queue, within ${idleMs} ms`))), idleMs);
    };
    const queued = (update: AdmissionQueued): void => {
      arm();
      onQueued?.(update);
    };
    // A connection that closes has no answer coming: the caller registers again on the next one (its place kept).
    const closed = (): void => (end(), reject(new Error('the connection closed before the registration was answered')));
    socket.on('queued', queued);
    socket.on('disconnect', closed);
    arm();
    socket.emit('register', payload, (r: Reply) => (end(), resolve(r)));
  });
  return answered<Registration>(reply);
}

/**
 * Signaling through the coordinator: each offer, answer and candidate is
 * signed with the miner's key (binding the DTLS fingerprint in the SDP to
 * the registered identity); the coordinator checks and relays it, adding the
 * sender's id, and the receiver checks the signature again.
 */
export function coordinatorSignals(socket: Socket, identity: Identity, verify: (from: string, signed: object, signature: string) => boolean): {
  send: (to: string, kind: 'offer' | 'answer' | 'candidate', payload: string) => void;
  onSignal: (handler: (from: string, kind: 'offer' | 'answer' | 'candidate', payload: string) => void) => void;
} {
  let seq = 0;
  return {
    send(to, kind, payload) {
      const signed = { to, kind, payload, seq: seq++ };
      socket.emit('signal', { v: PROTOCOL_VERSION, ...signed, signature: identity.sign('signal', signed) });
    },
    onSignal(handler) {
      socket.on('signal', (m: { from: string; to: string; kind: 'offer' | 'answer' | 'candidate'; payload: string; seq: number; signature: string }) => {
        if (!verify(m.from, { to: m.to, kind: m.kind, payload: m.payload, seq: m.seq }, m.signature)) return;
        handler(m.from, m.kind, m.payload);
      });
    },
  };
}

/** How often a relayed chunk refused for the frame event's rate limit is sent again before the send fails. */
const RELAY_ATTEMPTS = 5;

/** The coordinator's frame relay: chunks go up as binary 'frame' events and come down the same way. */
export function coordinatorRelay(socket: Socket): { send: (to: string, chunk: Uint8Array) => Promise<void>; onChunk: (handler: (from: string, chunk: Uint8Array) => void) => void } {
  return {
    // Acknowledged, one chunk at a time: a chunk over the event's rate limit waits as told and goes again
    // (a few times: a relay that stays busy fails the send); any other refusal fails it at once.
    async send(to, chunk) {
      for (let attempt = 1; ; attempt++) {
        try {
          await request(socket, 'frame', { v: PROTOCOL_VERSION, to, chunk });
          return;
        } catch (e) {
          if (!(e instanceof CoordinatorError && e.code === 'RATE_LIMITED' && attempt < RELAY_ATTEMPTS)) throw e;
          await new Promise((r) => setTimeout(r, Math.min(e.retryAfterMs ?? 100, 2_000)));
        }
      }
    },
    onChunk(handler) {
      socket.on('frame', (m: { from: string; chunk: ArrayBuffer | Uint8Array }) => {
        const chunk = m.chunk instanceof Uint8Array ? m.chunk : new Uint8Array(m.chunk);
        handler(m.from, chunk);
      });
    },
  };
}
