import { canonicalAddress, parseRewardsMessage, type ClaimMessage, type LinkMessage } from '@train-at-home/protocol';

/**
 * The client side of the Rewards API (docs/rewards-api.md), one
 * implementation for the Train at Home tab and the Node miner: ask the
 * coordinator for a message, check it says what we asked for, have the
 * wallet sign it, post it. Only the signer differs: the extension's
 * `signRaw` in the browser, a keyring pair in Node.
 */

/**
 * The wallet's signature over a message's UTF-8 bytes (or over them wrapped in
 * `<Bytes>…</Bytes>`, as extensions sign): 0x-hex, sr25519. With an extension:
 * `(m) => signer.signRaw({ address, data: stringToHex(m), type: 'bytes' }).then((r) => r.signature)`.
 */
export type SignRaw = (message: string) => Promise<string>;

/** What linking needs of the miner: its public key and a signature (an Identity, or a proxy to the worker that holds one). */
export interface PayoutLinkSigner {
  publicKey: string;
  sign(purpose: 'payout-link', payload: { message: string }): string | Promise<string>;
}

export interface PayoutLink {
  minerId: string;
  address: string;
  linkedAt: string;
}

export interface ClaimReceipt {
  id: number;
  address: string;
  amount: string;
  epochs: Array<{ runId: number; epoch: number; amount: string }>;
  claimedAt: string;
  payout: Record<string, unknown>;
}

/**
 * The coordinator refused: its named code (NONCE_USED, RATE_LIMITED, …; see docs/rewards-api.md); or,
 * before anything was signed, a message that is not what we asked for (UNEXPECTED_MESSAGE) or that names
 * another coordinator's domain (WRONG_DOMAIN, with no status).
 */
export class RewardsApiError extends Error {
  override name = 'RewardsApiError';
  constructor(
    readonly code: string,
    message: string,
    readonly status?: number,
    readonly retryAfterMs?: number,
  ) {
    super(`${code}: ${message}`);
  }
}

type Fetch = typeof fetch;

async function post<T>(fetchFn: Fetch, coordinatorUrl: string, path: string, body: unknown): Promise<T> {
  const res = await fetchFn(new URL(path, coordinatorUrl), { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const json = (await res.json().catch(() => ({}))) as { error?: unknown; message?: unknown; retryAfterMs?: unknown };
  if (!res.ok) {
    const retryAfterMs = typeof json.retryAfterMs === 'number' ? json.retryAfterMs : undefined;
    throw new RewardsApiError(typeof json.error === 'string' ? json.error : `HTTP_${res.status}`, typeof json.message === 'string' ? json.message : res.statusText, res.status, retryAfterMs);
  }
  return json as T;
}

/** The address in the generic SS58 format the coordinator writes; BAD_ADDRESS before anything is sent. */
function walletAddress(address: string): string {
  try {
    return canonicalAddress(address);
  } catch (e) {
    throw new RewardsApiError('BAD_ADDRESS', (e as Error).message);
  }
}

export interface RewardsClientOptions {
  /**
   * The domain the coordinator's messages must name: by default the host (and
   * port) of `coordinatorUrl`, the site we are talking to. Set it only where
   * that site is reached under another name on purpose (a development proxy).
   */
  domain?: string;
}

/** The domain a message from this coordinator must name (lower-case host, with its port unless the scheme's default). */
function expectedDomain(coordinatorUrl: string, options: RewardsClientOptions): string {
  return (options.domain ?? new URL(coordinatorUrl).host).toLowerCase();
}

/**
 * Never sign what we did not ask for: a coordinator could otherwise have a
 * wallet sign another site's message. Its kind, miner and address are ours,
 * and its domain is the coordinator's we are talking to: a site that relays
 * another coordinator's challenge would get a signature that one accepts.
 */
function expectMessage<K extends 'link' | 'claim'>(text: string, kind: K, domain: string, check: (m: K extends 'link' ? LinkMessage : ClaimMessage) => boolean): void {
  let m;
  try {
    m = parseRewardsMessage(text);
  } catch (e) {
    throw new RewardsApiError('UNEXPECTED_MESSAGE', `the coordinator sent a message that does not parse: ${(e as Error).message}`);
  }
  if (m.kind !== kind || !check(m as K extends 'link' ? LinkMessage : ClaimMessage)) throw new RewardsApiError('UNEXPECTED_MESSAGE', `the coordinator sent a message that is not the ${kind} asked for`);
  if (m.domain !== domain) {
    throw new RewardsApiError('WRONG_DOMAIN', `the coordinator at ${domain} sent a message for ${m.domain}: not signed (connect to ${m.domain} itself if that is the coordinator you mean)`);
  }
}

/**
 * Links this miner's earnings to a wallet address: epochs settled from now on
 * pay `address`. Both the wallet (signRaw) and the miner (identity) sign the
 * coordinator's message. Throws RewardsApiError with the coordinator's code.
 */
export async function linkPayout(
  coordinatorUrl: string,
  identity: PayoutLinkSigner,
  address: string,
  signRaw: SignRaw,
  fetchFn: Fetch = fetch,
  options: RewardsClientOptions = {},
): Promise<PayoutLink> {
  const wallet = walletAddress(address);
  const minerId = identity.publicKey.toLowerCase();
  const domain = expectedDomain(coordinatorUrl, options);
  const { message } = await post<{ message: string }>(fetchFn, coordinatorUrl, '/api/rewards/challenge', { kind: 'link', minerId, address: wallet });
  expectMessage(message, 'link', domain, (m) => m.minerId === minerId && m.address === wallet);
  const signature = await signRaw(message);
  const minerSignature = await identity.sign('payout-link', { message });
  return post<PayoutLink>(fetchFn, coordinatorUrl, '/api/rewards/link', { message, signature, minerSignature });
}

/** Claims everything claimable by `address` now (up to MAX_CLAIM_EPOCHS epochs): one signed message, one receipt. */
export async function claimRewards(coordinatorUrl: string, address: string, signRaw: SignRaw, fetchFn: Fetch = fetch, options: RewardsClientOptions = {}): Promise<ClaimReceipt> {
  const wallet = walletAddress(address);
  const domain = expectedDomain(coordinatorUrl, options);
  const { message } = await post<{ message: string }>(fetchFn, coordinatorUrl, '/api/rewards/challenge', { kind: 'claim', address: wallet });
  expectMessage(message, 'claim', domain, (m) => m.address === wallet);
  const signature = await signRaw(message);
  const { receipt } = await post<{ receipt: ClaimReceipt }>(fetchFn, coordinatorUrl, '/api/rewards/claim', { message, signature });
  return receipt;
}
