import { FrameError, PROTOCOL_VERSION, decodeChunk } from '@train-at-home/protocol';
import type { HandlerHost } from './handlers';

/** A relay frame refused by name (its code is the answer's). */
export class FrameRefusal extends Error {
  constructor(
    readonly code: 'NOT_REGISTERED' | 'SCHEMA' | 'RELAY_OFF' | 'UNKNOWN_PEER' | 'RELAY_CAP',
    message: string,
  ) {
    super(message);
  }
}

/**
 * Relay fallback: a chunk for a peer this miner cannot reach directly. Only
 * registered miners may use it, only well-formed chunks are carried (checked
 * by hand, not by schema: a chunk is bytes, the one message of this shape),
 * every byte is counted and each miner's bytes are capped per minute.
 * Throws a FrameRefusal; changes nothing then.
 */
export async function relayFrame(host: HandlerHost, minerId: string | undefined, payloads: unknown[]): Promise<void> {
  if (!minerId) throw new FrameRefusal('NOT_REGISTERED', 'register first');
  const m = payloads[0] as { v?: unknown; to?: unknown; chunk?: unknown };
  if (payloads.length !== 1 || typeof m !== 'object' || m === null || m.v !== PROTOCOL_VERSION || typeof m.to !== 'string' || !(m.chunk instanceof Uint8Array)) {
    throw new FrameRefusal('SCHEMA', 'a frame is { v, to, chunk: bytes }');
  }
  try {
    decodeChunk(m.chunk);
  } catch (e) {
    throw new FrameRefusal('SCHEMA', e instanceof FrameError ? e.message : 'not a frame');
  }
  if (!host.network.relay.enabled) throw new FrameRefusal('RELAY_OFF', 'this run carries no frames through the coordinator: peers connect directly or through TURN');
  if (m.to === minerId || !(await host.canReach(m.to))) throw new FrameRefusal('UNKNOWN_PEER', 'no registered miner with that id is connected');
  const waitMs = host.relayBudget.take(minerId, m.chunk.length);
  if (waitMs !== undefined) throw new FrameRefusal('RELAY_CAP', `over this run's relay cap of ${host.network.relay.bytesPerMinute} bytes per miner per minute; retry in ${waitMs} ms`);
  host.relayed.frameBytes += m.chunk.length;
  host.sendToMiner(m.to, 'frame', { from: minerId, chunk: m.chunk });
}
