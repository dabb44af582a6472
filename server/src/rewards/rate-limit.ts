import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { RateLimited } from '../rate-limited';
import type { RateLimit } from './settings';

type Hook = (req: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply | undefined>;

export interface RouteLimits {
  /** Per client IP, before the body is read (onRequest). */
  onRequest: Hook;
  /**
   * Per wallet address, called by the route once the wallet's signature over
   * the message verified: throws RateLimited over the limit.
   */
  proven(req: FastifyRequest, address: string): Promise<void>;
}

/**
 * The rewards routes' own limits, beside the app's global per-IP one, with
 * counters of their own per route (@fastify/rate-limit keeps them; a route's
 * config takes one key, so each limiter is made with createRateLimit):
 *
 * - per client IP (IPv6 counted per /64), on every rewards route;
 * - per wallet address, only for requests that proved it: a link or claim
 *   whose wallet signature verified. Counting a request by the address it
 *   merely names let anyone lock a wallet out (20 junk claims a minute naming
 *   it, from any IP, made its owner's own requests 429). A challenge proves
 *   nothing, so it is limited per IP only.
 *
 * Call the returned function once per route. Over a limit: 429 RATE_LIMITED,
 * `retryAfterMs`, and a retry-after header in seconds.
 */
export function rewardsRateLimits(app: FastifyInstance, limits: { perIp: RateLimit; perAddress: RateLimit }): () => RouteLimits {
  return () => {
    const perIp = app.createRateLimit({ max: limits.perIp.max, timeWindow: limits.perIp.timeWindowMs });
    // The address a request proved, for the limiter's key generator (which is handed only the request).
    const addresses = new WeakMap<FastifyRequest, string>();
    const perAddress = app.createRateLimit({ max: limits.perAddress.max, timeWindow: limits.perAddress.timeWindowMs, keyGenerator: (req) => addresses.get(req)! });
    return {
      onRequest: async (req, reply) => {
        const r = await perIp(req);
        if (r.isAllowed || !r.isExceeded) return undefined;
        const refused = new RateLimited(r.ttl, 'from this IP address');
        return reply.code(429).header('retry-after', String(r.ttlInSeconds)).send(refused.body);
      },
      proven: async (req, address) => {
        addresses.set(req, address);
        const r = await perAddress(req);
        if (!r.isAllowed && r.isExceeded) throw new RateLimited(r.ttl, 'for this address');
      },
    };
  };
}
