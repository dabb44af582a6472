import { ProtocolError, newChallenge, verifySignature, type ClientEvent, type ClientMessage } from '@train-at-home/protocol';
import { UNSUITABLE_BACKENDS } from '@train-at-home/model';
import { encodeAddress } from '@polkadot/util-crypto';
import type { Socket } from 'socket.io';
import { ANNOUNCE_WAIT_MS, type ActivationRegistry } from '../activations';
import { stageForNewcomer } from '../assignment';
import { stageLoads } from '../state/stage-loads';
import type { LiveState } from '../dashboard/live';
import type { Liveness } from '../liveness';
import { iceFor, type NetworkSettings, type RelayBudget } from '../network';
import type { PhaseMachine } from '../phases';
import type { MinerChannel, RunContext } from '../run-state';
import { stageRoom, type StageMapFeed } from '../stage-map';
import { recordRestart } from '../jobs/audits';
import type { Flags } from '../state/flags';
import type { Ack } from './ack';
import { AdmissionSuperseded, type AdmissionQueue } from '../admission';

/** How long a registration challenge stays valid; a miner that answers later asks again. */
export const CHALLENGE_TTL_MS = 60_000;
/** The first key of the advisory lock that serializes stage assignment within a run (the second is the run's id). */
export const ASSIGNMENT_LOCK = 0x7a4;

/**
 * What the socket handlers use of the run (the coordinator implements it):
 * its state, the miners' connections, and the parts a miner's messages feed.
 */
export interface HandlerHost extends RunContext, MinerChannel {
  /** This process's sockets of registered miners, by miner id. */
  readonly sockets: Map<string, Socket>;
  readonly network: NetworkSettings;
  readonly relayBudget: RelayBudget;
  readonly relayed: { signalBytes: number; frameBytes: number };
  readonly heartbeatMs: number;
  readonly phases: Pick<PhaseMachine, 'status' | 'onReady' | 'onMerged' | 'noteVerified'>;
  readonly activations: Pick<ActivationRegistry, 'announce' | 'mayWait' | 'exists'>;
  readonly flags: Pick<Flags, 'noteForgery'>;
  readonly live: Pick<LiveState, 'report' | 'transfer'>;
  readonly liveness: Pick<Liveness, 'seen'>;
  readonly stageFeed: Pick<StageMapFeed, 'snapshot'>;
  readonly admission: Pick<AdmissionQueue, 'enter'>;
  sendToMiner(id: string, event: string, payload: unknown): void;
  isMinerOfRun(id: string): Promise<boolean>;
  noteMiner(id: string): void;
  minerLeft(id: string, connection: string): Promise<void>;
  publishStageMap(): Promise<void>;
  emitLoss(loss: number): void;
}

/**
 * What a connection keeps in `socket.data`: the stage of its registered miner,
 * set where the stage is assigned (registration, Coordinator.rebalanceStages), so the
 * events a miner sends most (receipts, losses) need no query to learn it.
 */
export interface MinerSocketData {
  stage?: number;
}

/** One connection's state, from its hello on. */
export interface ConnectionState {
  lastSignalSeq?: number;
  publicKey?: string;
  challenge?: { value: string; expiresAt: number };
  minerId?: string;
  rejections: number;
}

/** What a handler is given with a message: the run, the connection and its state, and when the message arrived. */
export interface EventContext {
  host: HandlerHost;
  socket: Socket;
  state: ConnectionState;
  held: MinerSocketData;
  /** The message's arrival, stamped before anything waited (clock.ts): receipts and losses are stored with it. */
  arrived: string;
}

/** A handler: the message, parsed against its schema; it answers through `ack`, or throws a ProtocolError to refuse by name. */
export type EventHandler<E extends ClientEvent> = (ctx: EventContext, msg: ClientMessage<E>, ack: Ack) => Promise<void>;

/** The registered miner's id, or a refusal by name. */
function registered(state: ConnectionState): string {
  if (!state.minerId) throw new ProtocolError('NOT_REGISTERED', 'register first');
  return state.minerId;
}

/** The first message of a connection: the miner names its key and gets a one-use challenge to sign. */
export async function hello({ host, state }: EventContext, msg: ClientMessage<'hello'>, ack: Ack): Promise<void> {
  state.publicKey = msg.publicKey;
  state.challenge = { value: newChallenge(), expiresAt: Date.now() + CHALLENGE_TTL_MS };
  ack({ ok: true, challenge: state.challenge.value, run: host.run.name });
}

/**
 * Registration: the signed challenge, checked; the miner gets its stage (the one it held, if it
 * comes back; else the least-staffed), the run's layout and ICE servers, then the stage map it needs.
 */
