import { useCallback, useEffect, useRef, useState } from 'react';
import type { ClaimReceipt } from '@train-at-home/swarm';
import { describeError, rewardsApi, type Rewards, type Schedule } from './api';

/** How often the page reads a balance: epochs settle in the background. */
const POLL_MS = 5000;

/** The address's balance and past claims, read now and every POLL_MS. */
export function useRewards(address: string | undefined): { rewards?: Rewards; claims: ClaimReceipt[]; schedule?: Schedule; error?: string; refresh(): Promise<void> } {
  const [state, setState] = useState<{ rewards?: Rewards; claims: ClaimReceipt[]; schedule?: Schedule; error?: string }>({ claims: [] });
  const current = useRef(address);
  current.current = address;
  const refresh = useCallback(async () => {
    if (!address) return;
    try {
      const [rewards, { claims }, schedule] = await Promise.all([rewardsApi.rewards(address), rewardsApi.claims(address), rewardsApi.schedule()]);
      if (current.current === address) setState({ rewards, claims, schedule });
    } catch (e) {
      if (current.current === address) setState((s) => ({ ...s, error: `Could not read the balance: ${describeError(e)}` }));
    }
  }, [address]);
  useEffect(() => {
    setState({ claims: [] });
    if (!address) return;
    let stop = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const poll = async (): Promise<void> => {
      await refresh();
      if (!stop) timer = setTimeout(poll, POLL_MS);
    };
    void poll();
    return () => {
      stop = true;
      clearTimeout(timer);
    };
  }, [address, refresh]);
  return { ...state, refresh };
}

