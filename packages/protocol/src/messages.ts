import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { TypeCompiler, type TypeCheck } from '@sinclair/typebox/compiler';
import { TRAFFIC_KINDS } from './traffic';

/**
 * Socket messages between miners and the coordinator. Every message carries
 * the protocol version `v`; every event has a schema and a size bound.
 * Anything that fails is rejected with a named reason and changes nothing.
 */
export const PROTOCOL_VERSION = 1;
/** No socket message needs more: bulk bytes go peer to peer as frames. */
export const MAX_SOCKET_MESSAGE_BYTES = 64 * 1024;
/**
 * Each event's own bound (its JSON), checked before its schema: a heartbeat is
 * under 2 KiB with every figure at its largest (dashboard.test), a signal carries
 * an SDP (under 32 KiB), a merge report at most 256 disputes.
 */
export const MAX_EVENT_BYTES: Record<string, number> = {
  hello: 1024,
  register: 2048,
  heartbeat: 2048,
  signal: 40 * 1024,
  receipt: 1024,
  loss: 4096,
  'merge-ready': 1024,
  merged: MAX_SOCKET_MESSAGE_BYTES,
  ice: 256,
};

const Hex32 = Type.String({ pattern: '^0x[0-9a-fA-F]{64}$' });
const Hex64 = Type.String({ pattern: '^0x[0-9a-fA-F]{128}$' });
const Version = Type.Literal(PROTOCOL_VERSION);
const Backend = Type.Union([Type.Literal('webgpu'), Type.Literal('webgl'), Type.Literal('wasm'), Type.Literal('cpu')]);
const MinerId = Type.String({ minLength: 1, maxLength: 64, pattern: '^[A-Za-z0-9_-]+$' });
const Sha256Hex = Type.String({ pattern: '^[0-9a-f]{64}$' });
/** 16 bytes as 32 hex characters: the id of one microbatch. */
const ActivationId = Type.String({ pattern: '^[0-9a-f]{32}$' });
/** PostgreSQL's integer: every integer field stored in one has its bounds. */
const INT4_MAX = 2 ** 31 - 1;
/** Peers on one path and the bytes both ways over it (a heartbeat's `paths`). */
const PathUse = Type.Object({ peers: Type.Integer({ minimum: 0, maximum: 100_000 }), bytes: Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }) }, { additionalProperties: false });
const Bytes = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
/** Bytes a miner sent and received since it started, per kind (a heartbeat's `traffic`: traffic.ts). */
const TrafficUse = Type.Object(
  Object.fromEntries(TRAFFIC_KINDS.map((k) => [k, Type.Optional(Type.Object({ sent: Bytes, received: Bytes }, { additionalProperties: false }))])),
  { additionalProperties: false },
);

