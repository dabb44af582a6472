import { verifyPayout } from '@train-at-home/incentives';
import { useCallback, useEffect, useMemo, useState } from 'react';
import { Link } from 'react-router';
import { BASE_UNITS_PER_TOKEN, minerLabel, short, tokens } from '../format';
import { useTabContext } from '../tab/TabContext';
import type { Tab } from '../tab/useTab';
import { parseRewardsMessage } from '@train-at-home/protocol';
import { claimRewards, linkPayout, type ClaimReceipt } from '@train-at-home/swarm';
import { describeError, type Rewards, type Schedule } from './api';
import { TabKeyCard } from './TabKeyCard';
import { WalletCard } from './WalletCard';
import { useRewards } from './useRewards';
import { connectWallet, signWithWallet, type WalletAccount, type WalletConnection } from './wallet';

/** localStorage: the wallet was connected once (connect again on load), and the account last chosen. */
const CONNECTED_KEY = 'tah-wallet-connected';
const ACCOUNT_KEY = 'tah-payout-address';

const sameMiner = (a: string, b: string): boolean => a.replace(/^0x/i, '').toLowerCase() === b.replace(/^0x/i, '').toLowerCase();

/** An amount in reward tokens (every base unit shown), with the exact base units for tests and tooltips. */
function Amount({ units, testId, unit = true }: { units: string; testId?: string; unit?: boolean }) {
  return (
    <>
      <span className="amount" data-testid={testId} data-base-units={units} title={`${units} base units`}>
        {tokens(units, 9)}
      </span>
      {unit && (units === BASE_UNITS_PER_TOKEN.toString() ? ' reward token' : ' reward tokens')}
    </>
  );
}

function LinkCard({ tab, account, walletConnected, rewards, onLinked }: { tab: Tab; account?: WalletAccount; walletConnected: boolean; rewards?: Rewards; onLinked(): Promise<void> }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string>();
  const [linkedAt, setLinkedAt] = useState<string>();
  const minerId = tab.identity?.publicKey;
  const linked = !!(minerId && rewards?.miners.some((m) => sameMiner(m, minerId)));

  const link = async (): Promise<void> => {
    if (!account || !minerId) return;
    setBusy(true);
    setError(undefined);
    try {
      // The shared client checks that the message names this miner and this address before either signs it.
      const miner = { publicKey: minerId, sign: (_purpose: 'payout-link', { message }: { message: string }) => tab.signPayoutLink(message) };
      const result = await linkPayout(location.origin, miner, account.address, (message) => signWithWallet(account, message));
      setLinkedAt(result.linkedAt);
      await onLinked();
    } catch (e) {
      setError(`Not linked: ${describeError(e)}`);
    } finally {
      setBusy(false);
    }
  };

  return (
    <section className="card">
      <h2>This tab's payouts</h2>
      {linked && account ? (
        <p className="ok" data-testid="link-status" data-linked="true">
          ✓ This tab's miner <span className="mono" title={minerId}>{minerLabel(minerId!)}</span> is linked to{' '}
          <span className="mono">{short(account.address, 8)}</span>
          {linkedAt ? ` (at ${new Date(linkedAt).toLocaleTimeString()})` : ''}: the epochs settled since pay this account.
          {!tab.joined && (
            <>
              {' '}
              It is not training now: press Join on <Link to="/">Train</Link> to earn more.
            </>
          )}
        </p>
      ) : !tab.joined ? (
        <p data-testid="link-needs-join">
          This tab is not training. Go to <Link to="/">Train</Link> and press Join, then come back here to have its earnings paid to your account.
        </p>
      ) : !minerId || !tab.status?.minerId ? (
        <p data-testid="link-wait">This tab is joining the run: it can be linked once the coordinator has registered its miner.</p>
      ) : (
        <>
          <p>
            This tab's miner is <span className="mono" title={minerId}>{minerLabel(minerId)}</span>. Until it is linked, its earnings are settled to the
            miner's own key, which lives only in this tab.
          </p>
          {!account ? (
            <p data-testid="link-needs-wallet">
              {walletConnected ? 'Choose an account above to link it.' : 'Connect a wallet above to link it. Until then, save the key below: it is the only way to claim what this tab earns.'}
            </p>
          ) : (
            <div className="controls">
              <button data-testid="link-miner" onClick={link} disabled={busy}>
                {busy ? 'Signing…' : 'Link this tab to my account'}
              </button>
              <span className="hint">Your wallet and this tab's miner both sign the link.</span>
            </div>
          )}
        </>
      )}
      {error && (
        <p className="error" data-testid="link-error">
          {error}
        </p>
      )}
    </section>
  );
}