export async function register({ host, socket, state, held }: EventContext, msg: ClientMessage<'register'>, ack: Ack): Promise<void> {
  if (state.minerId) throw new ProtocolError('OUT_OF_PHASE', 'this connection is already registered');
  if (!state.challenge || state.publicKey !== msg.publicKey) throw new ProtocolError('OUT_OF_PHASE', 'say hello with this key first');
  if (state.challenge.value !== msg.challenge || Date.now() > state.challenge.expiresAt) {
    throw new ProtocolError('OUT_OF_PHASE', 'challenge unknown or expired; say hello again');
  }
  const { signature, v: _v, ...signed } = msg;
  if (!verifySignature('register', signed, signature, msg.publicKey)) throw new ProtocolError('BAD_SIGNATURE', 'signature does not verify');
  state.challenge = undefined; // one use
  const { preset } = host.run;
  if (UNSUITABLE_BACKENDS[preset]?.includes(msg.backend)) {
    throw new ProtocolError('UNSUITABLE_BACKEND', `this run trains the ${preset} preset, which does not run on ${msg.backend}: join it from a device with WebGPU`);
  }
  const minerId = msg.publicKey.slice(2).toLowerCase();
  // Its turn: registrations are taken a few at a time; while this one waits it is told its place (admission.ts).
  const done = await host.admission
    .enter(minerId, { tell: (update) => socket.emit('queued', update), get connected() { return socket.connected; } })
    .catch((e: unknown) => {
      throw e instanceof AdmissionSuperseded ? new ProtocolError('OUT_OF_PHASE', e.message) : e;
    });
  let joined = false;
  try {
    joined = await admitted({ host, socket, state, held }, msg, minerId, ack);
  } finally {
    done();
  }
  // Its join goes out to the others with the next publish of the stage map (batched: at most every few hundred ms
  // at scale), which the next registration does not wait for.
  if (joined) await host.publishStageMap();
}

/**
 * A registration whose turn came: the stage assigned and stored, the miner answered and sent the stages it talks to.
 * False if its connection closed meanwhile.
 */
async function admitted({ host, socket, state, held }: Omit<EventContext, 'arrived'>, msg: ClientMessage<'register'>, minerId: string, ack: Ack): Promise<boolean> {
  const { stage, restarted } = await host.db.transaction(async (tx) => {
    // One assignment at a time per run: concurrent registrations on a PostgreSQL server each read the
    // same counts and crowded one stage (PGlite runs one transaction at a time anyway).
    await tx.query('SELECT pg_advisory_xact_lock($1, $2)', [ASSIGNMENT_LOCK, host.runId]);
    // A returning miner (after a reconnection, its own restart or the coordinator's) goes back to the stage it
    // held, where its weights, its peers and its audited rounds are. Moved to the least-staffed stage instead,
    // miners coming back one by one after a restart were shuffled across stages, and a cheater reconnecting
    // under load landed on a stage where its cheat could not act. A stage left empty is refilled by
    // Coordinator.rebalanceStages, as after any departure.
    const [previous] = await tx.query<{ stage: number; status: string; instance: string | null }>('SELECT stage, status, instance FROM miners WHERE id = $1 AND run_id = $2', [minerId, host.runId]);
    if (previous?.status === 'flagged') throw new ProtocolError('FLAGGED', 'the validator flagged this miner; see /api/miners/<id>/score for why');
    const assigned =
      previous && previous.stage < host.run.stages
        ? previous.stage
        : stageForNewcomer(host.run.stages, await stageLoads(tx, host.runId));
    await tx.query(
      `INSERT INTO miners (id, run_id, public_key, address, backend, tokens_per_sec, stage, status, connection, instance)
       VALUES ($1, $2, $3, $4, $5, $6, $7, 'active', $8, $9)
       ON CONFLICT (id) DO UPDATE SET run_id = $2, backend = $5, tokens_per_sec = $6, stage = $7, status = 'active', last_seen_at = now(), connection = $8,
         stage_since = CASE WHEN miners.stage = $7 THEN miners.stage_since ELSE now() END, instance = coalesce($9, miners.instance)`,
      [minerId, host.runId, msg.publicKey, encodeAddress(msg.publicKey, 42), msg.backend, msg.tokensPerSec, assigned, socket.id, msg.instance ?? null],
    );
    // Another process under this key (a reloaded tab, a lost GPU device's fallback, a restarted miner): a restart.
    const restarted = previous?.instance && msg.instance && msg.instance !== previous.instance ? await recordRestart(tx, host.runId, minerId, previous.stage) : undefined;
    return { stage: assigned, restarted };
  });
  if (socket.disconnected) {
    // It closed while the registration was being stored: its departure found no miner then, so record it now
    // (unless a newer connection of the same miner already owns it).
    if (!host.sockets.has(minerId)) await host.minerLeft(minerId, socket.id);
    return false;
  }
  state.minerId = minerId;
  held.stage = stage;
  host.noteMiner(minerId);
  host.liveness.seen(minerId);
  // The latest registration owns the miner: an older connection of it is closed, and its close changes nothing.
  const older = host.sockets.get(minerId);
  host.sockets.set(minerId, socket);
  if (older && older !== socket) older.disconnect(true);
  // Joined, answered and sent the stages it talks to in one go: every delta after this snapshot reaches it.
  socket.join(stageRoom(stage));
  if (restarted) host.log.info({ minerId, forfeited: restarted.forfeited }, 'miner restarted under the same identity');
  ack({
    ok: true, minerId, stage, runId: host.runId, layout: host.run, rounds: host.phases.status().map((s) => s.round), ice: iceFor(host.network, minerId), heartbeatMs: host.heartbeatMs,
    ...(restarted ? { restarted } : {}),
  });
  socket.emit('stages', host.stageFeed.snapshot(stage));
  return true;
}

