import { lazy, Suspense } from 'react';
import { BrowserRouter, Link, NavLink, Outlet, Route, Routes, useMatch } from 'react-router';
import { TrainPage } from './TrainPage';
import { TabProvider, useTabContext } from './tab/TabContext';

// The wallet libraries (@polkadot/*) and the Merkle proofs load only when the Rewards page is opened;
// the chart and the live feed only when the Dashboard is.
const RewardsPage = lazy(() => import('./rewards/RewardsPage').then((m) => ({ default: m.RewardsPage })));
const DashboardPage = lazy(() => import('./dashboard/DashboardPage').then((m) => ({ default: m.DashboardPage })));
// The model in the tab (a worker of its own) only when Try it is opened.
const TryPage = lazy(() => import('./try/TryPage').then((m) => ({ default: m.TryPage })));

/** The pages' addresses: each can be bookmarked; the coordinator serves index.html for all of them. */
export const PATHS = { train: '/', rewards: '/rewards', dashboard: '/dashboard', try: '/try' } as const;

function Nav() {
  const tab = useTabContext();
  // A tab keeps training on every page: the Train link says how it is doing. Green only
  // while it trains; amber when it waits, stalls or cannot reach the coordinator.
  const s = tab.status;
  const active = tab.joined && !tab.paused;
  const ok = !s?.coordinator && (s?.phase === 'training' || s?.phase === 'merging');
  const title = s?.coordinator ? 'coordinator unreachable' : ok ? 'this tab is training' : `this tab is ${s?.phase ?? 'starting'}${s?.why ? `: ${s.why}` : ''}`;
  const wide = useMatch(PATHS.dashboard) !== null;
  return (
    <nav className={wide ? 'nav wide' : 'nav'} aria-label="Pages">
      <span className="brand">Train at Home</span>
      <NavLink to={PATHS.train} end data-testid="nav-train">
        Train{active && <span className={ok ? 'dot' : 'dot warn'} title={title} data-testid="nav-training" data-ok={String(ok)} />}
      </NavLink>
      <NavLink to={PATHS.rewards} data-testid="nav-rewards">
        Rewards
      </NavLink>
      <NavLink to={PATHS.dashboard} data-testid="nav-dashboard">
        Dashboard
      </NavLink>
      <NavLink to={PATHS.try} data-testid="nav-try">
        Try it
      </NavLink>
    </nav>
  );
}

function Layout() {
  return (
    <>
      <Nav />
      <Suspense fallback={<main className="loading">Loading…</main>}>
        <Outlet />
      </Suspense>
    </>
  );
}

function NotFound() {
  return (
    <main>
      <h1>Page not found</h1>
      <p className="lede">
        Nothing lives at this address. Go to <Link to={PATHS.train}>Train</Link>, <Link to={PATHS.dashboard}>Dashboard</Link> or <Link to={PATHS.rewards}>Rewards</Link>.
      </p>
    </main>
  );
}

export function App() {
  return (
    <TabProvider>
      <BrowserRouter>
        <Routes>
          <Route element={<Layout />}>
            <Route path={PATHS.train} element={<TrainPage />} />
            <Route path={PATHS.rewards} element={<RewardsPage />} />
            <Route path={PATHS.dashboard} element={<DashboardPage />} />
            <Route path={PATHS.try} element={<TryPage />} />
            <Route path="*" element={<NotFound />} />
          </Route>
        </Routes>
      </BrowserRouter>
    </TabProvider>
  );
}
