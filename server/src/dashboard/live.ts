import type { ClientMessage, PathSummary, Traffic } from '@train-at-home/protocol';

/** What a miner says it is doing (its heartbeat's status): shown on the dashboard, never paid for. */
export interface MinerReport {
  phase: string;
  why?: string;
  tokensPerSec: number;
  microbatches: number;
  paths?: PathSummary;
  /** Bytes by kind since it started, and the tokens it processed meanwhile. */
  traffic?: Partial<Traffic>;
  trainedTokens?: number;
  /** When it said so (ms since epoch). */
  at: number;
}

/** A miner's report older than this is not shown as its state (it may have stalled). */
export const REPORT_FRESH_MS = 10_000;

/** Seconds of history the rates are taken over. */
export const RATE_WINDOW_S = 10;

/** Counts per whole second over the last RATE_WINDOW_S seconds. */
class RateWindow {
  private readonly buckets = new Map<number, number>();

  add(n: number, nowMs: number): void {
    const s = Math.floor(nowMs / 1000);
    this.buckets.set(s, (this.buckets.get(s) ?? 0) + n);
    for (const k of this.buckets.keys()) if (k <= s - RATE_WINDOW_S) this.buckets.delete(k);
  }

  /** Per second, over the window's complete seconds. */
  perSecond(nowMs: number): number {
    const s = Math.floor(nowMs / 1000);
    let total = 0;
    for (const [k, n] of this.buckets) if (k < s && k >= s - RATE_WINDOW_S) total += n;
    return total / RATE_WINDOW_S;
  }
}

interface Boundary {
  activations: RateWindow;
  gradients: RateWindow;
  bytes: RateWindow;
}

/**
 * The run as it moves, kept in memory for the dashboard: each miner's own
 * report of its state (heartbeats), and the transfers receivers confirmed,
 * per stage boundary (rates) and in total (bytes on the wire against what the
 * same tensors would have cost uncompressed). Lost on a restart; the
 * dashboard's history (losses, merges, settlements) lives in the database.
 */
export class LiveState {
  readonly miners = new Map<string, MinerReport>();
  private readonly boundaries: Boundary[];
  /** Bytes of confirmed transfers (peer to peer or relayed), and what fp32 boundary tensors of the same shape would have been. */
  readonly totals = { transfers: 0, bytes: 0, uncompressedBytes: 0 };

  constructor(
    stages: number,
    /** Bytes of one microbatch's boundary tensor in fp32 (rows × width × 4): what an uncompressed transfer would carry. */
    private readonly uncompressedTransferBytes: number,
  ) {
    this.boundaries = Array.from({ length: Math.max(0, stages - 1) }, () => ({ activations: new RateWindow(), gradients: new RateWindow(), bytes: new RateWindow() }));
  }

  report(minerId: string, status: NonNullable<ClientMessage<'heartbeat'>['status']>, nowMs = Date.now()): void {
    this.miners.set(minerId, { ...status, at: nowMs });
  }

  forget(minerId: string): void {
    this.miners.delete(minerId);
  }

  /** A transfer its receiver confirmed; `receiverStage` is the stage of the miner that got it. */
  transfer(direction: 'activation' | 'gradient', receiverStage: number, bytes: number, nowMs = Date.now()): void {
    // An activation crosses boundary s-1 → s into its receiver; a gradient crosses s → s+1 back into it.
    const b = this.boundaries[direction === 'activation' ? receiverStage - 1 : receiverStage];
    if (!b) return;
    (direction === 'activation' ? b.activations : b.gradients).add(1, nowMs);
    b.bytes.add(bytes, nowMs);
    this.totals.transfers++;
    this.totals.bytes += bytes;
    this.totals.uncompressedBytes += this.uncompressedTransferBytes;
  }

  /** Per boundary: activations and gradients per second, and bytes per second both ways. */
  rates(nowMs = Date.now()): Array<{ from: number; to: number; activationsPerSec: number; gradientsPerSec: number; bytesPerSec: number }> {
    return this.boundaries.map((b, i) => ({
      from: i,
      to: i + 1,
      activationsPerSec: b.activations.perSecond(nowMs),
      gradientsPerSec: b.gradients.perSecond(nowMs),
      bytesPerSec: b.bytes.perSecond(nowMs),
    }));
  }

  /** What the dashboard shows of this process's part: the miners' fresh reports, the rates, the totals (and what its relay carried). */
  summary(relayed: LiveSummary['relayed'], nowMs = Date.now()): LiveSummary {
    return {
      miners: [...this.miners].filter(([, r]) => nowMs - r.at <= REPORT_FRESH_MS),
      rates: this.rates(nowMs),
      totals: { ...this.totals },
      relayed: { ...relayed },
    };
  }
}

/** One process's live figures (LiveState.summary): in scale-out mode each process asks the others for theirs. */
export interface LiveSummary {
  miners: Array<[string, MinerReport]>;
  rates: ReturnType<LiveState['rates']>;
  totals: LiveState['totals'];
  relayed: { frameBytes: number; signalBytes: number };
}

const num = (x: unknown): number => (typeof x === 'number' && Number.isFinite(x) && x >= 0 ? x : 0);

/**
 * The run's live figures from every process's part: each miner's newest report (a miner is connected to one
 * process, or was, a moment ago, to another), the rates and totals summed. A part that is not a summary (another
 * version of the coordinator) counts for nothing.
 */
export function mergeLive(parts: unknown[]): LiveSummary {
  const out: LiveSummary = { miners: [], rates: [], totals: { transfers: 0, bytes: 0, uncompressedBytes: 0 }, relayed: { frameBytes: 0, signalBytes: 0 } };
  const miners = new Map<string, MinerReport>();
  for (const part of parts) {
    const p = part as Partial<LiveSummary> | null;
    if (!p || !Array.isArray(p.miners) || !Array.isArray(p.rates) || typeof p.totals !== 'object' || typeof p.relayed !== 'object') continue;
    for (const entry of p.miners) {
      if (!Array.isArray(entry) || typeof entry[0] !== 'string' || typeof entry[1]?.at !== 'number') continue;
      const [id, r] = entry as [string, MinerReport];
      if ((miners.get(id)?.at ?? -Infinity) < r.at) miners.set(id, r);
    }
    p.rates.forEach((r, i) => {
      const into = (out.rates[i] ??= { from: i, to: i + 1, activationsPerSec: 0, gradientsPerSec: 0, bytesPerSec: 0 });
      into.activationsPerSec += num(r?.activationsPerSec);
      into.gradientsPerSec += num(r?.gradientsPerSec);
      into.bytesPerSec += num(r?.bytesPerSec);
    });
    out.totals.transfers += num(p.totals?.transfers);
    out.totals.bytes += num(p.totals?.bytes);
    out.totals.uncompressedBytes += num(p.totals?.uncompressedBytes);
    out.relayed.frameBytes += num(p.relayed?.frameBytes);
    out.relayed.signalBytes += num(p.relayed?.signalBytes);
  }
  out.miners = [...miners];
  return out;
}
