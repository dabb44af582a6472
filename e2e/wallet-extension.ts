/**
 * A test wallet extension, injected into a page before it loads: it does what
 * polkadot{.js} does through @polkadot/extension-inject (window.injectedWeb3),
 * with the accounts and the answer to "allow this site?" that the test chose.
 * The keys stay in the test process: signRaw calls the binding that
 * e2e/wallet.ts exposes, where a @polkadot/keyring sr25519 pair signs.
 */
import { injectExtension } from '@polkadot/extension-inject';
import type { InjectedAccount } from '@polkadot/extension-inject/types';

export interface TestWalletConfig {
  name: string;
  version: string;
  /** 'refuse': enable() rejects, as an extension does when its user denies the site. */
  access: 'allow' | 'refuse';
  accounts: InjectedAccount[];
}

type WalletWindow = Window & {
  tahTestWallet?: TestWalletConfig;
  tahTestWalletSign?: (address: string, data: string, type: string) => Promise<string>;
  /** The wallet's accounts now (the test can import one after the page loaded, as a person does in their extension). */
  tahTestWalletAccounts?: () => Promise<InjectedAccount[]>;
};

const page = window as WalletWindow;
const config = page.tahTestWallet;
if (config) {
  let requests = 0;
  injectExtension(
    async () => {
      if (config.access === 'refuse') throw new Error('Rejected');
      const accounts = async (): Promise<InjectedAccount[]> => (page.tahTestWalletAccounts ? await page.tahTestWalletAccounts() : config.accounts);
      return {
        accounts: {
          get: accounts,
          subscribe: (cb) => {
            void accounts().then(cb);
            return () => {};
          },
        },
        signer: {
          signRaw: async ({ address, data, type }) => ({ id: ++requests, signature: (await page.tahTestWalletSign!(address, data, type)) as `0x${string}` }),
        },
      };
    },
    { name: config.name, version: config.version },
  );
}
