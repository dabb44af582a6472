import type { Database } from './db/database';

/** How often heartbeats' times are written to the database (miners.last_seen_at), in one statement. */
export const LIVENESS_FLUSH_MS = 5000;
/** How often miners send a heartbeat unless the operator says otherwise (operator-settings.ts: --heartbeat-ms). */
export const DEFAULT_HEARTBEAT_MS = 2000;
/** A miner is dropped after this many heartbeat intervals of silence (at least 15 s). */
export const SILENT_HEARTBEATS = 7.5;
export const MIN_SILENT_MS = 15_000;

/**
 * When each registered miner was last heard from. A heartbeat (every 2 s per
 * miner) touches memory only; the times reach `miners.last_seen_at` in one
 * batched UPDATE every LIVENESS_FLUSH_MS and when the coordinator stops, for
 * what reads them there (a restart's outage). The silent sweep reads memory.
 */
export class Liveness {
  private readonly seenAt = new Map<string, number>();
  /** Miners heard from since the last flush. */
  private readonly dirty = new Set<string>();

  constructor(
    private readonly db: Database,
    private readonly now: () => number = Date.now,
  ) {}

  /** A miner registered or sent a heartbeat. */
  seen(id: string): void {
    this.seenAt.set(id, this.now());
    this.dirty.add(id);
  }

  /** A miner left, was dropped or flagged: no longer watched. */
  forget(id: string): void {
    this.seenAt.delete(id);
    this.dirty.delete(id);
  }

  /** Miners not heard from for `silentMs`. */
  silent(silentMs: number): string[] {
    const cutoff = this.now() - silentMs;
    const out: string[] = [];
    for (const [id, at] of this.seenAt) if (at < cutoff) out.push(id);
    return out;
  }

  /** Writes the times heard since the last flush, in one statement. */
  async flush(): Promise<void> {
    if (this.dirty.size === 0) return;
    const ids = [...this.dirty];
    this.dirty.clear();
    const at = ids.map((id) => new Date(this.seenAt.get(id) ?? this.now()).toISOString());
    await this.db.query(
      `UPDATE miners m SET last_seen_at = s.at FROM unnest($1::text[], $2::timestamptz[]) AS s(id, at) WHERE m.id = s.id AND m.last_seen_at < s.at`,
      [ids, at],
    );
  }
}
