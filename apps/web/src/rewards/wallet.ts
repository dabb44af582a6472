/**
 * The wallet holder's side: a Polkadot-ecosystem extension (polkadot{.js},
 * Talisman, SubWallet…) through @polkadot/extension-dapp. Connecting ends in
 * one of four named outcomes, each of which the page explains with what to do.
 */
import { web3Accounts, web3Enable, web3FromSource } from '@polkadot/extension-dapp';
import type { InjectedWindow } from '@polkadot/extension-inject/types';
import { stringToHex } from '@polkadot/util';

/** The name the extension shows when it asks the user to allow this page. */
export const APP_NAME = 'Train at Home';
/** SS58 prefix 42, the generic Substrate format: the form the coordinator names accounts in. */
const SS58_FORMAT = 42;

export interface WalletAccount {
  /** SS58 address (prefix 42). */
  address: string;
  name?: string;
  /** The extension that holds the key (its name in window.injectedWeb3). */
  source: string;
}

export type WalletConnection =
  /** Nothing in window.injectedWeb3: no extension is installed (or it is disabled for this site). */
  | { kind: 'no-extension' }
  /** Extensions are there, but none let this page in (the user refused, or dismissed the request). */
  | { kind: 'refused'; extensions: string[] }
  /** Connected, but no account can be paid: none shared with this page, or none of them sr25519. */
  | { kind: 'no-accounts'; extensions: string[]; otherTypes: string[] }
  | { kind: 'connected'; extensions: string[]; accounts: WalletAccount[] };

/** Asks every installed extension to let this page in, then lists the accounts it may use. */
export async function connectWallet(): Promise<WalletConnection> {
  const enabled = await web3Enable(APP_NAME);
  const installed = Object.keys((window as unknown as Partial<InjectedWindow>).injectedWeb3 ?? {});
  if (installed.length === 0) return { kind: 'no-extension' };
  if (enabled.length === 0) return { kind: 'refused', extensions: installed };
  const extensions = enabled.map((e) => e.name);
  const all = await web3Accounts({ ss58Format: SS58_FORMAT });
  // The coordinator verifies sr25519 signatures only (an account without a type is one: the extensions' default).
  const usable = all.filter((a) => !a.type || a.type === 'sr25519');
  if (usable.length === 0) return { kind: 'no-accounts', extensions, otherTypes: [...new Set(all.map((a) => a.type ?? ''))] };
  return { kind: 'connected', extensions, accounts: usable.map((a) => ({ address: a.address, name: a.meta.name, source: a.meta.source })) };
}

export class WalletError extends Error {
  override name = 'WalletError';
}

/**
 * The account's signature of a server-written message, made by its extension:
 * signRaw with type 'bytes' over the message's UTF-8 bytes (extensions sign
 * them wrapped in <Bytes>…</Bytes>; the coordinator accepts both forms).
 */
export async function signWithWallet(account: WalletAccount, message: string): Promise<string> {
  const extension = await web3FromSource(account.source);
  if (!extension.signer.signRaw) throw new WalletError(`${account.source} cannot sign messages (it has no signRaw)`);
  try {
    const { signature } = await extension.signer.signRaw({ address: account.address, data: stringToHex(message), type: 'bytes' });
    return signature;
  } catch (e) {
    throw new WalletError(`the wallet did not sign (${(e as Error).message || 'cancelled'}); nothing was sent`);
  }
}
