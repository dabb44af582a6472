import { useEffect, useState } from 'react';
import { minerLabel, tokens } from '../format';

interface Leaderboard {
  epoch: number | null;
  minerCount: number;
  rows: Array<{ rank: number; miner: string; stage: number | null; work: number; quality: number; score: number; flagged: boolean; flagKinds: string[]; share: number }>;
}

interface Epochs {
  current: { epoch: number; endsAt: string };
  epochs: Array<{ epoch: number; emission: string; allocated: string; payoutCount: number; settledAt: string }>;
}

const unit = (x: unknown): number | undefined => (typeof x === 'number' && Number.isFinite(x) && x >= 0 && x <= 1 ? x : undefined);
const count = (x: unknown): number | undefined => (typeof x === 'number' && Number.isFinite(x) && x >= 0 && x <= 1e12 ? x : undefined);
const baseUnits = (x: unknown): string | undefined => (typeof x === 'string' && /^[0-9]{1,30}$/.test(x) ? x : undefined);

/**
 * The incentives of the run: each emission epoch's emission and payouts, and
 * the latest settled epoch's leaderboard (score = verified work × quality,
 * each miner's share, flags with their kinds). Read again when an epoch settles.
 */
export function IncentivesPanel({ settledEpoch, self }: { settledEpoch?: number; self?: string }) {
  const [board, setBoard] = useState<Leaderboard>();
  const [epochs, setEpochs] = useState<Epochs>();
  const [error, setError] = useState<string>();
  useEffect(() => {
    let stop = false;
    void (async () => {
      try {
        const [b, e] = await Promise.all([fetch('/api/leaderboard?limit=50').then((r) => r.json()), fetch('/api/epochs?limit=10').then((r) => r.json())]);
        if (!stop) {
          setBoard(b as Leaderboard);
          setEpochs(e as Epochs);
          setError(undefined);
        }
      } catch (err) {
        if (!stop) setError((err as Error).message);
      }
    })();
    return () => {
      stop = true;
    };
  }, [settledEpoch]);

  return (
    <section className="card" data-testid="incentives">
      <h2>Incentives</h2>
      {error && <p className="error">{error}</p>}
      {epochs && epochs.epochs.length === 0 && (
        <p data-testid="no-settlement">
          No emission epoch has settled yet. Epoch {epochs.current.epoch} ends at {new Date(epochs.current.endsAt).toLocaleTimeString()}; the validator then
          scores every miner's verified work and splits the epoch's emission.
        </p>
      )}
      {board && board.rows.length > 0 && (
        <>
          <h3>Leaderboard, epoch {board.epoch}</h3>
          <div className="scroll">
            <table className="leaderboard" data-testid="leaderboard">
              <thead>
                <tr>
                  <th>#</th>
                  <th>miner</th>
                  <th>stage</th>
                  <th>work</th>
                  <th>quality</th>
                  <th>share</th>
                  <th>flags</th>
                </tr>
              </thead>
              <tbody>
                {board.rows.map((r) => (
                  <tr key={r.miner} data-testid="leader" className={r.flagged ? 'flagged' : ''} data-you={String(self !== undefined && minerLabel(self) === minerLabel(r.miner))}>
                    <td>{r.rank}</td>
                    <td className="mono" title={r.miner}>
                      {minerLabel(r.miner)}
                      {self !== undefined && minerLabel(self) === minerLabel(r.miner) && <span className="badge">you</span>}
                    </td>
                    <td>{r.stage !== null ? r.stage + 1 : '—'}</td>
                    <td className="amount">{count(r.work) ?? '—'}</td>
                    <td className="amount">{unit(r.quality)?.toFixed(2) ?? '—'}</td>
                    <td className="amount">{unit(r.share) !== undefined ? `${(r.share * 100).toFixed(1)}%` : '—'}</td>
                    <td>{r.flagged ? (r.flagKinds.length ? r.flagKinds.join(', ') : 'flagged') : ''}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        </>
      )}
      {epochs && epochs.epochs.length > 0 && (
        <>
          <h3>Emission per epoch</h3>
          <div className="scroll">
            <table className="epochs" data-testid="emissions">
              <thead>
                <tr>
                  <th>epoch</th>
                  <th>emission (reward tokens)</th>
                  <th>paid</th>
                  <th>payouts</th>
                </tr>
              </thead>
              <tbody>
                {epochs.epochs.map((e) => (
                  <tr key={e.epoch}>
                    <td>{e.epoch}</td>
                    <td className="amount">{baseUnits(e.emission) ? tokens(e.emission) : '—'}</td>
                    <td className="amount">{baseUnits(e.allocated) ? tokens(e.allocated) : '—'}</td>
                    <td>{count(e.payoutCount) ?? '—'}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        </>
      )}
    </section>
  );
}
