import { canonicalAddress } from '@train-at-home/protocol';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { RateLimit } from './settings';

type Limiter = ReturnType<FastifyInstance['createRateLimit']>;
type Hook = (req: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply | undefined>;

const ADDRESS_LINE = /(?:^|\n)address: ([1-9A-HJ-NP-Za-km-z]{40,60})(?:\n|$)/;

/**
 * The wallet address a rewards request is about: `address` in a challenge's
 * body, or the `address:` line of a signed message. Null when there is none
 * (the request is then limited per IP only, and refused further on).
 */
export function requestAddress(body: unknown): string | null {
  const b = (body ?? {}) as { address?: unknown; message?: unknown };
  const raw = typeof b.address === 'string' ? b.address : typeof b.message === 'string' ? ADDRESS_LINE.exec(b.message)?.[1] : undefined;
  try {
    return raw === undefined ? null : canonicalAddress(raw);
  } catch {
    return null;
  }
}

/**
 * Two limits on each route, with counters of their own: per client IP
 * (onRequest, before the body is read: IPv6 counted per /64) and per wallet
 * address (preHandler, once the body is parsed and valid), beside the app's
 * global per-IP limit. @fastify/rate-limit keeps the counters; a route's own config takes one key, so each limiter is
 * made with createRateLimit. Call the returned function once per route. Over a limit: 429 RATE_LIMITED, `retryAfterMs`,
 * and a retry-after header in seconds.
 */
export function rewardsRateLimits(app: FastifyInstance, limits: { perIp: RateLimit; perAddress: RateLimit }): () => { onRequest: Hook; preHandler: Hook } {
  // @fastify/rate-limit is registered once, by the app (its global per-IP limit); these are extra.
  return () => {
    const perIp = app.createRateLimit({ max: limits.perIp.max, timeWindow: limits.perIp.timeWindowMs });
    const perAddress = app.createRateLimit({ max: limits.perAddress.max, timeWindow: limits.perAddress.timeWindowMs, keyGenerator: (req) => requestAddress(req.body) ?? '' });
    return {
      onRequest: (req, reply) => enforce(perIp, req, reply, 'this IP'),
      preHandler: async (req, reply) => (requestAddress(req.body) === null ? undefined : enforce(perAddress, req, reply, 'this address')),
    };
  };
}

async function enforce(limiter: Limiter, req: FastifyRequest, reply: FastifyReply, who: string): Promise<FastifyReply | undefined> {
  const r = await limiter(req);
  if (r.isAllowed || !r.isExceeded) return undefined;
  return reply
    .code(429)
    .header('retry-after', String(r.ttlInSeconds))
    .send({ error: 'RATE_LIMITED', message: `too many requests from ${who}; retry in ${r.ttlInSeconds} s`, retryAfterMs: r.ttl });
}
