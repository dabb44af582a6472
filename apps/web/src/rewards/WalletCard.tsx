import type { WalletAccount, WalletConnection } from './wallet';
import { short } from '../format';

/** Connecting a wallet extension: each of connectWallet's four outcomes explained with what to do, and the account chosen. */
export function WalletCard({ connection, connecting, account, onConnect, onChoose }: { connection?: WalletConnection; connecting: boolean; account?: WalletAccount; onConnect(): void; onChoose(address: string): void }) {
  const connect = (label: string) => (
    <button data-testid="connect-wallet" onClick={onConnect} disabled={connecting}>
      {connecting ? 'Asking your extension…' : label}
    </button>
  );
  return (
    <section className="card">
      <h2>Wallet</h2>
      {!connection && (
        <>
          <p>Rewards are paid to a Polkadot-ecosystem account: an SS58 address, the public name of an sr25519 key such as Polkadot and Bittensor wallets hold. Connect your wallet extension to choose one, or save this tab's own key below and claim later.</p>
          <div className="controls">{connect('Connect wallet')}</div>
        </>
      )}
      {connection?.kind === 'no-extension' && (
        <div className="guidance" data-testid="wallet-guidance" data-kind="no-extension">
          <p>
            <strong>No wallet extension found in this browser.</strong> Install one — the{' '}
            <a href="https://polkadot.js.org/extension/" target="_blank" rel="noreferrer">
              polkadot{'{.js}'} extension
            </a>
            ,{' '}
            <a href="https://talisman.xyz/" target="_blank" rel="noreferrer">
              Talisman
            </a>{' '}
            or{' '}
            <a href="https://www.subwallet.app/" target="_blank" rel="noreferrer">
              SubWallet
            </a>{' '}
            — create or import an account in it, then reload this page and press Connect.
          </p>
          <p>On a phone, open this page in the browser of a wallet app (Nova Wallet, SubWallet) instead.</p>
          <div className="controls">{connect('Try again')}</div>
        </div>
      )}
      {connection?.kind === 'refused' && (
        <div className="guidance" data-testid="wallet-guidance" data-kind="refused">
          <p>
            <strong>{connection.extensions.join(', ')} did not let this page in.</strong> Open the extension and allow “Train at Home” (in
            polkadot{'{.js}'}: Settings → Manage Website Access), then press Connect again.
          </p>
          <div className="controls">{connect('Connect again')}</div>
        </div>
      )}
      {connection?.kind === 'no-accounts' && (
        <div className="guidance" data-testid="wallet-guidance" data-kind="no-accounts">
          <p>
            <strong>{connection.extensions.join(', ')} shares no account this page can pay.</strong> Create or import an account in the extension
            (sr25519, its default type), make it visible to this site, then press Connect again.
            {connection.otherTypes.length > 0 && ` It shares only ${connection.otherTypes.join(', ')} accounts, whose signatures the coordinator does not accept.`}
          </p>
          <div className="controls">{connect('Connect again')}</div>
        </div>
      )}
      {connection?.kind === 'connected' && (
        <>
          <label className="account">
            Pay to{' '}
            <select data-testid="account-select" value={account?.address ?? ''} onChange={(e) => onChoose(e.target.value)}>
              {!account && <option value="">Choose an account</option>}
              {connection.accounts.map((a) => (
                <option key={`${a.source}/${a.address}`} value={a.address}>
                  {a.name ? `${a.name} — ` : ''}
                  {short(a.address, 8)}
                </option>
              ))}
            </select>
          </label>
          {account && (
            <p className="mono" data-testid="account-address">
              {account.address}
            </p>
          )}
        </>
      )}
    </section>
  );
}
