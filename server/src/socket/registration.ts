import { ProtocolError, parseClientMessage, type ClientEvent } from '@train-at-home/protocol';
import type { Server, Socket } from 'socket.io';
import { arrivalTime } from '../clock';
import { eventArgs, type Ack } from './ack';
import { FrameRefusal, relayFrame } from './frame';
import { HANDLERS, type ConnectionState, type EventHandler, type HandlerHost, type MinerSocketData } from './handlers';
import { SocketRateLimits } from './rate-limits';

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
 * A miner's connection: each socket event goes to its one handler
 * (handlers.ts; the relay's frames to frame.ts) after the rate limits, parsed
 * against its schema first. A refusal answers with a named code and changes
 * nothing; a connection that keeps sending bad messages, or signs wrongly, is
 * disconnected. Every event is stamped when it arrives: receipts and loss
 * reports are stored with that time, so a miner's reports keep the order it
 * sent them in even when one waits (the validator counts a miner's inner steps
 * between two of its receipts: jobs/spot-checks.ts).
 */
export function attachRegistration(io: Server, host: HandlerHost, limits = new SocketRateLimits(), addressOf: (socket: Socket) => string = (socket) => socket.handshake.address): void {
  io.on('connection', (socket: Socket) => {
    const state: ConnectionState = { rejections: 0 };
    const address = addressOf(socket);
    const held = socket.data as MinerSocketData;
    const answer = (event: string, callback: Ack | undefined): Ack => callback ?? ((reply) => socket.emit('reply', { event: event.slice(0, 40), ...reply }));
    /** Over its budget (socket/rate-limits.ts): refused by name with the time to wait; not counted as a bad message. */
    const overBudget = async (event: string, ack: Ack): Promise<boolean> => {
      const refused = await limits.take(event, socket.id, state.minerId, address);
      if (refused === undefined) return false;
      const { waitMs, over } = refused;
      ack({ ok: false, error: { code: 'RATE_LIMITED', message: `too many ${over}; retry in ${waitMs} ms`, retryAfterMs: waitMs } });
      return true;
    };
    /** Answers a refusal, counts it unless timing alone earns it, and disconnects a connection past MAX_REJECTIONS or that signed wrongly. */
    const refuse = (ack: Ack, code: string, message: string): void => {
      ack({ ok: false, error: { code, message } });
      if (!TIMING_REFUSALS.has(code)) state.rejections++;
      if (code === 'BAD_SIGNATURE' || state.rejections > MAX_REJECTIONS) socket.disconnect(true);
    };
    const failed = (e: unknown, event: string): { code: string; message: string } => {
      // The code goes in its own field, the message without it (the miner prints them as `${code}: ${message}`).
      if (e instanceof ProtocolError) return { code: e.code, message: e.detail };
      if (e instanceof FrameRefusal) return { code: e.code, message: e.message };
      host.log.error({ err: e, event }, 'handler failed');
      return { code: 'INTERNAL', message: 'the coordinator could not handle this message' };
    };
    socket.once('disconnect', () => limits.forget(socket.id));

    for (const event of Object.keys(HANDLERS) as ClientEvent[]) {
      const handler = HANDLERS[event] as EventHandler<ClientEvent>;
      socket.on(event, async (...args: unknown[]) => {
        const arrived = arrivalTime();
        const { payloads, callback } = eventArgs(args);
        const ack = answer(event, callback);
        if (await overBudget(event, ack)) return;
        try {
          // A message is one payload: none (parsed as undefined) or several are refused by name, like any other malformed one.
          if (payloads.length > 1) throw new ProtocolError('SCHEMA', `a ${event} message is one payload, not ${payloads.length}`);
          await handler({ host, socket, state, held, arrived }, parseClientMessage(event, payloads[0]), ack);
        } catch (e) {
          const { code, message } = failed(e, event);
          refuse(ack, code, message);
        }
      });
    }

    socket.on('frame', async (...args: unknown[]) => {
      const { payloads, callback } = eventArgs(args);
      const ack = answer('frame', callback);
      if (await overBudget('frame', ack)) return;
      try {
        await relayFrame(host, state.minerId, payloads);
        if (callback) ack({ ok: true }); // frames are many: a sender that asked for no answer gets none when all went well
      } catch (e) {
        const { code, message } = failed(e, 'frame');
        refuse(ack, code, message);
      }
    });

    // Unknown events get the same named rejection as malformed ones.
    socket.onAny(async (event: string, ...args: unknown[]) => {
      if (Object.hasOwn(HANDLERS, event) || event === 'frame') return;
      const ack = answer(String(event), eventArgs(args).callback);
      if (await overBudget(String(event), ack)) return;
      refuse(ack, 'UNKNOWN_EVENT', `unknown event ${String(event).slice(0, 40)}`);
    });

    socket.on('disconnect', async () => {
      const id = state.minerId;
      if (!id || host.sockets.get(id) !== socket) return; // never registered, or a newer connection owns the miner
      host.sockets.delete(id);
      try {
        await host.minerLeft(id, socket.id);
      } catch (e) {
        host.log.error({ err: e }, 'could not record a departure');
      }
    });
  });
}
