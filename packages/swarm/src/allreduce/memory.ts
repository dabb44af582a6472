import { ButterflyNode, type AllReduceRejection } from './butterfly';

/**
 * Peers of an all-reduce in one process, for fault-injection tests and for
 * benchmarks with more peers than processes fit: messages are delivered
 * asynchronously and every byte is counted per peer. A test can kill a peer
 * (nothing to or from it is delivered afterwards) or rewrite what it sends.
 * Miners use the same ButterflyNode over WebRTC (Miner, miner.ts: partition frames over the peer mesh).
 */
export class MemoryNetwork {
  readonly nodes = new Map<string, ButterflyNode>();
  readonly sent = new Map<string, number>();
  readonly received = new Map<string, number>();
  readonly rejections: Array<{ at: string; from: string; code: AllReduceRejection }> = [];
  private readonly dead = new Set<string>();
  /** Sees every message before delivery: return it (possibly rewritten), or null to drop it. */
  intercept?: (from: string, to: string, bytes: Uint8Array) => Uint8Array | null;
  /** Simulated one-way delay per message (ms). */
  latencyMs = 0;

  node(id: string): ButterflyNode {
    let n = this.nodes.get(id);
    if (!n) {
      n = new ButterflyNode(id, (to, bytes) => this.deliver(id, to, bytes), (from, code) => this.rejections.push({ at: id, from, code }));
      this.nodes.set(id, n);
      this.sent.set(id, 0);
      this.received.set(id, 0);
    }
    return n;
  }

  kill(id: string): void {
    this.dead.add(id);
  }

  isDead(id: string): boolean {
    return this.dead.has(id);
  }

  private async deliver(from: string, to: string, bytes: Uint8Array): Promise<void> {
    if (this.dead.has(from)) throw new Error(`${from} is dead`);
    const out = this.intercept ? this.intercept(from, to, bytes) : bytes;
    if (!out || this.dead.has(from)) return;
    this.sent.set(from, this.sent.get(from)! + out.length);
    await new Promise((r) => (this.latencyMs > 0 ? setTimeout(r, this.latencyMs) : setImmediate(r)));
    if (this.dead.has(to)) throw new Error(`${to} is dead`);
    this.received.set(to, this.received.get(to)! + out.length);
    this.nodes.get(to)?.deliver(from, out);
  }
}
