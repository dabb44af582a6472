import { createContext, useContext, type ReactNode } from 'react';
import { useTab, type Tab } from './useTab';

const TabContext = createContext<Tab | undefined>(undefined);

/**
 * One miner per tab, owned above the router: moving between pages (Train,
 * Rewards, Dashboard) keeps the worker training, and the Rewards page can ask
 * the same miner identity to sign its payout link.
 */
export function TabProvider({ children }: { children: ReactNode }) {
  return <TabContext.Provider value={useTab()}>{children}</TabContext.Provider>;
}

export function useTabContext(): Tab {
  const tab = useContext(TabContext);
  if (!tab) throw new Error('useTabContext needs a <TabProvider> above it');
  return tab;
}
