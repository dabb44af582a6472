/** A placeholder: the route exists (and can be bookmarked) before the dashboard does. */
export function DashboardPage() {
  return (
    <main>
      <h1>Dashboard</h1>
      <section className="card" data-testid="dashboard-placeholder">
        <p>
          Coming soon: the run as a whole — training and held-out loss, stages and miners, throughput, compression, merges, the leaderboard and
          samples of what the model writes.
        </p>
        <p>
          Until then, the coordinator's JSON is open: <a href="/api/status">/api/status</a>, <a href="/api/metrics">/api/metrics</a>,{' '}
          <a href="/api/leaderboard">/api/leaderboard</a>.
        </p>
      </section>
    </main>
  );
}
