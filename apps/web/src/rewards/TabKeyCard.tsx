import { cryptoReady, generateIdentity } from '@train-at-home/protocol';
import { useEffect, useState } from 'react';
import { Link } from 'react-router';
import { rewardTokens, short } from '../format';
import type { Tab } from '../tab/useTab';
import { keyFileText, keySaved, markKeySaved, parseTabKey, restoreTabKey, tabKey } from '../tab/key';
import { useRewards } from './useRewards';

/** The SS58 address of a key (0x + 64 hex), computed in the page: known before the tab joins, e.g. after a restore. */
function useKeyAddress(key: string | undefined, known: string | undefined): string | undefined {
  const [address, setAddress] = useState<string>();
  useEffect(() => {
    setAddress(undefined);
    if (!key || known) return;
    let live = true;
    void cryptoReady().then(() => {
      const seed = Uint8Array.from(key.slice(2).match(/../g)!, (h) => parseInt(h, 16));
      if (live) setAddress(generateIdentity(seed).address);
    });
    return () => {
      live = false;
    };
  }, [key, known]);
  return known ?? address;
}

/**
 * What this tab's own key holds and how to keep it: until the tab's miner is linked to a wallet, every epoch settles
 * its earnings to the key's address, and the key lives only in this tab. Saving it (a raw sr25519 seed) lets the
 * person import it into any Polkadot wallet later, on any device, and claim; pasting it into a new tab trains as the
 * same miner again.
 */
export function TabKeyCard({ tab, linked }: { tab: Tab; linked: boolean }) {
  const [key, setKey] = useState(tabKey);
  const address = useKeyAddress(key, key && tab.identity ? tab.identity.address : undefined);
  const { rewards: held } = useRewards(address);
  const [saved, setSaved] = useState(keySaved);
  const [shown, setShown] = useState(false);
  const [restore, setRestore] = useState('');
  const [restoreError, setRestoreError] = useState<string>();
  // The key is made on the first Join: read it again once the tab has an identity.
  useEffect(() => setKey(tabKey()), [tab.identity?.publicKey]);

  const save = (): void => {
    if (!key || !address) return;
    const url = URL.createObjectURL(new Blob([keyFileText(key, address, location.origin)], { type: 'text/plain' }));
    const a = document.createElement('a');
    a.href = url;
    a.download = `train-at-home-key-${address.slice(0, 8)}.txt`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
    markKeySaved();
    setSaved(true);
  };
  const show = (): void => {
    setShown(true);
    markKeySaved();
    setSaved(true);
  };
  const useSaved = (): void => {
    try {
      parseTabKey(restore);
    } catch (e) {
      setRestoreError((e as Error).message);
      return;
    }
    restoreTabKey(restore);
    location.reload(); // the next Join starts the worker with the restored key
  };

  const claimable = held ? BigInt(held.totals.claimable) : 0n;
  return (
    <section className="card" data-testid="tab-key" data-address={address ?? ''}>
      <h2>This tab's key</h2>
      {!key || !address ? (
        <p data-testid="tab-key-none">
          This tab has no miner key yet: it makes one when you press Join on <Link to="/">Train</Link>.
        </p>
      ) : (
        <>
          <p>
            This tab trains as the account <span className="mono" data-testid="tab-key-address" title={address}>{short(address, 8)}</span> (an SS58 address, the
            public name of the tab's sr25519 key).{' '}
            {linked ? 'It is linked to your wallet: epochs settled since the link pay your account.' : 'Until you link it to a wallet, every epoch pays its earnings to this key.'}
          </p>
          <dl className="grid">
            <dt>Settled to this key</dt>
            <dd data-testid="tab-key-settled" data-base-units={held?.totals.settled ?? ''}>
              {held ? rewardTokens(held.totals.settled, 9) : '…'}
            </dd>
            <dt>Claimable with it</dt>
            <dd data-testid="tab-key-claimable" data-base-units={held?.totals.claimable ?? ''}>
              {held ? rewardTokens(held.totals.claimable, 9) : '…'}
            </dd>
          </dl>
          {!saved && (!linked || claimable > 0n) && (
            <p className="warn" data-testid="tab-key-warning">
              The key lives only in this tab: closing the tab or clearing the browser's data loses it{claimable > 0n ? ', and what it holds' : ''}. Save it now.
            </p>
          )}
          <ol className="steps">
            <li>
              Save the key. Whoever holds it can claim what it holds: keep it private.{' '}
              <span className="controls">
                <button data-testid="save-key" onClick={save}>
                  Save the key to a file
                </button>
                <button data-testid="show-key" onClick={show} disabled={shown}>
                  Show it
                </button>
              </span>
              {shown && (
                <span className="mono key" data-testid="key-text">
                  {key}
                </span>
              )}
            </li>
            <li>
              To claim what it holds, on this device or another: import it into a Polkadot wallet extension as a raw seed (polkadot{'{.js}'}: Add
              account → Import account from pre-existing seed → paste the key). It becomes the account above.
            </li>
            <li>Connect that wallet on this page and press Claim; or link this tab to any account of your wallet, so that later epochs pay it.</li>
          </ol>
        </>
      )}
      <details data-testid="restore-key">
        <summary>Train with a saved key</summary>
        <p className="hint">Paste a key saved from another tab: this tab then trains as that miner again (its link, if any, included).</p>
        <div className="controls">
          <input className="key-input" data-testid="restore-key-input" value={restore} onChange={(e) => (setRestore(e.target.value), setRestoreError(undefined))} placeholder="0x…" spellCheck={false} />
          <button data-testid="restore-key-button" onClick={useSaved} disabled={tab.joined || !restore}>
            Use this key
          </button>
          {tab.joined && <span className="hint">Leave on Train first.</span>}
        </div>
        {restoreError && (
          <p className="error" data-testid="restore-key-error">
            {restoreError}
          </p>
        )}
      </details>
    </section>
  );
}
