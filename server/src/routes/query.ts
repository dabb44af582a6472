import type { FastifyInstance } from 'fastify';

/**
 * Query parameters of the read-only REST routes, checked before anything is
 * looked up: a malformed or out-of-range one is a 400 BAD_REQUEST naming it.
 * Every list is paged: `limit` (1…max) and a cursor the response names.
 */
export class BadRequest extends Error {}

export type Query = Record<string, unknown>;

/** An optional non-negative integer parameter: decimal digits only (no sign, exponent or leading zeros). */
export function integer(q: Query, name: string, max: number): number | null {
  const raw = q[name];
  if (raw === undefined) return null;
  if (typeof raw !== 'string' || !/^(?:0|[1-9][0-9]{0,9})$/.test(raw) || Number(raw) > max) throw new BadRequest(`${name} must be an integer in 0…${max}`);
  return Number(raw);
}

/** The page size: `limit`, 1…max, `fallback` when absent. */
export function limit(q: Query, fallback: number, max: number): number {
  const n = integer(q, 'limit', max) ?? fallback;
  if (n < 1) throw new BadRequest(`limit must be an integer in 1…${max}`);
  return n;
}

export function matching(raw: unknown, pattern: RegExp, what: string): string {
  if (typeof raw !== 'string' || !pattern.test(raw)) throw new BadRequest(`${what} is malformed`);
  return raw;
}

export function optionalMatching(q: Query, name: string, pattern: RegExp): string | null {
  return q[name] === undefined ? null : matching(q[name], pattern, name);
}

/** Rows fetched one past the page: the extra one says whether there is a next page. */
export function page<T>(rows: T[], n: number): { rows: T[]; more: boolean } {
  return { rows: rows.slice(0, n), more: rows.length > n };
}

/** Answers a BadRequest thrown in a plugin's routes as 400 BAD_REQUEST; anything else goes on to the app's handler. */
export function answerBadRequests(app: FastifyInstance): void {
  app.setErrorHandler((err, _req, reply) => {
    if (err instanceof BadRequest) return reply.code(400).send({ error: 'BAD_REQUEST', message: err.message });
    throw err;
  });
}
