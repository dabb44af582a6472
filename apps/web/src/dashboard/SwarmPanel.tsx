import { trafficBytes, type DashboardSwarm } from '@train-at-home/protocol';
import { Fragment } from 'react';
import { bytes, minerLabel, pathsSummary, totalPerToken, trafficByKind } from '../format';

const rate = (n: number, unit: string): string => `${n < 10 ? n.toFixed(1) : n.toFixed(0)} ${unit}/s`;
const seconds = (ms: number | null): string => (ms === null ? 'running' : `${(ms / 1000).toFixed(1)} s`);

const sameMiner = (a: string, b: string): boolean => a.replace(/^0x/i, '').toLowerCase() === b.replace(/^0x/i, '').toLowerCase();

/**
 * Stages with their miners (backend, tokens/s, state and why, how they reach their peers), traffic between stages, bytes, merges.
 * `self` is this tab's miner id, when it has joined: its row says "you".
 */
export function SwarmPanel({ swarm, self }: { swarm?: DashboardSwarm; self?: string }) {
  if (!swarm) return <section className="card">Reading the swarm…</section>;
  const { traffic } = swarm;
  const ratio = traffic.bytes > 0 ? traffic.uncompressedBytes / traffic.bytes : undefined;
  const miners = swarm.stages.reduce((n, s) => n + s.miners.length, 0);
  return (
    <section className="card" data-testid="swarm">
      <h2>
        The swarm: {miners} miner{miners === 1 ? '' : 's'} over {swarm.stages.length} stages
      </h2>
      <div className="stages">
        {swarm.stages.map((s) => (
          <div className="stage" key={s.stage} data-testid={`stage-${s.stage}`}>
            <h3>
              Stage {s.stage + 1} <span className="hint">{s.phase === 'merging' ? `merging round ${s.round}` : `round ${s.round}`}</span>
            </h3>
            {trafficByKind(s.traffic.kinds, s.traffic.tokens).length > 0 && (
              <p className="hint" data-testid="stage-traffic" title="what this stage's miners say they sent and received since they started, per token they trained">
                {totalPerToken(s.traffic.kinds, s.traffic.tokens) ?? bytes(trafficBytes(s.traffic.kinds))} in all:{' '}
                {trafficByKind(s.traffic.kinds, s.traffic.tokens)
                  .map((t) => t.text)
                  .join(' · ')}
              </p>
            )}
            {s.miners.length === 0 ? (
              <p className="why">Nobody holds this stage: the pipeline waits for a miner.</p>
            ) : (
              <div className="scroll">
                <table className="miners">
                  <thead>
                    <tr>
                      <th>miner</th>
                      <th>backend</th>
                      <th>tokens/s</th>
                      <th>state</th>
                      <th title="how this miner reaches its peers: directly, through the operator's TURN server, or through the coordinator (its own word)">peers</th>
                    </tr>
                  </thead>
                  <tbody>
                    {s.miners.map((m) => {
                      const you = self !== undefined && sameMiner(m.id, self);
                      return (
                        <Fragment key={m.id}>
                          <tr data-testid="miner" data-state={m.state} data-you={String(you)} className={you ? 'you' : undefined}>
                            <td className="mono" title={m.id}>
                              {minerLabel(m.id)}
                              {you && (
                                <span className="badge" data-testid="you" title="the miner of this browser tab">
                                  you
                                </span>
                              )}
                            </td>
                            <td>{m.backend}</td>
                            <td className="amount">{m.tokensPerSec !== undefined ? m.tokensPerSec.toFixed(0) : '—'}</td>
                            <td>{m.state}</td>
                            <td className="hint" data-testid="paths">
                              {pathsSummary(m.paths)}
                            </td>
                          </tr>
                          {/* Why, on a row of its own across the table: a long reason would wrap into a narrow column. */}
                          {m.why && (
                            <tr className="why-row">
                              <td colSpan={5} className="hint">
                                {m.why}
                              </td>
                            </tr>
                          )}
                        </Fragment>
                      );
                    })}
                  </tbody>
                </table>
              </div>
            )}
          </div>
        ))}
      </div>
      <h3>Between stages</h3>
      <ul className="boundaries">
        {swarm.boundaries.map((b) => (
          <li key={b.from} data-testid="boundary">
            Stage {b.from + 1} → stage {b.to + 1}: {rate(b.activationsPerSec, 'microbatches')} forward, {rate(b.gradientsPerSec, 'gradients')} back, {bytes(Math.round(b.bytesPerSec))}/s
            {b.activationsPerSec === 0 && b.gradientsPerSec === 0 && <span className="hint"> (nothing crossed it in the last 10 s)</span>}
          </li>
        ))}
      </ul>
      <dl className="grid">
        <dt>Sent between miners</dt>
        <dd data-testid="bytes-sent">{bytes(traffic.bytes)}</dd>
        <dt>Saved by compression</dt>
        <dd data-testid="bytes-saved">
          {ratio !== undefined ? `${bytes(traffic.savedBytes)} (${ratio.toFixed(1)}× fewer bytes than fp32)` : '—'}
        </dd>
        <dt>Peer to peer / relayed</dt>
        <dd data-testid="relayed">
          {bytes(Math.max(0, traffic.bytes - traffic.relayedBytes))} / {bytes(traffic.relayedBytes)} (signaling {bytes(traffic.signalBytes)})
        </dd>
      </dl>
      <h3>Merge rounds</h3>
      {swarm.merges.length === 0 ? (
        <p className="hint">No stage has merged yet.</p>
      ) : (
        <div className="scroll">
          <table className="merges" data-testid="merges">
            <thead>
              <tr>
                <th>stage</th>
                <th>round</th>
                <th>mode</th>
                <th title="how many of the stage's replicas took part (a lone replica's round saves its weights)">replicas merged</th>
                <th>took</th>
              </tr>
            </thead>
            <tbody>
              {swarm.merges.map((m) => (
                <tr key={`${m.stage}:${m.round}`}>
                  <td>{m.stage + 1}</td>
                  <td>{m.round}</td>
                  <td>{m.mode ?? '—'}</td>
                  <td>{m.participants === 0 ? 'none: nobody was ready' : m.participants === 1 ? '1 (saved alone)' : m.participants}</td>
                  <td>{seconds(m.durationMs)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