export const ClientEvents = {
  /** Asks for fresh ICE servers (TURN credentials are short-lived): answered with an IceConfig. */
  ice: Type.Object({ v: Version }, { additionalProperties: false }),
  /** Asks for a registration challenge. */
  hello: Type.Object({ v: Version, publicKey: Hex32 }, { additionalProperties: false }),
  /** Answers the challenge: a signature over { challenge, publicKey, backend, tokensPerSec, instance }. */
  register: Type.Object(
    {
      v: Version,
      publicKey: Hex32,
      challenge: Hex32,
      backend: Backend,
      tokensPerSec: Type.Number({ minimum: 0, maximum: 1e9 }),
      /**
       * This miner process's own random id (a Miner object's, kept across its reconnections): another one under the
       * same key is a restart (a reloaded tab, a lost GPU device's fallback, a restarted Node miner), whose optimizer
       * state and round records are new. Absent: the same process as before.
       */
      instance: Type.Optional(Type.String({ pattern: '^[0-9a-f]{32}$' })),
      signature: Hex64,
    },
    { additionalProperties: false },
  ),
  /** I am alive; with what the miner is doing now, for the dashboard (its own word: shown, never paid for). */
  heartbeat: Type.Object(
    {
      v: Version,
      seq: Type.Integer({ minimum: 0 }),
      status: Type.Optional(
        Type.Object(
          {
            phase: Type.Union(['registering', 'downloading', 'waiting', 'training', 'merging', 'idle', 'stopped'].map((p) => Type.Literal(p))),
            why: Type.Optional(Type.String({ maxLength: 200 })),
            /** Tokens this miner processed per second, lately. */
            tokensPerSec: Type.Number({ minimum: 0, maximum: 1e7 }),
            microbatches: Type.Integer({ minimum: 0, maximum: INT4_MAX }),
            /** Per path its peers take (direct, through TURN, through the coordinator's relay), how many and the bytes both ways. */
            paths: Type.Optional(
              Type.Object({ direct: Type.Optional(PathUse), turn: Type.Optional(PathUse), coordinator: Type.Optional(PathUse) }, { additionalProperties: false }),
            ),
            traffic: Type.Optional(TrafficUse),
            /** Tokens its stages processed since it started, what `traffic` is per trained token of. */
            trainedTokens: Type.Optional(Bytes),
          },
          { additionalProperties: false },
        ),
      ),
    },
    { additionalProperties: false },
  ),
  /** WebRTC signaling, signed by the sender over { to, kind, payload, seq }. */
  signal: Type.Object(
    {
      v: Version,
      to: MinerId,
      kind: Type.Union([Type.Literal('offer'), Type.Literal('answer'), Type.Literal('candidate')]),
      payload: Type.String({ maxLength: 32 * 1024 }),
      seq: Type.Integer({ minimum: 0 }),
      signature: Hex64,
    },
    { additionalProperties: false },
  ),
  /** One end's confirmation of a transfer; work counts when both ends confirm. */
  receipt: Type.Object(
    {
      v: Version,
      epoch: Type.Integer({ minimum: 0, maximum: INT4_MAX }),
      activationId: ActivationId,
      direction: Type.Union([Type.Literal('activation'), Type.Literal('gradient')]),
      from: MinerId,
      to: MinerId,
      bytes: Type.Integer({ minimum: 0, maximum: 64 * 1024 * 1024 }),
      payloadHash: Type.String({ pattern: '^[0-9a-f]{64}$' }),
    },
    { additionalProperties: false },
  ),
  /** The last stage's loss for a microbatch, with the pathway it took. */
  loss: Type.Object(
    {
      v: Version,
      epoch: Type.Integer({ minimum: 0, maximum: INT4_MAX }),
      activationId: ActivationId,
      pathway: Type.Array(MinerId, { minItems: 1, maxItems: 32 }),
      loss: Type.Number({ minimum: 0, maximum: 100 }),
    },
    { additionalProperties: false },
  ),
  /** A replica paused for its stage's merge: what it holds (anchor and outer momentum, hashed) and the work it did. */
  'merge-ready': Type.Object(
    {
      v: Version,
      stage: Type.Integer({ minimum: 0, maximum: 63 }),
      round: Type.Integer({ minimum: 1, maximum: INT4_MAX }),
      stateId: Sha256Hex,
      microbatches: Type.Integer({ minimum: 0 }),
      /**
       * Commitments to the round's end, made before anyone knows whether it will
       * be audited: the content hash of the replica's weights (what its merge
       * contribution is computed from) and the hash of its optimizer state
       * (StageCompute.exportState: the next round starts from it).
       */
      weightsHash: Sha256Hex,
      optimizerHash: Sha256Hex,
      /**
       * The Merkle roots of what it will contribute to the merge, in either
       * mode (packages/swarm/src/allreduce/commitment.ts): the partitions'
       * owners take only slices the root proves, and an audit compares the
       * root with where the round leads.
       */
      contributionRoots: Type.Object({ outer: Sha256Hex, average: Sha256Hex }, { additionalProperties: false }),
      /**
       * Where the round began: the merge round whose weights it started from (0: the run's initial weights), their
       * content hash and its optimizer state's. An audit's record must start there; and when the replica's report of
       * that merge never arrived, or the coordinator holds no commitment of its for that round (a merge-ready it
       * never took), this commitment (made before the draw) is what the audit replays from.
       */
      start: Type.Optional(
        Type.Object({ round: Type.Integer({ minimum: 0, maximum: INT4_MAX }), hash: Sha256Hex, optimizerHash: Type.Optional(Sha256Hex) }, { additionalProperties: false }),
      ),
    },
    { additionalProperties: false },
  ),
  /** After the all-reduce: the hash of the weights the replica now holds, and any disagreement it saw. */
  merged: Type.Object(
    {
      v: Version,
      stage: Type.Integer({ minimum: 0, maximum: 63 }),
      round: Type.Integer({ minimum: 1, maximum: INT4_MAX }),
      ok: Type.Boolean(),
      /** The round's error code when it failed (the replica kept its weights). */
      error: Type.Optional(Type.String({ maxLength: 64, pattern: '^[A-Z_]+$' })),
      hash: Sha256Hex,
      clipped: Type.Integer({ minimum: 0 }),
      evidence: Type.Array(
        Type.Object(
          {
            partition: Type.Integer({ minimum: 0, maximum: 65535 }),
            owners: Type.Tuple([MinerId, MinerId]),
            hashes: Type.Tuple([Sha256Hex, Sha256Hex]),
            liar: Type.Optional(MinerId),
          },
          { additionalProperties: false },
        ),
        { maxItems: 256 },
      ),
      /** As an owner: the hash of each sender's encoded slice of the partitions it reduced (audits check them). */
      received: Type.Optional(
        Type.Array(
          Type.Object({ partition: Type.Integer({ minimum: 0, maximum: 65535 }), from: MinerId, hash: Sha256Hex }, { additionalProperties: false }),
          { maxItems: 256 },
        ),
      ),
      /** As an owner: the contributions CenteredClip clipped in the partitions it reduced (its own among them, maybe), by sender. */
      clippedFrom: Type.Optional(
        Type.Array(Type.Object({ partition: Type.Integer({ minimum: 0, maximum: 65535 }), from: MinerId }, { additionalProperties: false }), { maxItems: 256 }),
      ),
      /** As an owner: the slices it refused because their Merkle proof did not lead to the sender's committed root (COMMITMENT_MISMATCH). */
      refused: Type.Optional(
        Type.Array(Type.Object({ partition: Type.Integer({ minimum: 0, maximum: 65535 }), from: MinerId }, { additionalProperties: false }), { maxItems: 256 }),
      ),
    },
    { additionalProperties: false },
  ),
} satisfies Record<string, TSchema>;