function BalanceCard({ account, rewards, claims, schedule, onClaimed }: { account: WalletAccount; rewards?: Rewards; claims: ClaimReceipt[]; schedule?: Schedule; onClaimed(): Promise<void> }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string>();
  const [receipt, setReceipt] = useState<ClaimReceipt>();
  // Each settled amount is checked here, against its epoch's root, for this page's own address.
  const verified = useMemo(
    () => new Map((rewards?.epochs ?? []).map((e) => [`${e.runId}:${e.epoch}`, verifyPayout(e.root, account.address, e.settled, e.proof)])),
    [rewards, account.address],
  );
  const claimable = rewards ? BigInt(rewards.totals.claimable) : 0n;
  const unverified = (rewards?.epochs ?? []).filter((e) => BigInt(e.claimable) > 0n && !verified.get(`${e.runId}:${e.epoch}`));

  const claim = async (): Promise<void> => {
    if (!rewards) return;
    setBusy(true);
    setError(undefined);
    try {
      const receipt = await claimRewards(location.origin, account.address, async (message) => {
        // The wallet signs only amounts whose proofs this page verified: every epoch named, and their sum.
        const claim = parseRewardsMessage(message);
        const epochs = claim.kind === 'claim' ? claim.epochs.map(({ runId, epoch }) => rewards.epochs.find((e) => e.runId === runId && e.epoch === epoch)) : [];
        const sum = epochs.reduce((n, e) => n + (e && verified.get(`${e.runId}:${e.epoch}`) ? BigInt(e.claimable) : 0n), 0n);
        if (claim.kind !== 'claim' || epochs.some((e) => !e || !verified.get(`${e.runId}:${e.epoch}`)) || claim.amount !== sum) {
          void onClaimed();
          throw new Error('the balance changed while the claim was prepared: check it and press Claim again');
        }
        return signWithWallet(account, message);
      });
      setReceipt(receipt);
      await onClaimed();
    } catch (e) {
      setError(`Not claimed: ${describeError(e)}`);
    } finally {
      setBusy(false);
    }
  };

  return (
    <>
      <section className="card" data-testid="balance">
        <h2>Rewards</h2>
        {!rewards ? (
          <p>Reading the balance…</p>
        ) : (
          <>
            <dl className="grid">
              <dt>Settled</dt>
              <dd>
                <Amount units={rewards.totals.settled} testId="settled" />
              </dd>
              <dt>Claimed</dt>
              <dd>
                <Amount units={rewards.totals.claimed} testId="claimed" />
              </dd>
              <dt>Claimable</dt>
              <dd>
                <strong>
                  <Amount units={rewards.totals.claimable} testId="claimable" />
                </strong>
              </dd>
              <dt>Linked miners</dt>
              <dd data-testid="linked-miners">{rewards.miners.length}</dd>
            </dl>
            {rewards.epochs.length === 0 ? (
              <p className="hint" data-testid="no-epochs">
                Nothing settled to this address yet. An epoch is settled once the audits of its rounds are done; this page checks every few seconds.
              </p>
            ) : (
              <div className="scroll">
                <table className="epochs claim-epochs" data-testid="epochs">
                  <thead>
                    <tr>
                      <th>Epoch</th>
                      <th>Settled</th>
                      <th>Claimed</th>
                      <th>Claimable</th>
                      <th title="each settled amount's Merkle proof, checked in this page against the epoch's root">Proof</th>
                    </tr>
                  </thead>
                  <tbody>
                    {rewards.epochs.map((e) => {
                      const ok = verified.get(`${e.runId}:${e.epoch}`) ?? false;
                      return (
                        <tr key={`${e.runId}:${e.epoch}`} data-testid="epoch-row" data-epoch={e.epoch}>
                          <td>
                            {e.epoch} <span className="hint run">run {e.runId}</span>
                          </td>
                          <td>
                            <Amount units={e.settled} unit={false} />
                          </td>
                          <td>
                            <Amount units={e.claimed} unit={false} />
                          </td>
                          <td>
                            <Amount units={e.claimable} unit={false} />
                          </td>
                          <td data-testid="proof" data-verified={String(ok)} title={`root ${e.root}, ${e.proof.length} sibling hash${e.proof.length === 1 ? '' : 'es'}`} className={ok ? 'ok' : 'error'}>
                            {ok ? '✓ verified' : '✗ does not match the root'}
                          </td>
                        </tr>
                      );
                    })}
                  </tbody>
                </table>
                <p className="hint">
                  Proof: the amount and a few hashes from the coordinator recompute the epoch's published Merkle root, here in the page, so no one can show you one amount and settle another.
                </p>
              </div>
            )}
            {schedule && (
              <p className="hint" data-testid="next-settlement" data-epoch={schedule.nextSettlement.epoch}>
                Next to settle: epoch {schedule.nextSettlement.epoch}, not before {new Date(schedule.nextSettlement.notBefore).toLocaleString()}.{' '}
                {schedule.holdEpochs > 0
                  ? `Each epoch's earnings wait for the audits of the ${schedule.holdEpochs === 1 ? 'epoch' : `${schedule.holdEpochs} epochs`} after it: a miner caught cheating in that time earns nothing for it.`
                  : "Each epoch's earnings wait for the audits of its own rounds."}
              </p>
            )}
            {unverified.length > 0 && (
              <p className="error" data-testid="proof-warning">
                The coordinator's proof of epoch {unverified.map((e) => e.epoch).join(', ')} does not match its root: this page will not sign a claim for
                it.
              </p>
            )}
            <div className="controls">
              <button data-testid="claim" onClick={claim} disabled={busy || claimable === 0n || unverified.length > 0}>
                {busy ? 'Claiming…' : claimable > 0n ? `Claim ${tokens(claimable.toString(), 9)} reward token${claimable === BASE_UNITS_PER_TOKEN ? '' : 's'}` : 'Nothing to claim'}
              </button>
              <span className="hint">Your wallet signs a one-time message naming the amount and epochs.</span>
            </div>
          </>
        )}
        {error && (
          <p className="error" data-testid="claim-error">
            {error}
          </p>
        )}
      </section>
      {receipt && (
        <section className="card receipt" data-testid="receipt">
          <h2>Claimed</h2>
          <dl className="grid">
            <dt>Receipt</dt>
            <dd className="mono" data-testid="receipt-id">
              {String(receipt.id)}
            </dd>
            <dt>Amount</dt>
            <dd>
              <Amount units={receipt.amount} testId="receipt-amount" />
            </dd>
            <dt>Epochs</dt>
            <dd data-testid="receipt-epochs">{receipt.epochs.map((e) => `${e.epoch} (run ${e.runId})`).join(', ')}</dd>
            <dt>At</dt>
            <dd>{new Date(receipt.claimedAt).toLocaleString()}</dd>
            <dt>Payout</dt>
            <dd className="mono" data-testid="receipt-payout">
              {Object.entries(receipt.payout)
                .map(([k, v]) => `${k}: ${typeof v === 'string' ? v : JSON.stringify(v)}`)
                .join(', ')}
            </dd>
          </dl>
        </section>
      )}
      {claims.length > 0 && (
        <section className="card">
          <h2>Past claims</h2>
          <ul className="claims" data-testid="claims">
            {claims.map((c) => (
              <li key={String(c.id)}>
                {new Date(c.claimedAt).toLocaleString()}: <Amount units={c.amount} /> <span className="hint mono">receipt {short(String(c.id), 8)}</span>
              </li>
            ))}
          </ul>
        </section>
      )}
    </>
  );
}

