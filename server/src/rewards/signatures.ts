import { signatureVerify } from '@polkadot/util-crypto';
import { verifySignature } from '@train-at-home/protocol';
import { RewardsError } from '../ledger/errors';

/** 64 bytes, or 65 with a key-type prefix byte (as some wallets send a MultiSignature). */
const SIGNATURE = /^0x(?:[0-9a-fA-F]{2}){64,65}$/;

/**
 * Checks a wallet's signature over a message as the wallet signed it: over
 * its UTF-8 bytes, or over them wrapped in `<Bytes>…</Bytes>` as extensions'
 * signRaw does (signatureVerify tries both). Only sr25519 is accepted: it is
 * what Substrate and Bittensor accounts use, and one key type means one way
 * a signature can verify. Throws MALFORMED_SIGNATURE, BAD_SIGNATURE or
 * UNSUPPORTED_KEY_TYPE.
 */
export function verifyWalletSignature(message: string, signature: string, address: string): void {
  if (!SIGNATURE.test(signature)) throw new RewardsError('MALFORMED_SIGNATURE', 'a signature is 0x and 64 bytes of hex');
  let result: ReturnType<typeof signatureVerify>;
  try {
    result = signatureVerify(message, signature, address);
  } catch {
    throw new RewardsError('MALFORMED_SIGNATURE', 'the signature cannot be read');
  }
  if (!result.isValid) throw new RewardsError('BAD_SIGNATURE', `the signature does not verify for ${address}`);
  if (result.crypto !== 'sr25519') throw new RewardsError('UNSUPPORTED_KEY_TYPE', `a ${result.crypto} signature; only sr25519 is accepted`);
}

/** The miner's agreement to a link message: its identity's 'payout-link' signature over { message }. */
export function verifyMinerSignature(message: string, signature: string, minerId: string): void {
  if (!verifySignature('payout-link', { message }, signature, minerId)) {
    throw new RewardsError('BAD_MINER_SIGNATURE', `the miner signature does not verify for ${minerId} (identity.sign('payout-link', { message }))`);
  }
}
