import type { Redis } from 'ioredis';
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';

/** A budget: at most `max` messages per `perMs`, counted per connection and, once registered, per miner. */
export interface SocketRate {
  max: number;
  perMs: number;
}

/** Kinds of socket message with a budget of their own; `other` is every event the coordinator does not know. */
export type RatedEvent = 'hello' | 'register' | 'heartbeat' | 'signal' | 'receipt' | 'loss' | 'merge-ready' | 'merged' | 'frame' | 'ice' | 'other';
/** Each event's budget, and `register-per-address`: the registrations of every connection from one address together. */
export type SocketRates = Record<RatedEvent, SocketRate> & { 'register-per-address': SocketRate };

/**
 * What an honest miner sends, with room to spare. A stage miner confirms at
 * most four transfers per microbatch (activation in and out, gradient in and
 * out); 400 receipts a second is 100 microbatches a second, far beyond a tab.
 * WebRTC set-up sends bursts of ICE candidates; a relayed message is cut into
 * 256 KiB chunks. A tab registers once per connection and reconnects rarely.
 */
export const DEFAULT_SOCKET_RATES: SocketRates = {
  hello: { max: 30, perMs: 60_000 },
  register: { max: 30, perMs: 60_000 },
  heartbeat: { max: 10, perMs: 1000 },
  signal: { max: 200, perMs: 1000 },
  receipt: { max: 400, perMs: 1000 },
  loss: { max: 200, perMs: 1000 },
  'merge-ready': { max: 20, perMs: 1000 },
  merged: { max: 20, perMs: 1000 },
  frame: { max: 200, perMs: 1000 },
  // A miner asks for fresh TURN credentials before they expire and after a failed connection.
  ice: { max: 20, perMs: 60_000 },
  other: { max: 20, perMs: 1000 },
  // Registrations from one address, over all its connections: a household's or a campus's tabs join far slower
  // than this; a flood of new identities from one host is refused by name before any signature is checked, and
  // everyone else's joins go on (each address has its own budget; behind a trusted balancer, each forwarded client).
  'register-per-address': { max: 120, perMs: 60_000 },
};

/**
 * Rate limits on socket events, per connection and per miner (a miner with
 * several connections shares one budget), kept by rate-limiter-flexible. A
 * message over budget is refused by name (RATE_LIMITED) with the time to wait,
 * before it is parsed, and changes nothing. In scale-out mode the counters are
 * in Redis, shared by every process (`shared`): a miner connected to two
 * processes, or coming back on another, has one budget, not one per process.
 * Should Redis be unreachable, each process counts on its own meanwhile (the
 * limiter's insurance) rather than refuse or let everything through.
 */
export class SocketRateLimits {
  private readonly limiters: Record<RatedEvent | 'register-per-address', RateLimiterMemory | RateLimiterRedis>;

  constructor(rates: Partial<SocketRates> = {}, shared?: { redis: Redis; prefix: string }) {
    const all = { ...DEFAULT_SOCKET_RATES, ...rates };
    this.limiters = Object.fromEntries(
      Object.entries(all).map(([event, r]) => {
        if (!Number.isSafeInteger(r.max) || r.max < 1 || !Number.isSafeInteger(r.perMs) || r.perMs < 1) throw new RangeError(`socket rate for ${event} needs positive integers max and perMs`);
        // rate-limiter-flexible counts in whole seconds of window.
        const budget = { keyPrefix: event, points: r.max, duration: Math.max(1, Math.round(r.perMs / 1000)) };
        const own = new RateLimiterMemory(budget);
        return [event, shared ? new RateLimiterRedis({ ...budget, keyPrefix: `${shared.prefix}${event}`, storeClient: shared.redis, insuranceLimiter: own }) : own];
      }),
    ) as Record<RatedEvent | 'register-per-address', RateLimiterMemory | RateLimiterRedis>;
  }

  static kind(event: string): RatedEvent {
    return Object.hasOwn(DEFAULT_SOCKET_RATES, event) && event !== 'other' && event !== 'register-per-address' ? (event as RatedEvent) : 'other';
  }

  /**
   * Counts one message; undefined when it is within budget, else the milliseconds to wait and what was over it
   * (a registration also counts against its address's budget, every connection from there together).
   */
  async take(event: string, connectionId: string, minerId?: string, address?: string): Promise<{ waitMs: number; over: string } | undefined> {
    const kind = SocketRateLimits.kind(event);
    const limiter = this.limiters[kind];
    let over = `${kind} messages`;
    try {
      await limiter.consume(`c:${connectionId}`);
      if (minerId) await limiter.consume(`m:${minerId}`);
      over = 'registrations from this address';
      if (kind === 'register' && address !== undefined) await this.limiters['register-per-address'].consume(`a:${address}`);
      return undefined;
    } catch (e) {
      if (e instanceof RateLimiterRes) return { waitMs: Math.max(1, e.msBeforeNext), over };
      throw e;
    }
  }

  /** Forgets a closed connection's counter (a miner's stays: it may reconnect at once). */
  forget(connectionId: string): void {
    for (const limiter of Object.values(this.limiters)) void limiter.delete(`c:${connectionId}`);
  }
}