export function RewardsPage() {
  const tab = useTabContext();
  const [connection, setConnection] = useState<WalletConnection>();
  const [connecting, setConnecting] = useState(false);
  const [address, setAddress] = useState<string | undefined>(() => localStorage.getItem(ACCOUNT_KEY) ?? undefined);
  const accounts = connection?.kind === 'connected' ? connection.accounts : [];
  const account = accounts.find((a) => a.address === address) ?? (accounts.length === 1 ? accounts[0] : undefined);
  const { rewards, claims, schedule, error, refresh } = useRewards(account?.address);

  const connect = useCallback(async () => {
    setConnecting(true);
    try {
      const result = await connectWallet();
      setConnection(result);
      if (result.kind === 'connected') localStorage.setItem(CONNECTED_KEY, '1');
    } finally {
      setConnecting(false);
    }
  }, []);
  // Connected once: connect again on load (the extension remembers that it allowed this page).
  useEffect(() => {
    if (localStorage.getItem(CONNECTED_KEY)) void connect();
  }, [connect]);

  const choose = (a: string): void => {
    setAddress(a);
    localStorage.setItem(ACCOUNT_KEY, a);
  };

  return (
    <main>
      <h1>Rewards</h1>
      <p className="lede">
        Every epoch the validator scores the miners and the ledger splits that epoch's emission. Link this tab to your wallet's account, check each
        settled amount against its epoch's Merkle root, and claim it with a signed, one-time message.
      </p>
      <WalletCard connection={connection} connecting={connecting} account={account} onConnect={() => void connect()} onChoose={choose} />
      <LinkCard tab={tab} account={account} walletConnected={connection?.kind === 'connected'} rewards={rewards} onLinked={refresh} />
      <TabKeyCard tab={tab} linked={!!(tab.identity && rewards?.miners.some((m) => sameMiner(m, tab.identity!.publicKey)))} />
      {account && <BalanceCard key={account.address} account={account} rewards={rewards} claims={claims} schedule={schedule} onClaimed={refresh} />}
      {error && (
        <p className="error" data-testid="rewards-error">
          {error}
        </p>
      )}
    </main>
  );
}
