import { Type, type Static } from '@sinclair/typebox';
import { PAYOUT_LEAF_ENCODING } from '@train-at-home/incentives';
import { MAX_REWARDS_MESSAGE_CHARS, RewardsMessageError, canonicalAddress, formatRewardsMessage, parseRewardsMessage, type RewardsMessage } from '@train-at-home/protocol';
import type { FastifyError, FastifyPluginAsync } from 'fastify';
import type { Coordinator } from '../coordinator';
import { retryRaceLoss } from '../db/database';
import { RateLimited } from '../rate-limited';
import { MAX_EPOCH } from '../ledger/epochs';
import { balance, claimable, executeClaim, receipts } from '../ledger/claims';
import { RewardsError } from '../ledger/errors';
import { insertLink, linkedMiners, minerKnown } from '../rewards/links';
import { consumeNonce, issueNonce } from '../ledger/nonces';
import { rewardsRateLimits } from '../rewards/rate-limit';
import type { RewardsSettings } from '../rewards/settings';
import { verifyMinerSignature, verifyWalletSignature } from '../rewards/signatures';

export const DEFAULT_REWARDS_PAGE = 100;
export const MAX_REWARDS_PAGE = 500;

/** Checked further in code (BAD_ADDRESS); the bound only keeps absurd input out. */
const Address = Type.String({ minLength: 1, maxLength: 128 });
const Message = Type.String({ minLength: 1, maxLength: MAX_REWARDS_MESSAGE_CHARS });
/** Checked further in code, so a malformed one gets its own code (MALFORMED_SIGNATURE). */
const Signature = Type.String({ maxLength: 200 });

const ChallengeBody = Type.Object(
  {
    kind: Type.Union([Type.Literal('link'), Type.Literal('claim')]),
    // The miner's public key, with or without 0x (a link only).
    minerId: Type.Optional(Type.String({ pattern: '^(0x)?[0-9a-fA-F]{64}$' })),
    address: Address,
  },
  { additionalProperties: false },
);
const LinkBody = Type.Object({ message: Message, signature: Signature, minerSignature: Signature }, { additionalProperties: false });
const ClaimBody = Type.Object({ message: Message, signature: Signature }, { additionalProperties: false });
const AddressParams = Type.Object({ address: Address });
/**
 * A query's values are strings, and Ajv coerces nothing (app.ts): a number is
 * its decimal digits, read by `bounded`; a repeated parameter (an array) or an
 * unknown one does not fit.
 */
const Digits = Type.String({ pattern: '^(?:0|[1-9][0-9]{0,9})$' });
const BalanceQuery = Type.Object(
  {
    limit: Type.Optional(Digits),
    // The cursor a page names: epochs before this (run, epoch), newest first.
    before: Type.Optional(Type.String({ pattern: '^[0-9]{1,10}:[0-9]{1,10}$' })),
  },
  { additionalProperties: false },
);
const ClaimsQuery = Type.Object({ limit: Type.Optional(Digits), before: Type.Optional(Digits) }, { additionalProperties: false });

/**
 * Rewards for wallet holders (docs/rewards-api.md): a wallet links itself as
 * a miner's payout address, and claims what the ledger settled for it. Every
 * message a wallet signs is written here, names this coordinator's domain,
 * carries a one-use nonce and an expiry; a link is signed by the wallet and
 * by the miner. Order of checks, cheapest and stateless first: schema, message
 * form, domain, expiry, signatures; then one transaction that consumes the
 * nonce and does the work. Every refusal is a named 4xx that changed nothing.
 */