/** Fresh TURN credentials: a miner asks before its own expire, and when a connection through TURN failed. */
export async function ice({ host, state }: EventContext, _msg: ClientMessage<'ice'>, ack: Ack): Promise<void> {
  const minerId = registered(state);
  ack({ ok: true, ice: iceFor(host.network, minerId) });
}

/** A registered miner is alive (memory only: written in batches, liveness.ts), with its status for the dashboard. */
export async function heartbeat({ host, state }: EventContext, msg: ClientMessage<'heartbeat'>, ack: Ack): Promise<void> {
  const minerId = registered(state);
  host.liveness.seen(minerId);
  if (msg.status) host.live.report(minerId, msg.status);
  ack({ ok: true });
}

/**
 * WebRTC signaling relay, between registered miners only. The sender signs
 * { to, kind, payload, seq }; the relay checks it, refuses replays, and
 * forwards it with the sender's id (its public key) for the receiver to check again.
 */
export async function signal({ host, state }: EventContext, msg: ClientMessage<'signal'>, ack: Ack): Promise<void> {
  const minerId = registered(state);
  const { signature, v: _v, ...signed } = msg;
  if (!verifySignature('signal', signed, signature, `0x${minerId}`)) throw new ProtocolError('BAD_SIGNATURE', 'signal signature does not verify');
  if (state.lastSignalSeq !== undefined && msg.seq <= state.lastSignalSeq) throw new ProtocolError('REPLAYED', `seq ${msg.seq} after ${state.lastSignalSeq}`);
  if (msg.to === minerId || !(await host.canReach(msg.to))) throw new ProtocolError('UNKNOWN_PEER', 'no registered miner with that id is connected');
  state.lastSignalSeq = msg.seq;
  host.relayed.signalBytes += msg.payload.length;
  host.sendToMiner(msg.to, 'signal', { from: minerId, ...signed, signature });
  ack({ ok: true });
}

/**
 * The last stage's loss for one microbatch. Recorded as a training metric; the
 * validator, not this report, decides what a miner earns.
 */
export async function loss({ host, state, held, arrived }: EventContext, msg: ClientMessage<'loss'>, ack: Ack): Promise<void> {
  const minerId = registered(state);
  if (held.stage !== host.run.stages - 1) throw new ProtocolError('OUT_OF_PHASE', 'only the last stage reports losses');
  if (msg.pathway.length !== host.run.stages || msg.pathway[msg.pathway.length - 1] !== minerId) {
    throw new ProtocolError('SCHEMA', 'the pathway must name one miner per stage, ending with the reporter');
  }
  for (const id of msg.pathway) if (!(await host.isMinerOfRun(id))) throw new ProtocolError('UNKNOWN_PEER', `the pathway names ${id.slice(0, 16)}…, no miner of this run`);
  if (!host.activations.mayWait(msg.activationId, minerId)) throw new ProtocolError('RATE_LIMITED', 'too many of this miner\'s reports are waiting for their microbatch');
  if (!(await host.activations.exists(msg.activationId, ANNOUNCE_WAIT_MS, minerId))) throw new ProtocolError('UNKNOWN_ACTIVATION', 'no stage-0 miner sent this microbatch');
  // The last stage's merge round when the loss arrived: CLASP compares pathways within a round.
  const round = host.phases.status()[host.run.stages - 1]!.round;
  const inserted = await host.db.query(
    `INSERT INTO metrics (run_id, epoch, name, value, activation_id, pathway, round, created_at) VALUES ($1, $2, 'train_loss', $3, $4, $5, $6, $7)
     ON CONFLICT (run_id, name, activation_id) WHERE activation_id IS NOT NULL DO NOTHING RETURNING 1`,
    [host.runId, msg.epoch, msg.loss, msg.activationId, JSON.stringify(msg.pathway), round, arrived],
  );
  if (inserted.length === 0) throw new ProtocolError('REPLAYED', 'this microbatch was already reported');
  host.emitLoss(msg.loss);
  ack({ ok: true });
}