export type ClientEvent = keyof typeof ClientEvents;

/** One ICE server as RTCPeerConnection takes it. */
export interface IceServer {
  urls: string[];
  username?: string;
  credential?: string;
}

/**
 * How a miner's peer connections find each other, served with its registration and on request
 * ('ice'): the operator's STUN and TURN servers (none unless configured: no public server is
 * used), TURN credentials minted for this miner that expire at `expiresAt` (ms since the epoch;
 * null without TURN), and whether the coordinator's own frame relay is there as a last resort.
 */
export interface IceConfig {
  iceServers: IceServer[];
  expiresAt: number | null;
  relay: boolean;
}
export type ClientMessage<E extends ClientEvent> = Static<(typeof ClientEvents)[E]>;

export type ProtocolErrorCode =
  | 'UNKNOWN_EVENT'
  | 'TOO_LARGE'
  | 'BAD_VERSION'
  | 'SCHEMA'
  | 'BAD_SIGNATURE'
  | 'OUT_OF_PHASE'
  | 'NOT_REGISTERED'
  | 'UNKNOWN_PEER'
  | 'REPLAYED'
  /** A receipt or loss report for a microbatch no stage-0 miner ever sent. */
  | 'UNKNOWN_ACTIVATION'
  /** The validator flagged this miner: it may not take part in this run again. */
  | 'FLAGGED'
  /** The run's preset cannot be trained on this miner's backend (a `gpu` run on WASM): it may not join. */
  | 'UNSUITABLE_BACKEND'
  /** Too many messages of this kind from this connection or miner; the rejection says how long to wait. */
  | 'RATE_LIMITED'
  /** Well-formed, but beyond what this run allows (a miner or partition that is not in the round, a count no round can reach). */
  | 'OUT_OF_BOUNDS'
  /** A frame for the coordinator's relay in a run that has it off: peers connect directly or through TURN. */
  | 'RELAY_OFF'
  /** A miner's relayed bytes are over the run's cap per minute; the refusal says how long to wait. */
  | 'RELAY_CAP';

export class ProtocolError extends Error {
  override name = 'ProtocolError';
  constructor(
    readonly code: ProtocolErrorCode,
    /** The refusal without its code (what a reply's `message` carries beside `code`). */
    readonly detail: string,
  ) {
    super(`${code}: ${detail}`);
  }
}

const checkers = Object.fromEntries(Object.entries(ClientEvents).map(([k, s]) => [k, TypeCompiler.Compile(s)])) as {
  [E in ClientEvent]: TypeCheck<(typeof ClientEvents)[E]>;
};

