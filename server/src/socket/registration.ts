import { FrameError, PROTOCOL_VERSION, ProtocolError, decodeChunk, newChallenge, parseClientMessage, verifySignature, type ClientEvent } from '@train-at-home/protocol';
import { UNSUITABLE_BACKENDS } from '@train-at-home/model';
import { encodeAddress } from '@polkadot/util-crypto';
import type { Server, Socket } from 'socket.io';
import { stageForNewcomer, type StageLoad } from '../assignment';
import { ANNOUNCE_WAIT_MS } from '../activations';
import { arrivalTime } from '../clock';
import type { Coordinator } from '../coordinator';
import { eventArgs, type Ack } from './ack';
import { SocketRateLimits } from './rate-limits';
import { iceFor } from '../network';
import { stageRoom } from '../stage-map';

/** How long a registration challenge stays valid; a miner that answers later asks again. */
export const CHALLENGE_TTL_MS = 60_000;
/** The first key of the advisory lock that serializes stage assignment within a run (the second is the run's id). */
export const ASSIGNMENT_LOCK = 0x7a4;
/** Rejected messages a connection may send before it is disconnected. */
export const MAX_REJECTIONS = 5;
/**
 * Refusals an honest miner earns from timing alone, which never count toward
 * MAX_REJECTIONS: a report that arrived after its round closed, a second copy,
 * a receipt naming a peer that just left or a microbatch not yet announced.
 * (They are bounded by the rate limits instead.) Counted, an honest miner was
 * disconnected after five of them in a long run, and its reconnection ended
 * the merge it was in, so it trained in the middle of an all-reduce.
 */
const TIMING_REFUSALS = new Set(['OUT_OF_PHASE', 'REPLAYED', 'UNKNOWN_PEER', 'UNKNOWN_ACTIVATION', 'RATE_LIMITED', 'RELAY_CAP']);

/**
 * What a connection keeps in `socket.data`: the stage of its registered miner,
 * set where the stage is assigned (registration, Coordinator.rebalanceStages), so the
 * events a miner sends most (receipts, losses) need no query to learn it.
 */
export interface MinerSocketData {
  stage?: number;
}

interface SocketState {
  lastSignalSeq?: number;
  publicKey?: string;
  challenge?: { value: string; expiresAt: number };
  minerId?: string;
  rejections: number;
}

/**
 * The registration handshake, then the events of a registered miner. Every
 * message is parsed against its schema first; a rejection answers with a named
 * code and changes nothing. A connection that keeps sending bad messages, or
 * signs wrongly, is disconnected.
 */