/**
 * One end's confirmation of a transfer. Work counts when both ends confirm the
 * same bytes and hash (see Coordinator.receiptSummary); a miner only speaks for itself.
 */
export async function receipt({ host, state, held, arrived }: EventContext, msg: ClientMessage<'receipt'>, ack: Ack): Promise<void> {
  const minerId = registered(state);
  if (msg.from !== minerId && msg.to !== minerId) throw new ProtocolError('SCHEMA', 'a receipt must name its reporter as sender or receiver');
  if (msg.from === msg.to) throw new ProtocolError('SCHEMA', 'a transfer has two ends');
  const peer = msg.from === minerId ? msg.to : msg.from;
  if (!(await host.isMinerOfRun(peer))) throw new ProtocolError('UNKNOWN_PEER', 'the other end of this transfer is no miner of this run');
  // A stage-0 miner confirming that it sends an activation announces a new microbatch; every
  // other receipt must name one that exists.
  if (held.stage === 0 && msg.direction === 'activation' && msg.from === minerId) host.activations.announce(msg.activationId, minerId);
  else if (!host.activations.mayWait(msg.activationId, minerId)) throw new ProtocolError('RATE_LIMITED', 'too many of this miner\'s receipts are waiting for their microbatch');
  else if (!(await host.activations.exists(msg.activationId, ANNOUNCE_WAIT_MS, minerId))) {
    host.flags.noteForgery(minerId, msg);
    await host.db.query('INSERT INTO refused_receipts (run_id, miner_id, activation_id, direction, created_at) VALUES ($1, $2, $3, $4, $5)', [
      host.runId,
      minerId,
      msg.activationId,
      msg.direction,
      arrived,
    ]);
    throw new ProtocolError('UNKNOWN_ACTIVATION', 'no stage-0 miner sent this microbatch');
  }
  const inserted = await host.db.query(
    `INSERT INTO receipts (run_id, epoch, activation_id, direction, from_miner, to_miner, reporter, bytes, payload_hash, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING RETURNING 1`,
    [host.runId, msg.epoch, msg.activationId, msg.direction, msg.from, msg.to, minerId, msg.bytes, msg.payloadHash, arrived],
  );
  if (inserted.length === 0) throw new ProtocolError('REPLAYED', 'this transfer was already confirmed by this miner');
  if (msg.direction === 'activation') {
    // The other end's receipt, if in: both agreeing is a verified microbatch (the phase machine counts it; one indexed lookup).
    const [other] = await host.db.query<{ bytes: number; payload_hash: string; created_at: Date | string }>(
      `SELECT bytes, payload_hash, created_at FROM receipts WHERE run_id = $1 AND activation_id = $2 AND direction = 'activation' AND from_miner = $3 AND to_miner = $4 AND reporter = $5`,
      [host.runId, msg.activationId, msg.from, msg.to, peer],
    );
    if (other && other.bytes === msg.bytes && other.payload_hash === msg.payloadHash) host.phases.noteVerified(msg.activationId, msg.from, msg.to, other.created_at, arrived);
  }
  if (msg.to === minerId && held.stage !== undefined) host.live.transfer(msg.direction, held.stage, msg.bytes);
  ack({ ok: true });
}

/** The phase machine's merge handshake (phases.ts): ready to merge this round, with its commitments. */
export async function mergeReady({ host, state, arrived }: EventContext, msg: ClientMessage<'merge-ready'>, ack: Ack): Promise<void> {
  const minerId = registered(state);
  await host.phases.onReady(minerId, msg, arrived);
  ack({ ok: true });
}

/** The phase machine's merge handshake (phases.ts): merged, with what it received. */
export async function merged({ host, state, arrived }: EventContext, msg: ClientMessage<'merged'>, ack: Ack): Promise<void> {
  const minerId = registered(state);
  await host.phases.onMerged(minerId, msg, arrived);
  ack({ ok: true });
}

/** One handler per socket event (the relay's binary frames: frame.ts). */
export const HANDLERS: { [E in ClientEvent]: EventHandler<E> } = {
  hello,
  register,
  ice,
  heartbeat,
  signal,
  loss,
  receipt,
  'merge-ready': mergeReady,
  merged,
};
