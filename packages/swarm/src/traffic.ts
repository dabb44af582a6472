import { MAX_CHUNK_BYTES, emptyTraffic, framedBytes, trafficSince, type FrameKind, type Traffic, type TrafficKind } from '@train-at-home/protocol';
import type { Socket } from 'socket.io-client';
import type { Mesh } from './mesh';

const FRAME_TRAFFIC: Record<FrameKind, TrafficKind> = { activation: 'activation', gradient: 'gradient', partition: 'merge' };

/** One miner's byte counters, since the Miner object was made (across stages and reconnections). */
export class TrafficMeter {
  private readonly counts = emptyTraffic();

  add(kind: TrafficKind, direction: 'sent' | 'received', bytes: number): void {
    if (Number.isFinite(bytes) && bytes > 0) this.counts[kind][direction] += bytes;
  }

  /** A peer message of this frame kind, its payload `payloadBytes` long, as the frames that carry it. */
  frame(kind: FrameKind, direction: 'sent' | 'received', payloadBytes: number, pathwayLength: number): void {
    this.add(FRAME_TRAFFIC[kind], direction, framedBytes(payloadBytes, pathwayLength, MAX_CHUNK_BYTES));
  }

  /** A copy of the counters now. */
  read(): Traffic {
    return trafficSince(this.counts, emptyTraffic());
  }

  /**
   * Counts what a socket.io connection carries, as its engine's packets, on this connection and every one it
   * reconnects with. Binary packets are left out: the only ones are relayed peer frames, which the mesh counts by kind.
   */
  countSocket(socket: Socket): void {
    const size = (data: unknown): number => (typeof data === 'string' ? data.length : 0);
    const attach = (): void => {
      const engine = socket.io.engine as unknown as { on(event: string, fn: (p: { data?: unknown }) => void): void; __counted?: boolean } | undefined;
      if (!engine || engine.__counted) return;
      engine.__counted = true;
      engine.on('packetCreate', (p) => this.add('coordinator', 'sent', size(p.data) + 1));
      engine.on('packet', (p) => this.add('coordinator', 'received', size(p.data) + 1));
    };
    attach();
    socket.io.on('open', attach);
  }
}

/** Counts a mesh's messages into `meter` by kind: each one its send delivered, and each one it reassembled. */
export function countMesh(mesh: Mesh, meter: TrafficMeter): void {
  const send = mesh.send.bind(mesh);
  mesh.send = async (peerId, header, payload) => {
    const sent = await send(peerId, header, payload);
    meter.frame(header.kind, 'sent', payload.length, header.pathway.length);
    return sent;
  };
  mesh.onMessage((_from, message) => meter.frame(message.kind, 'received', message.payload.length, message.pathway.length));
}