export function attachRegistration(io: Server, coordinator: Coordinator, limits = new SocketRateLimits()): void {
  io.on('connection', (socket: Socket) => {
    const state: SocketState = { rejections: 0 };
    const held = socket.data as MinerSocketData;
    /** Over its budget (socket/rate-limits.ts): refused by name with the time to wait; not counted as a bad message. */
    const overBudget = async (event: string, ack: Ack): Promise<boolean> => {
      const waitMs = await limits.take(event, socket.id, state.minerId);
      if (waitMs === undefined) return false;
      ack({ ok: false, error: { code: 'RATE_LIMITED', message: `too many ${SocketRateLimits.kind(event)} messages; retry in ${waitMs} ms`, retryAfterMs: waitMs } });
      return true;
    };
    socket.once('disconnect', () => limits.forget(socket.id));
    // Every event is stamped when it arrives: receipts and loss reports are stored with that time, so
    // a miner's reports keep the order it sent them in even when one waits (the validator counts a
    // miner's inner steps between two of its receipts: validator/spot-checks.ts).
    const handle = <E extends ClientEvent>(event: E, fn: (msg: ReturnType<typeof parseClientMessage<E>>, ack: Ack, arrived: string) => Promise<void>): void => {
      socket.on(event as string, (...args: unknown[]) => void run(eventArgs(args), arrivalTime()));
      const run = async ({ payloads, callback }: ReturnType<typeof eventArgs>, arrived: string): Promise<void> => {
        const ack: Ack = callback ?? ((reply) => socket.emit('reply', { event, ...reply }));
        if (await overBudget(event, ack)) return;
        try {
          // A message is one payload: none (parsed as undefined) or several are refused by name, like any other malformed one.
          if (payloads.length > 1) throw new ProtocolError('SCHEMA', `a ${event} message is one payload, not ${payloads.length}`);
          await fn(parseClientMessage<E>(event, payloads[0]), ack, arrived);
        } catch (e) {
          const error = e instanceof ProtocolError ? { code: e.code, message: e.message } : { code: 'INTERNAL', message: 'the coordinator could not handle this message' };
          if (!(e instanceof ProtocolError)) coordinator.log.error({ err: e, event }, 'handler failed');
          ack({ ok: false, error });
          if (!TIMING_REFUSALS.has(error.code)) state.rejections++;
          if (error.code === 'BAD_SIGNATURE' || state.rejections > MAX_REJECTIONS) socket.disconnect(true);
        }
      };
    };
    // Unknown events get the same named rejection as malformed ones.
    const handled = new Set(['hello', 'register', 'heartbeat', 'signal', 'loss', 'receipt', 'frame', 'merge-ready', 'merged', 'ice']);
    socket.onAny(async (event: string, ...args: unknown[]) => {
      if (handled.has(event)) return;
      const ack: Ack = eventArgs(args).callback ?? ((reply) => socket.emit('reply', { event: String(event).slice(0, 40), ...reply }));
      if (await overBudget(String(event), ack)) return;
      ack({ ok: false, error: { code: 'UNKNOWN_EVENT', message: `unknown event ${String(event).slice(0, 40)}` } });
      if (++state.rejections > MAX_REJECTIONS) socket.disconnect(true);
    });

    handle('hello', async (msg, ack) => {
      state.publicKey = msg.publicKey;
      state.challenge = { value: newChallenge(), expiresAt: Date.now() + CHALLENGE_TTL_MS };
      ack({ ok: true, challenge: state.challenge.value, run: coordinator.run.name });
    });

    handle('register', async (msg, ack) => {
      if (state.minerId) throw new ProtocolError('OUT_OF_PHASE', 'this connection is already registered');
      if (!state.challenge || state.publicKey !== msg.publicKey) throw new ProtocolError('OUT_OF_PHASE', 'say hello with this key first');
      if (state.challenge.value !== msg.challenge || Date.now() > state.challenge.expiresAt) {
        throw new ProtocolError('OUT_OF_PHASE', 'challenge unknown or expired; say hello again');
      }
      const { signature, v: _v, ...signed } = msg;
      if (!verifySignature('register', signed, signature, msg.publicKey)) throw new ProtocolError('BAD_SIGNATURE', 'signature does not verify');
      state.challenge = undefined; // one use
      const { preset } = coordinator.run;
      if (UNSUITABLE_BACKENDS[preset]?.includes(msg.backend)) {
        throw new ProtocolError('UNSUITABLE_BACKEND', `this run trains the ${preset} preset, which does not run on ${msg.backend}: join it from a device with WebGPU`);
      }
      const minerId = msg.publicKey.slice(2).toLowerCase();
      const stage = await coordinator.db.transaction(async (tx) => {
        // One assignment at a time per run: concurrent registrations on a PostgreSQL server each read the
        // same counts and crowded one stage (PGlite runs one transaction at a time anyway).
        await tx.query('SELECT pg_advisory_xact_lock($1, $2)', [ASSIGNMENT_LOCK, coordinator.runId]);
        // A returning miner (after a reconnection, its own restart or the coordinator's) goes back to the stage it
        // held, where its weights, its peers and its audited rounds are. Moved to the least-staffed stage instead,
        // miners coming back one by one after a restart were shuffled across stages, and a cheater reconnecting
        // under load landed on a stage where its cheat could not act. A stage left empty is refilled by
        // Coordinator.rebalanceStages, as after any departure.
        const [previous] = await tx.query<{ stage: number; status: string }>('SELECT stage, status FROM miners WHERE id = $1 AND run_id = $2', [minerId, coordinator.runId]);
        if (previous?.status === 'flagged') throw new ProtocolError('FLAGGED', 'the validator flagged this miner; see /api/miners/<id>/score for why');
        const assigned =
          previous && previous.stage < coordinator.run.stages
            ? previous.stage
            : stageForNewcomer(
                coordinator.run.stages,
                await tx.query<StageLoad>(
                  `SELECT stage, count(*)::int AS miners, coalesce(sum(tokens_per_sec::float8), 0) AS "tokensPerSec"
                   FROM miners WHERE run_id = $1 AND status = 'active' AND id <> $2 GROUP BY stage`,
                  [coordinator.runId, minerId],
                ),
              );
        await tx.query(
          `INSERT INTO miners (id, run_id, public_key, address, backend, tokens_per_sec, stage, status, connection)
           VALUES ($1, $2, $3, $4, $5, $6, $7, 'active', $8)
           ON CONFLICT (id) DO UPDATE SET run_id = $2, backend = $5, tokens_per_sec = $6, stage = $7, status = 'active', last_seen_at = now(), connection = $8,
             stage_since = CASE WHEN miners.stage = $7 THEN miners.stage_since ELSE now() END`,
          [minerId, coordinator.runId, msg.publicKey, encodeAddress(msg.publicKey, 42), msg.backend, msg.tokensPerSec, assigned, socket.id],
        );
        return assigned;
      });
      if (socket.disconnected) {
        // It closed while the registration was being stored: its departure found no miner then, so record it now
        // (unless a newer connection of the same miner already owns it).
        if (!coordinator.sockets.has(minerId)) await coordinator.minerLeft(minerId, socket.id);
        return;
      }
      state.minerId = minerId;
      held.stage = stage;
      coordinator.noteMiner(minerId);
      coordinator.liveness.seen(minerId);
      // The latest registration owns the miner: an older connection of it is closed, and its close changes nothing.
      const older = coordinator.sockets.get(minerId);
      coordinator.sockets.set(minerId, socket);
      if (older && older !== socket) older.disconnect(true);
      // Joined, answered and sent the stages it talks to in one go: every delta after this snapshot reaches it.
      socket.join(stageRoom(stage));
      ack({ ok: true, minerId, stage, runId: coordinator.runId, layout: coordinator.run, rounds: coordinator.phases.status().map((s) => s.round), ice: iceFor(coordinator.network, minerId), heartbeatMs: coordinator.heartbeatMs });
      socket.emit('stages', coordinator.stageFeed.snapshot(stage));
      await coordinator.publishStageMap();
    });

    // Fresh TURN credentials: a miner asks before its own expire, and when a connection through TURN failed.
    handle('ice', async (_msg, ack) => {
      if (!state.minerId) throw new ProtocolError('NOT_REGISTERED', 'register first');
      ack({ ok: true, ice: iceFor(coordinator.network, state.minerId) });
    });

    handle('heartbeat', async (msg, ack) => {
      if (!state.minerId) throw new ProtocolError('NOT_REGISTERED', 'register first');
      coordinator.liveness.seen(state.minerId); // memory only: written in batches (liveness.ts)
      if (msg.status) coordinator.live.report(state.minerId, msg.status);
      ack({ ok: true });
    });

    // WebRTC signaling relay, between registered miners only. The sender signs
    // { to, kind, payload, seq }; the relay checks it, refuses replays, and
    // forwards it with the sender's id (its public key) for the receiver to check again.
    handle('signal', async (msg, ack) => {
      if (!state.minerId) throw new ProtocolError('NOT_REGISTERED', 'register first');
      const { signature, v: _v, ...signed } = msg;
      if (!verifySignature('signal', signed, signature, `0x${state.minerId}`)) throw new ProtocolError('BAD_SIGNATURE', 'signal signature does not verify');
      if (state.lastSignalSeq !== undefined && msg.seq <= state.lastSignalSeq) throw new ProtocolError('REPLAYED', `seq ${msg.seq} after ${state.lastSignalSeq}`);
      if (msg.to === state.minerId || !(await coordinator.canReach(msg.to))) throw new ProtocolError('UNKNOWN_PEER', 'no registered miner with that id is connected');
      state.lastSignalSeq = msg.seq;
      coordinator.relayed.signalBytes += msg.payload.length;
      coordinator.sendToMiner(msg.to, 'signal', { from: state.minerId, ...signed, signature });
      ack({ ok: true });
    });

    // The last stage's loss for one microbatch. Recorded as a training metric; the
    // validator, not this report, decides what a miner earns.
    handle('loss', async (msg, ack, arrived) => {
      if (!state.minerId) throw new ProtocolError('NOT_REGISTERED', 'register first');
      if (held.stage !== coordinator.run.stages - 1) throw new ProtocolError('OUT_OF_PHASE', 'only the last stage reports losses');
      if (msg.pathway.length !== coordinator.run.stages || msg.pathway[msg.pathway.length - 1] !== state.minerId) {
        throw new ProtocolError('SCHEMA', 'the pathway must name one miner per stage, ending with the reporter');
      }
      for (const id of msg.pathway) if (!(await coordinator.isMinerOfRun(id))) throw new ProtocolError('UNKNOWN_PEER', `the pathway names ${id.slice(0, 16)}…, no miner of this run`);
      if (!coordinator.activations.mayWait(msg.activationId, state.minerId)) throw new ProtocolError('RATE_LIMITED', 'too many of this miner\'s reports are waiting for their microbatch');
      if (!(await coordinator.activations.exists(msg.activationId, ANNOUNCE_WAIT_MS, state.minerId))) throw new ProtocolError('UNKNOWN_ACTIVATION', 'no stage-0 miner sent this microbatch');
      // The last stage's merge round when the loss arrived: CLASP compares pathways within a round.
      const round = coordinator.phases.status()[coordinator.run.stages - 1]!.round;
      const inserted = await coordinator.db.query(
        `INSERT INTO metrics (run_id, epoch, name, value, activation_id, pathway, round, created_at) VALUES ($1, $2, 'train_loss', $3, $4, $5, $6, $7)
         ON CONFLICT (run_id, name, activation_id) WHERE activation_id IS NOT NULL DO NOTHING RETURNING 1`,
        [coordinator.runId, msg.epoch, msg.loss, msg.activationId, JSON.stringify(msg.pathway), round, arrived],
      );
      if (inserted.length === 0) throw new ProtocolError('REPLAYED', 'this microbatch was already reported');
      coordinator.emitLoss(msg.loss);
      ack({ ok: true });
    });

    // One end's confirmation of a transfer. Work counts when both ends confirm the
    // same bytes and hash (see Coordinator.receiptSummary); a miner only speaks for itself.
    handle('receipt', async (msg, ack, arrived) => {
      if (!state.minerId) throw new ProtocolError('NOT_REGISTERED', 'register first');
      if (msg.from !== state.minerId && msg.to !== state.minerId) throw new ProtocolError('SCHEMA', 'a receipt must name its reporter as sender or receiver');
      if (msg.from === msg.to) throw new ProtocolError('SCHEMA', 'a transfer has two ends');
      const peer = msg.from === state.minerId ? msg.to : msg.from;
      if (!(await coordinator.isMinerOfRun(peer))) throw new ProtocolError('UNKNOWN_PEER', 'the other end of this transfer is no miner of this run');
      // A stage-0 miner confirming that it sends an activation announces a new microbatch; every
      // other receipt must name one that exists.
      if (held.stage === 0 && msg.direction === 'activation' && msg.from === state.minerId) coordinator.activations.announce(msg.activationId, state.minerId);
      else if (!coordinator.activations.mayWait(msg.activationId, state.minerId)) throw new ProtocolError('RATE_LIMITED', 'too many of this miner\'s receipts are waiting for their microbatch');
      else if (!(await coordinator.activations.exists(msg.activationId, ANNOUNCE_WAIT_MS, state.minerId))) {
        coordinator.flags.noteForgery(state.minerId, msg);
        await coordinator.db.query('INSERT INTO refused_receipts (run_id, miner_id, activation_id, direction, created_at) VALUES ($1, $2, $3, $4, $5)', [
          coordinator.runId,
          state.minerId,
          msg.activationId,
          msg.direction,
          arrived,
        ]);
        throw new ProtocolError('UNKNOWN_ACTIVATION', 'no stage-0 miner sent this microbatch');
      }
      const inserted = await coordinator.db.query(
        `INSERT INTO receipts (run_id, epoch, activation_id, direction, from_miner, to_miner, reporter, bytes, payload_hash, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING RETURNING 1`,
        [coordinator.runId, msg.epoch, msg.activationId, msg.direction, msg.from, msg.to, state.minerId, msg.bytes, msg.payloadHash, arrived],
      );
      if (inserted.length === 0) throw new ProtocolError('REPLAYED', 'this transfer was already confirmed by this miner');
      if (msg.direction === 'activation') {
        // The other end's receipt, if in: both agreeing is a verified microbatch (the phase machine counts it; one indexed lookup).
        const [other] = await coordinator.db.query<{ bytes: number; payload_hash: string; created_at: Date | string }>(
          `SELECT bytes, payload_hash, created_at FROM receipts WHERE run_id = $1 AND activation_id = $2 AND direction = 'activation' AND from_miner = $3 AND to_miner = $4 AND reporter = $5`,
          [coordinator.runId, msg.activationId, msg.from, msg.to, peer],
        );
        if (other && other.bytes === msg.bytes && other.payload_hash === msg.payloadHash) coordinator.phases.noteVerified(msg.activationId, msg.from, msg.to, other.created_at, arrived);
      }
      if (msg.to === state.minerId && held.stage !== undefined) coordinator.live.transfer(msg.direction, held.stage, msg.bytes);
      ack({ ok: true });
    });

    // The phase machine's merge handshake (see phases.ts).
    handle('merge-ready', async (msg, ack, arrived) => {
      if (!state.minerId) throw new ProtocolError('NOT_REGISTERED', 'register first');
      await coordinator.phases.onReady(state.minerId, msg, arrived);
      ack({ ok: true });
    });
    handle('merged', async (msg, ack, arrived) => {
      if (!state.minerId) throw new ProtocolError('NOT_REGISTERED', 'register first');
      await coordinator.phases.onMerged(state.minerId, msg, arrived);
      ack({ ok: true });
    });

    // Relay fallback: a chunk for a peer this miner cannot reach directly. Only
    // registered miners may use it, only well-formed chunks are carried, and
    // every byte is counted.
    socket.on('frame', async (...args: unknown[]) => {
      const { payloads, callback } = eventArgs(args);
      const ack: Ack = callback ?? ((reply) => socket.emit('reply', { event: 'frame', ...reply }));
      if (await overBudget('frame', ack)) return;
      const refuse = (code: string, message: string): void => {
        ack({ ok: false, error: { code, message } });
        if (!TIMING_REFUSALS.has(code) && ++state.rejections > MAX_REJECTIONS) socket.disconnect(true);
      };
      if (!state.minerId) return refuse('NOT_REGISTERED', 'register first');
      const m = payloads[0] as { v?: unknown; to?: unknown; chunk?: unknown };
      if (payloads.length !== 1 || typeof m !== 'object' || m === null || m.v !== PROTOCOL_VERSION || typeof m.to !== 'string' || !(m.chunk instanceof Uint8Array)) {
        return refuse('SCHEMA', 'a frame is { v, to, chunk: bytes }');
      }
      try {
        decodeChunk(m.chunk);
      } catch (e) {
        return refuse('SCHEMA', e instanceof FrameError ? e.message : 'not a frame');
      }
      if (!coordinator.network.relay.enabled) return refuse('RELAY_OFF', 'this run carries no frames through the coordinator: peers connect directly or through TURN');
      if (m.to === state.minerId || !(await coordinator.canReach(m.to))) return refuse('UNKNOWN_PEER', 'no registered miner with that id is connected');
      const waitMs = coordinator.relayBudget.take(state.minerId, m.chunk.length);
      if (waitMs !== undefined) return refuse('RELAY_CAP', `over this run's relay cap of ${coordinator.network.relay.bytesPerMinute} bytes per miner per minute; retry in ${waitMs} ms`);
      coordinator.relayed.frameBytes += m.chunk.length;
      coordinator.sendToMiner(m.to, 'frame', { from: state.minerId, chunk: m.chunk });
      if (callback) ack({ ok: true });
    });

    socket.on('disconnect', async () => {
      const id = state.minerId;
      if (!id || coordinator.sockets.get(id) !== socket) return; // never registered, or a newer connection owns the miner
      coordinator.sockets.delete(id);
      try {
        await coordinator.minerLeft(id, socket.id);
      } catch (e) {
        coordinator.log.error({ err: e }, 'could not record a departure');
      }
    });
  });
}
