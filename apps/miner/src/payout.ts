import { readFileSync, statSync } from 'node:fs';
import { Keyring } from '@polkadot/keyring';
import type { KeyringPair } from '@polkadot/keyring/types';
import { stringToU8a, u8aToHex } from '@polkadot/util';
import { canonicalAddress } from '@train-at-home/protocol';
import type { SignRaw } from '@train-at-home/swarm';

/** A payout option is wrong; the message never contains the secret. */
export class PayoutKeyError extends Error {
  override name = 'PayoutKeyError';
}

export interface PayoutKey {
  /** The wallet's address, in the generic SS58 format. */
  address: string;
  /** sr25519 signatures by the wallet's key, over a message's UTF-8 bytes. */
  signRaw: SignRaw;
  /** Set when the key file can be read by other users. */
  warning?: string;
}

/**
 * The wallet key behind --payout-address, read from --payout-key-file: a
 * mnemonic or a secret URI (`//Alice`, a 0x seed, `mnemonic//hard/soft`), as
 * sr25519. A secret is taken only from a file (never the command line, where
 * every user sees it) and appears in no error or log line. The key must be
 * the address's, so a wrong file is caught before anything is signed.
 * Call after cryptoReady().
 */
export function loadPayoutKey(file: string, address: string): PayoutKey {
  let wallet: string;
  try {
    wallet = canonicalAddress(address);
  } catch {
    throw new PayoutKeyError(`--payout-address ${address.slice(0, 64)} is not an SS58 address`);
  }
  let secret: string;
  try {
    secret = readFileSync(file, 'utf8').trim();
  } catch (e) {
    throw new PayoutKeyError(`cannot read the payout key file ${file} (${(e as NodeJS.ErrnoException).code ?? 'error'})`);
  }
  let pair: KeyringPair;
  try {
    if (secret.length === 0) throw new Error('empty');
    pair = new Keyring({ type: 'sr25519', ss58Format: 42 }).addFromUri(secret);
  } catch {
    throw new PayoutKeyError(`the payout key file ${file} holds no valid mnemonic or secret URI`);
  }
  if (pair.address !== wallet) throw new PayoutKeyError(`the payout key file holds the key of ${pair.address}, not of --payout-address ${wallet}`);
  const shared = (statSync(file).mode & 0o077) !== 0;
  return {
    address: wallet,
    signRaw: async (message) => u8aToHex(pair.sign(stringToU8a(message))),
    warning: shared ? `the payout key file ${file} can be read by other users (chmod 600 it)` : undefined,
  };
}
