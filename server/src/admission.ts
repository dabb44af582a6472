import type { AdmissionQueued } from '@train-at-home/protocol';

/**
 * Admission to the run: registrations are taken a few at a time (they serialize on the assignment's lock anyway),
 * the rest wait in arrival order and are told so: their position and an estimate, at once and again every
 * `tellEveryMs` while they wait (so the client knows it is still queued, and waits instead of timing out). A place
 * is the miner's, not the connection's: a miner whose connection dropped while it waited and that registers again
 * within `graceMs` takes up its place, never the back of the queue (IOTA's admission queue reset its miners to the
 * back; macrocosm-os/iota #193). One queue per coordinator process: in scale-out mode each process admits its own
 * connections.
 */
export interface AdmissionOptions {
  /** Registrations under way at once (default 2: one in the database, one being checked or answered). */
  concurrent: number;
  /** How often a waiting miner is told its position (ms; default 1 s). */
  tellEveryMs: number;
  /** How long a place is kept for a miner whose connection dropped while it waited (ms; default 30 s). */
  graceMs: number;
}

export const DEFAULT_ADMISSION: AdmissionOptions = { concurrent: 2, tellEveryMs: 1000, graceMs: 30_000 };

/** Where a waiting registration's updates go: its connection, while it has one. */
export interface AdmissionWaiter {
  tell(update: AdmissionQueued): void;
  /** Whether it is still connected (a disconnected one keeps its place for graceMs). */
  readonly connected: boolean;
}

interface Place {
  key: string;
  waiter: AdmissionWaiter;
  admit: () => void;
  refuse: (e: Error) => void;
  /** When it was found disconnected (its place kept for graceMs from then). */
  lostAt?: number;
}

/** A waiting registration whose place a newer connection of the same miner took. */
export class AdmissionSuperseded extends Error {
  override name = 'AdmissionSuperseded';
}

export class AdmissionQueue {
  readonly options: AdmissionOptions;
  private readonly waiting: Place[] = [];
  private running = 0;
  /** Mean time one admitted registration took (ms, exponentially weighted): the estimate's unit. */
  private serviceMs = 50;
  private timer?: ReturnType<typeof setInterval>;
  /** Admitted so far (for operators and benchmarks). */
  admitted = 0;
  /** The most that waited at once since the last takeLongest(). */
  private longest = 0;

  constructor(options: Partial<AdmissionOptions> = {}) {
    this.options = { ...DEFAULT_ADMISSION, ...options };
    if (!(this.options.concurrent >= 1)) throw new RangeError('admission: concurrent must be at least 1');
  }

  /** How many wait now. */
  get queued(): number {
    return this.waiting.length;
  }

  /** The most that waited at once since the last call (bench:load's figure per step). */
  takeLongest(): number {
    const longest = this.longest;
    this.longest = this.waiting.length;
    return longest;
  }

  /** How many registrations are under way now. */
  get underWay(): number {
    return this.running;
  }

  /**
   * Waits for this miner's turn; resolves with the function that ends its registration (call it once, whatever
   * happened). A newer registration of the same key takes over its place: this one then rejects with AdmissionSuperseded.
   */
  async enter(key: string, waiter: AdmissionWaiter): Promise<() => void> {
    const existing = this.waiting.find((p) => p.key === key);
    if (!existing && this.running < this.options.concurrent && this.waiting.length === 0) {
      this.running++;
      return this.release();
    }
    await new Promise<void>((admit, refuse) => {
      let place: Place;
      if (existing) {
        existing.refuse(new AdmissionSuperseded('a newer connection of this miner took its place in the queue'));
        place = Object.assign(existing, { waiter, admit, refuse, lostAt: undefined });
      } else {
        this.waiting.push((place = { key, waiter, admit, refuse }));
        this.longest = Math.max(this.longest, this.waiting.length);
      }
      this.tellOne(place, this.waiting.indexOf(place) + 1);
      // A miner taking its place up again may find room (nothing under way since its connection dropped).
      this.next();
      if (!this.timer) (this.timer = setInterval(() => this.tell(), this.options.tellEveryMs)).unref?.();
    });
    return this.release(); // counted as running when it was admitted (next)
  }

  /** Stops telling (the coordinator is closing); those still waiting are refused. */
  close(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    for (const p of this.waiting.splice(0)) p.refuse(new AdmissionSuperseded('the coordinator is stopping'));
  }

  private release(): () => void {
    const began = performance.now();
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.running--;
      this.admitted++;
      this.serviceMs = 0.8 * this.serviceMs + 0.2 * (performance.now() - began);
      this.next();
    };
  }

  /**
   * Admits from the front while there is room. A place whose connection dropped keeps its place (graceMs) for the
   * miner to come back to; the first connected one behind it is admitted meanwhile.
   */
  private next(): void {
    this.sweep();
    while (this.running < this.options.concurrent) {
      const i = this.waiting.findIndex((p) => p.waiter.connected);
      if (i < 0) break;
      const [place] = this.waiting.splice(i, 1);
      this.running++;
      // On the next turn of the event loop, not as a microtask of the last one's end: on PGlite a registration can
      // run start to end in microtasks, and a queue drained that way starved every timer and socket (heartbeats, the
      // queue's own updates) for the whole burst.
      setImmediate(() => place!.admit());
    }
  }

  /** Places whose miner did not come back within graceMs are given up. */
  private sweep(): void {
    const now = Date.now();
    for (let i = this.waiting.length - 1; i >= 0; i--) {
      const p = this.waiting[i]!;
      if (p.waiter.connected) p.lostAt = undefined;
      else if ((p.lostAt ??= now) + this.options.graceMs < now) {
        this.waiting.splice(i, 1);
        p.refuse(new AdmissionSuperseded('its connection closed while it waited'));
      }
    }
  }

  /** Tells each waiting miner its position and an estimate (every tick, so a client waiting knows it still waits). */
  private tell(): void {
    this.sweep();
    if (this.waiting.length === 0) {
      clearInterval(this.timer);
      this.timer = undefined;
      return;
    }
    this.waiting.forEach((p, i) => this.tellOne(p, i + 1));
  }

  private tellOne(place: Place, position: number): void {
    if (!place.waiter.connected) return;
    place.waiter.tell({ position, estimateMs: Math.round(((position + this.running) * this.serviceMs) / this.options.concurrent) });
  }
}