export const rewardRoutes: FastifyPluginAsync<{ coordinator: Coordinator; settings: RewardsSettings }> = async (app, { coordinator, settings }) => {
  const { db } = coordinator;
  const limited = rewardsRateLimits(app, settings.rateLimit);
  const now = (): Date => new Date(settings.now());

  app.setErrorHandler((err: FastifyError, req, reply) => {
    // The app's per-IP limit on every route, and this plugin's per-address one: RATE_LIMITED, retryAfterMs, retry-after.
    if (err instanceof RateLimited) return reply.code(429).header('retry-after', String(Math.ceil(err.retryAfterMs / 1000))).send(err.body);
    const { status, code, message } = refusal(err);
    if (status >= 500) req.log.error({ err }, 'rewards request failed');
    return reply.code(status).send({ error: code, message });
  });

  /** A parsed message of the kind the route takes, for this domain, not expired. */
  const fresh = <K extends RewardsMessage['kind']>(text: string, kind: K): Extract<RewardsMessage, { kind: K }> => {
    const m = parseRewardsMessage(text);
    if (m.kind !== kind) throw new RewardsError('BAD_MESSAGE', `a ${m.kind} message sent to the ${kind} route`);
    if (m.domain !== settings.domain) throw new RewardsError('WRONG_DOMAIN', `the message is for ${m.domain}; this is ${settings.domain}`);
    if (Date.parse(m.expires) <= now().getTime()) throw new RewardsError('EXPIRED', 'the challenge expired; ask for a new one');
    return m as Extract<RewardsMessage, { kind: K }>;
  };

  // A challenge proves no address: limited per IP only (rewards/rate-limit.ts).
  const challengeLimits = limited();
  app.post<{ Body: Static<typeof ChallengeBody> }>('/api/rewards/challenge', { schema: { body: ChallengeBody }, onRequest: challengeLimits.onRequest }, async (req, reply) => {
    const { kind, minerId: rawMiner } = req.body;
    const address = canonicalAddress(req.body.address);
    const ttl = settings.challengeTtlMs;
    if (kind === 'link') {
      if (rawMiner === undefined) throw new RewardsError('BAD_REQUEST', 'a link challenge names the miner (minerId)');
      const minerId = rawMiner.replace(/^0x/, '').toLowerCase();
      if (!(await minerKnown(db, minerId))) throw new RewardsError('NO_SUCH_MINER', `no miner ${minerId} registered here`);
      const write = (nonce: string, expires: string) => formatRewardsMessage({ kind, domain: settings.domain, minerId: `0x${minerId}`, address, nonce, expires });
      return reply.send(await issueNonce(db, 'link', address, now(), ttl, write));
    }
    if (rawMiner !== undefined) throw new RewardsError('BAD_REQUEST', 'a claim challenge names no miner');
    const { amount, epochs } = await claimable(db, address);
    if (epochs.length === 0) throw new RewardsError('NOTHING_TO_CLAIM', `nothing is claimable by ${address} now`);
    const write = (nonce: string, expires: string) => formatRewardsMessage({ kind, domain: settings.domain, address, amount, epochs, nonce, expires });
    return reply.send(await issueNonce(db, 'claim', address, now(), ttl, write));
  });

  const linkLimits = limited();
  app.post<{ Body: Static<typeof LinkBody> }>('/api/rewards/link', { schema: { body: LinkBody }, onRequest: linkLimits.onRequest }, async (req) => {
    const { message, signature, minerSignature } = req.body;
    const m = fresh(message, 'link');
    verifyWalletSignature(message, signature, m.address);
    await linkLimits.proven(req, m.address); // counted against the address only now that its wallet signed
    verifyMinerSignature(message, minerSignature, m.minerId);
    const at = now();
    // Copies of one link sent at once race for its nonce: under SERIALIZABLE the losers' transactions
    // fail (40001) and, run again, find the nonce used (NONCE_USED), as claims do.
    return retryRaceLoss(() =>
      db.transaction(async (tx) => {
        const issued = await consumeNonce(tx, m.nonce, 'link', at);
        if (issued.message !== message) throw new RewardsError('MESSAGE_MISMATCH', 'the message differs from the one issued with its nonce');
        const linkedAt = await insertLink(tx, m.minerId.slice(2), m.address, m.nonce);
        return { minerId: m.minerId, address: m.address, linkedAt };
      }),
    );
  });

  const claimLimits = limited();
  app.post<{ Body: Static<typeof ClaimBody> }>('/api/rewards/claim', { schema: { body: ClaimBody }, onRequest: claimLimits.onRequest }, async (req) => {
    const { message, signature } = req.body;
    const m = fresh(message, 'claim');
    verifyWalletSignature(message, signature, m.address);
    await claimLimits.proven(req, m.address);
    return { receipt: await executeClaim(db, m, message, settings.payoutSink, now()) };
  });

  app.get<{ Params: Static<typeof AddressParams>; Querystring: Static<typeof BalanceQuery> }>(
    '/api/rewards/:address',
    { schema: { params: AddressParams, querystring: BalanceQuery } },
    async (req) => {
      const address = canonicalAddress(req.params.address);
      const before = runEpoch(req.query.before);
      const page = await balance(db, address, bounded(req.query.limit, 'limit', 1, MAX_REWARDS_PAGE) ?? DEFAULT_REWARDS_PAGE, before);
      const miners = await linkedMiners(db, address, MAX_REWARDS_PAGE);
      return { address, miners, totals: page.totals, leafEncoding: PAYOUT_LEAF_ENCODING, epochs: page.epochs, nextBefore: page.nextBefore };
    },
  );

  app.get<{ Params: Static<typeof AddressParams>; Querystring: Static<typeof ClaimsQuery> }>(
    '/api/rewards/:address/claims',
    { schema: { params: AddressParams, querystring: ClaimsQuery } },
    async (req) => {
      const address = canonicalAddress(req.params.address);
      const limit = bounded(req.query.limit, 'limit', 1, MAX_REWARDS_PAGE) ?? DEFAULT_REWARDS_PAGE;
      return receipts(db, address, limit, bounded(req.query.before, 'before', 1, 2 ** 31 - 1));
    },
  );
};

/** A query's integer (its digits checked by the schema) within min…max; null when absent. */
function bounded(raw: string | undefined, name: string, min: number, max: number): number | null {
  if (raw === undefined) return null;
  const n = Number(raw);
  if (n < min || n > max) throw new RewardsError('BAD_REQUEST', `${name} must be an integer in ${min}…${max}`);
  return n;
}

/** A `<run>:<epoch>` cursor, each part a PostgreSQL integer. */
function runEpoch(raw: string | undefined): { runId: number; epoch: number } | null {
  if (raw === undefined) return null;
  const [runId, epoch] = raw.split(':').map(Number) as [number, number];
  if (runId > 2 ** 31 - 1 || epoch > MAX_EPOCH) throw new RewardsError('BAD_REQUEST', 'before must be <run>:<epoch>, each in 0…2^31−1');
  return { runId, epoch };
}

/** Every error as the API's named refusal; anything unnamed is a 500 (and logged). */
function refusal(err: FastifyError): { status: number; code: string; message: string } {
  if (err instanceof RewardsError) return { status: err.status, code: err.code, message: err.message };
  if (err instanceof RewardsMessageError) return { status: 400, code: err.code, message: err.message };
  if (err.validation) return { status: 400, code: 'BAD_REQUEST', message: err.message };
  if (err.statusCode === 413) return { status: 413, code: 'BODY_TOO_LARGE', message: err.message };
  if (err.statusCode === 415) return { status: 415, code: 'BAD_CONTENT_TYPE', message: 'send JSON (content-type: application/json)' };
  if (err.statusCode && err.statusCode >= 400 && err.statusCode < 500) return { status: 400, code: 'BAD_REQUEST', message: err.message };
  return { status: 500, code: 'INTERNAL', message: 'the coordinator could not handle this request' };
}
