import type { Queryable } from './db/database';

/** How long a receipt or loss report waits for its microbatch to be announced before it is refused. */
export const ANNOUNCE_WAIT_MS = 10_000;
/**
 * Reports of one miner that may wait for their microbatch's announcement at
 * once. An honest miner's wait is a few milliseconds (the announcement comes
 * on another connection); reports beyond this are refused at once, so a miner
 * naming invented microbatches cannot hold memory or write refusals without bound.
 */
export const MAX_WAITING_REPORTS = 32;
/** With several coordinator processes, how often a report waiting for its microbatch looks for it in the database. */
export const SHARED_LOOKUP_MS = 250;
/** Microbatch ids remembered in memory (older ones are looked up in the database). */
const MAX_REMEMBERED = 200_000;

/**
 * The microbatches the coordinator knows of. A microbatch exists once the
 * stage-0 miner that made it confirms sending it (its receipt is sent before
 * the activation itself); a receipt or loss report for any other id names work
 * that never happened and is refused by name (UNKNOWN_ACTIVATION). Reports
 * that overtake the announcement on another connection wait for it a little.
 */
export class ActivationRegistry {
  /**
   * One of several coordinator processes (scale-out.ts): a microbatch may be announced on another, so a
   * report waiting for it also looks in the database (the announcing receipt is stored there) while it waits.
   */
  shared = false;
  private readonly known = new Map<string, string>();
  private readonly waiters = new Map<string, Array<(known: boolean) => void>>();

  constructor(
    private readonly db: Queryable,
    private readonly runId: number,
  ) {}

  /** A stage-0 miner confirmed sending this microbatch: it exists, made by `minerId`. */
  announce(activationId: string, minerId: string): void {
    if (this.known.has(activationId)) return;
    this.known.set(activationId, minerId);
    if (this.known.size > MAX_REMEMBERED) this.known.delete(this.known.keys().next().value!);
    for (const w of this.waiters.get(activationId) ?? []) w(true);
    this.waiters.delete(activationId);
  }

  /** Reports of each miner now waiting for their microbatch's announcement. */
  private readonly waitingBy = new Map<string, number>();

  /** Whether some report of this miner is waiting for its microbatch's announcement now. */
  waiting(minerId: string): boolean {
    return (this.waitingBy.get(minerId) ?? 0) > 0;
  }

  /** Whether a report of this miner about this microbatch may be taken now: known, or room left to wait for it. */
  mayWait(activationId: string, minerId: string): boolean {
    return this.known.has(activationId) || (this.waitingBy.get(minerId) ?? 0) < MAX_WAITING_REPORTS;
  }

  /** Whether the microbatch exists, waiting up to `waitMs` for its announcement (a report of `reporter`, if named). */
  async exists(activationId: string, waitMs = ANNOUNCE_WAIT_MS, reporter?: string): Promise<boolean> {
    if (this.known.has(activationId)) return true;
    if (reporter === undefined) return this.lookup(activationId, waitMs);
    this.waitingBy.set(reporter, (this.waitingBy.get(reporter) ?? 0) + 1);
    try {
      return await this.lookup(activationId, waitMs);
    } finally {
      const n = (this.waitingBy.get(reporter) ?? 1) - 1;
      if (n > 0) this.waitingBy.set(reporter, n);
      else this.waitingBy.delete(reporter);
    }
  }

  private async lookup(activationId: string, waitMs: number): Promise<boolean> {
    // Announced before a restart of the coordinator: its receipts are stored.
    if (await this.stored(activationId)) return true;
    if (this.known.has(activationId)) return true;
    return new Promise<boolean>((resolve) => {
      const list = this.waiters.get(activationId) ?? [];
      this.waiters.set(activationId, list);
      const done = (known: boolean): void => {
        clearTimeout(timer);
        clearInterval(look);
        resolve(known);
      };
      const give = (known: boolean): void => {
        const rest = (this.waiters.get(activationId) ?? []).filter((w) => w !== done);
        if (rest.length) this.waiters.set(activationId, rest);
        else this.waiters.delete(activationId);
        done(known);
      };
      const timer = setTimeout(() => give(false), waitMs);
      const look = this.shared
        ? setInterval(() => {
            this.stored(activationId).then(
              (found) => found && this.waiters.has(activationId) && give(true),
              () => {},
            );
          }, SHARED_LOOKUP_MS)
        : undefined;
      list.push(done);
    });
  }

  /** Whether the microbatch's announcing receipt is stored (by a coordinator before a restart, or another process); remembered if so. */
  private async stored(activationId: string): Promise<boolean> {
    const [row] = await this.db.query('SELECT 1 FROM receipts WHERE run_id = $1 AND activation_id = $2 LIMIT 1', [this.runId, activationId]);
    if (row) this.known.set(activationId, '');
    return Boolean(row);
  }
}
