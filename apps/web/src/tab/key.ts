/**
 * This tab's miner key: a 32-byte sr25519 seed kept in the tab's session storage (one miner per tab, kept across
 * reloads, gone with the tab). Until the miner is linked to a wallet its earnings settle to the key's own address, so
 * the page lets the person save the key (a raw seed any Polkadot wallet imports) and train again with a saved one.
 */
const SEED_KEY = 'tah-seed';
/** The key was saved to a file or shown in this tab (the page stops warning that it would be lost). */
const SAVED_KEY = 'tah-key-saved';

export class TabKeyError extends Error {
  override name = 'TabKeyError';
}

/** The tab's seed as hex without 0x, made on first use. */
export function tabSeed(): string {
  let seed = sessionStorage.getItem(SEED_KEY);
  if (!seed || !/^[0-9a-f]{64}$/.test(seed)) {
    seed = Array.from(crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, '0')).join('');
    sessionStorage.setItem(SEED_KEY, seed);
  }
  return seed;
}

/** The tab's key as a wallet imports it (0x and 64 hex digits), or undefined before the tab first joined. */
export function tabKey(): string | undefined {
  const seed = sessionStorage.getItem(SEED_KEY);
  return seed && /^[0-9a-f]{64}$/.test(seed) ? `0x${seed}` : undefined;
}

/** Parses a saved key (0x optional, surrounding text such as a key file's other lines ignored); throws TabKeyError. */
export function parseTabKey(text: string): string {
  const keys = [...text.matchAll(/(?:^|[^0-9a-fx])(?:0x)?([0-9a-f]{64})(?![0-9a-f])/gi)].map((m) => m[1]!.toLowerCase());
  if (keys.length === 0) throw new TabKeyError('no key found: a key is 0x followed by 64 hexadecimal digits');
  if (new Set(keys).size > 1) throw new TabKeyError('more than one key found: paste one');
  return keys[0]!;
}

/** Makes a saved key this tab's (the next Join trains as that miner). */
export function restoreTabKey(text: string): void {
  sessionStorage.setItem(SEED_KEY, parseTabKey(text));
  sessionStorage.removeItem(SAVED_KEY);
}

export const keySaved = (): boolean => sessionStorage.getItem(SAVED_KEY) === '1';
export const markKeySaved = (): void => sessionStorage.setItem(SAVED_KEY, '1');

/** The text of a key file: the key, the account it makes, and what to do with it. */
export function keyFileText(key: string, address: string, origin: string): string {
  return [
    'Train at Home: a tab miner key',
    '',
    `key (sr25519 raw seed): ${key}`,
    `account (SS58 address): ${address}`,
    `run: ${origin}`,
    '',
    'Whoever holds this key can claim what was settled to its account: keep it private.',
    'To claim: import the key into a Polkadot wallet extension as a raw seed (polkadot{.js}: Add account,',
    'Import account from pre-existing seed, paste the key), connect the wallet on the Rewards page and press Claim.',
    'To train as this miner again: on the Rewards page of a new tab, paste the key under "Train with a saved key".',
    '',
  ].join('\n');
}
