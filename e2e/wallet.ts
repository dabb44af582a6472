import { Keyring } from '@polkadot/keyring';
import type { KeyringPair } from '@polkadot/keyring/types';
import { hexToU8a, isHex, u8aToHex, u8aToString, u8aWrapBytes } from '@polkadot/util';
import { cryptoWaitReady, mnemonicGenerate } from '@polkadot/util-crypto';
import { fileURLToPath } from 'node:url';
import type { Page } from 'playwright-core';
import { build } from 'vite';
import type { TestWalletConfig } from './wallet-extension';

const EXTENSION_ENTRY = fileURLToPath(new URL('./wallet-extension.ts', import.meta.url));
let bundle: Promise<string> | undefined;

/** wallet-extension.ts and @polkadot/extension-inject as one script for page.addInitScript (built once, by vite). */
function extensionScript(): Promise<string> {
  bundle ??= build({
    configFile: false,
    logLevel: 'silent',
    build: { write: false, minify: false, lib: { entry: EXTENSION_ENTRY, formats: ['iife'], name: 'tahTestWalletExtension' } },
  }).then((out) => {
    const outputs = Array.isArray(out) ? out : [out];
    const chunk = outputs.flatMap((o) => ('output' in o ? o.output : [])).find((c) => c.type === 'chunk');
    if (!chunk || chunk.type !== 'chunk') throw new Error('the test extension did not build');
    return chunk.code;
  });
  return bundle;
}

/** A fresh sr25519 account (a new mnemonic each run), in the generic SS58 format the coordinator uses. */
export async function newAccount(name: string): Promise<KeyringPair> {
  await cryptoWaitReady();
  const pair = new Keyring({ type: 'sr25519', ss58Format: 42 }).addFromUri(mnemonicGenerate(), { name });
  return pair;
}

export interface TestWallet {
  /** Every message the wallet signed, as text, in order. */
  signed: string[];
  /** Adds an account to the wallet, as a person imports a key into their extension (the page sees it on its next connect). */
  importAccount(pair: KeyringPair): void;
}

/** The account a raw sr25519 seed (0x + 64 hex) makes, as a wallet extension imports it. */
export async function accountFromSeed(seed: string, name: string): Promise<KeyringPair> {
  await cryptoWaitReady();
  return new Keyring({ type: 'sr25519', ss58Format: 42 }).addFromSeed(hexToU8a(seed), { name });
}

/**
 * Installs the test extension in a page before it loads. Signing requests reach
 * the pair in this process, which signs exactly as polkadot{.js} does for
 * signRaw of type 'bytes': over the data wrapped in <Bytes>…</Bytes>.
 */
export async function installTestWallet(page: Page, options: { accounts: KeyringPair[]; access?: 'allow' | 'refuse'; name?: string }): Promise<TestWallet> {
  const accounts = [...options.accounts];
  const wallet: TestWallet = { signed: [], importAccount: (pair) => void accounts.push(pair) };
  const shared = () => accounts.map((p) => ({ address: p.address, name: String(p.meta.name ?? ''), type: p.type }));
  const config: TestWalletConfig = { name: options.name ?? 'tah-test-wallet', version: '0.63.1', access: options.access ?? 'allow', accounts: shared() };
  await page.exposeFunction('tahTestWalletAccounts', shared);
  await page.exposeFunction('tahTestWalletSign', (address: string, data: string, type: string): string => {
    const pair = accounts.find((p) => p.address === address);
    if (!pair) throw new Error(`the test wallet holds no account ${address}`);
    if (type !== 'bytes' || !isHex(data)) throw new Error(`the test wallet signs bytes only (got ${type})`);
    const bytes = hexToU8a(data);
    wallet.signed.push(u8aToString(bytes));
    return u8aToHex(pair.sign(u8aWrapBytes(bytes)));
  });
  await page.addInitScript(`window.tahTestWallet = ${JSON.stringify(config)};\n${await extensionScript()}`);
  return wallet;
}