/** Validates one incoming socket message: known event, size, version, then schema. */
export function parseClientMessage<E extends ClientEvent>(event: string, data: unknown): ClientMessage<E> {
  if (!Object.hasOwn(ClientEvents, event)) throw new ProtocolError('UNKNOWN_EVENT', `unknown event ${JSON.stringify(event).slice(0, 40)}`);
  let size: number;
  try {
    size = JSON.stringify(data ?? null).length;
  } catch {
    throw new ProtocolError('SCHEMA', 'message is not plain JSON');
  }
  const max = MAX_EVENT_BYTES[event] ?? MAX_SOCKET_MESSAGE_BYTES;
  if (size > max) throw new ProtocolError('TOO_LARGE', `${size} bytes exceed ${max} for ${event}`);
  if (typeof data === 'object' && data !== null && 'v' in data) {
    // Read as data only: a version that is an object ({ toString: 1 }) must not run or throw here.
    const v = (data as { v: unknown }).v;
    if (typeof v !== 'number') throw new ProtocolError('SCHEMA', '/v: the protocol version is a number');
    if (v !== PROTOCOL_VERSION) throw new ProtocolError('BAD_VERSION', `version ${v}, this coordinator speaks ${PROTOCOL_VERSION}`);
  }
  const checker = checkers[event as E];
  if (!checker.Check(data)) {
    const first = checker.Errors(data).First();
    throw new ProtocolError('SCHEMA', first ? `${first.path || '/'}: ${first.message}` : 'invalid message');
  }
  return data as ClientMessage<E>;
}

/**
 * Coordinator → a miner whose registration waits for its turn (server/src/admission.ts): where it stands in the
 * queue (1: next) and about how long until its turn. Sent at once and again every second while it waits; the
 * client keeps waiting for its registration's answer as long as these come.
 */
export interface AdmissionQueued {
  position: number;
  estimateMs: number;
}

/**
 * Coordinator → a miner whose round was chosen for an audit (after the round
 * closed): upload the round's record to `PUT /api/audits/:auditId` before
 * `deadlineMs` passes (its allowance, at this miner's measured upload rate).
 * A late answer is still taken and replayed until `finalMs` passes (the hard
 * bound); only a miner that has not answered by then is flagged
 * (see server/src/jobs/audits.ts).
 */
export interface AuditRequest {
  v: number;
  auditId: string;
  stage: number;
  round: number;
  /** Until the deadline, from when this request was sent (negative when it is sent again past the deadline). */
  deadlineMs: number;
  /** Until the hard bound. */
  finalMs?: number;
}

/**
 * Coordinator → a replica whose merge of `round` ended with the stage's
 * (majority) weights, when no checkpoint of that round came in: upload those
 * weights to `PUT /api/checkpoints/:stage` (x-step: round). The coordinator
 * keeps a round's checkpoint only if its hash is the round's majority hash.
 */
export interface CheckpointRequest {
  v: number;
  stage: number;
  round: number;
  hash: string;
}

/** Coordinator → replicas of a stage: pause and answer `merge-ready`. */
export interface MergeStart {
  v: number;
  stage: number;
  round: number;
}

/** Coordinator → replicas of a stage: run the round's all-reduce (see server/src/phases.ts). */
export interface MergeGo {
  v: number;
  stage: number;
  round: number;
  /** Seeds the partition map: the same on every replica. */
  seed: number;
  /** outer: replicas share (anchor, momentum) and all-reduce pseudo-gradients; average: they average weights and restart the momentum. */
  mode: 'outer' | 'average';
  participants: string[];
  /** Verified microbatches of each participant since the last merge: the mean's weights. */
  weights: Record<string, number>;
  /** The round's (a top-k run averages weights at fp16: swarm's codec.ts, roundPrecision). */
  precision: 'fp32' | 'fp16' | 'int8' | 'topk8' | 'topk32';
  reduction: { kind: 'mean' } | { kind: 'centered-clip'; radius: number; relative?: boolean };
  timeouts: { senderMs: number; reducerMs: number; roundMs: number };
  outer: { lr: number; momentum: number };
  /** This replica uploads the merged weights as the stage's checkpoint. */
  uploader: string;
  /** Each participant's contribution root for this round's mode, as it committed with merge-ready. */
  commitments: Record<string, string>;
}
