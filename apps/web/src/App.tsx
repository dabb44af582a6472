import { lazy, Suspense } from 'react';
import { BrowserRouter, Link, NavLink, Outlet, Route, Routes } from 'react-router';
import { TrainPage } from './TrainPage';
import { TabProvider, useTabContext } from './tab/TabContext';

// The wallet libraries (@polkadot/*) and the Merkle proofs load only when the Rewards page is opened;
// the chart and the live feed only when the Dashboard is.
const RewardsPage = lazy(() => import('./rewards/RewardsPage').then((m) => ({ default: m.RewardsPage })));
const DashboardPage = lazy(() => import('./dashboard/DashboardPage').then((m) => ({ default: m.DashboardPage })));

/** The pages' addresses: each can be bookmarked; the coordinator serves index.html for all of them. */
export const PATHS = { train: '/', rewards: '/rewards', dashboard: '/dashboard' } as const;

function Nav() {
  const tab = useTabContext();
  // A tab keeps training on every page: the Train link says so.
  const training = tab.joined && !tab.paused;
  return (
    <nav className="nav" aria-label="Pages">
      <span className="brand">Train at Home</span>
      <NavLink to={PATHS.train} end data-testid="nav-train">
        Train{training && <span className="dot" title="this tab is training" data-testid="nav-training" />}
      </NavLink>
      <NavLink to={PATHS.rewards} data-testid="nav-rewards">
        Rewards
      </NavLink>
      <NavLink to={PATHS.dashboard} data-testid="nav-dashboard">
        Dashboard
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
            <Route path="*" element={<NotFound />} />
          </Route>
        </Routes>
      </BrowserRouter>
    </TabProvider>
  );
}
