import { useEffect, useState } from 'react';
import { bytes, flops, minerLabel, pathLabel, rewardTokens, totalPerToken, trafficByKind } from './format';
import { useTabContext } from './tab/TabContext';
import type { TabStatus } from './tab/messages';
import type { TabState } from './tab/useTab';

const PHASE_TEXT: Record<string, string> = {
  registering: 'Joining the run',
  downloading: 'Downloading',
  waiting: 'Waiting',
  training: 'Training',
  merging: 'Merging weights',
  idle: 'Stalled',
  stopped: 'Stopped',
};

const miners = (n: number): string => (n === 1 ? '1 miner' : `${n} miners`);

/** The phase in words; a merge says with whom (a stage's lone miner only sends its weights as the stage's checkpoint). */
function phaseText(s: TabState['status']): string {
  // Training with nothing trained yet: the first microbatch is under way, and the page says so.
  if (s?.phase === 'training' && s.microbatches === 0) return 'Starting: the first microbatch is under way';
  // Joins are coming faster than the coordinator takes them: this tab waits its turn, and is told where it stands.
  if (s?.phase === 'registering' && s.queued) {
    const { position, estimateMs } = s.queued;
    return `Waiting to join: ${position === 1 ? 'next in line' : `${position - 1} ahead of this tab`}, about ${Math.max(1, Math.ceil(estimateMs / 1000))} s`;
  }
  if (s?.phase === 'merging') {
    const others = s.peers.replicas.length;
    return others === 0 ? 'Saving this stage\'s weights (no other miner on the stage to merge with)' : `Averaging weights with the ${others === 1 ? 'other miner' : `${others} other miners`} on this stage`;
  }
  return PHASE_TEXT[s?.phase ?? 'registering'] ?? String(s?.phase);
}

function Progress({ label, done, total }: { label: string; done: number; total: number }) {
  const pct = total > 0 ? Math.min(100, (done / total) * 100) : 0;
  return (
    <div className="progress" data-testid="progress">
      <div className="progress-label">
        {label}: {total > 0 ? `${pct.toFixed(0)}%` : bytes(done)}
      </div>
      <progress max={100} value={pct} />
    </div>
  );
}

/** The run as the coordinator reports it: its name, model, miners, latest held-out loss, and whether it starts miners of its own. */
function useRun(): { name?: string; preset?: string; stages?: number; miners?: number; emptyStages?: number[]; heldOut?: number; localMiners?: number } {
  const [run, setRun] = useState<ReturnType<typeof useRun>>({});
  useEffect(() => {
    let stop = false;
    const poll = async (): Promise<void> => {
      try {
        const status = await fetch('/api/status').then((r) => r.json());
        const heldOut = typeof status.heldOutLoss === 'number' ? status.heldOutLoss : undefined;
        if (!stop) setRun({ name: status.run?.name, preset: status.run?.preset, stages: status.run?.stages, miners: status.activeMiners, emptyStages: status.emptyStages, heldOut, localMiners: status.localMiners?.max });
      } catch {
        // the coordinator is away; the tab keeps training and the worker reconnects
      }
      if (!stop) setTimeout(poll, 5000);
    };
    void poll();
    return () => {
      stop = true;
    };
  }, []);
  return run;
}

interface Earnings {
  earned: string;
  epochs: number;
  flag?: string;
}

/** This tab's earnings from the ledger (GET /api/miners/:id/score), every 10 s once it has registered. */
function useEarnings(minerId: string | undefined): Earnings | undefined {
  const [earnings, setEarnings] = useState<Earnings>();
  useEffect(() => {
    setEarnings(undefined);
    if (!minerId) return;
    let stop = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const poll = async (): Promise<void> => {
      try {
        const res = await fetch(`/api/miners/${minerId}/score?limit=1`);
        if (res.ok) {
          const body = (await res.json()) as { totals: { earned: string; epochs: number }; epochs: Array<{ flagged: boolean }>; flags: Array<{ reason: string }> };
          const flagged = body.epochs[0]?.flagged ?? body.flags.length > 0;
          if (!stop) setEarnings({ earned: body.totals.earned, epochs: body.totals.epochs, flag: flagged ? body.flags[0]?.reason : undefined });
        } else if (res.status === 404 && ((await res.json()) as { error?: string }).error === 'NO_SUCH_MINER' && !stop) {
          setEarnings({ earned: '0', epochs: 0 }); // registered a moment ago: nothing settled yet
        }
      } catch {
        // the coordinator is away; try again at the next poll
      }
      if (!stop) timer = setTimeout(poll, 10_000);
    };
    void poll();
    return () => {
      stop = true;
      clearTimeout(timer);
    };
  }, [minerId]);
  return earnings;
}

const list = (xs: string[]): string => (xs.length <= 1 ? (xs[0] ?? '') : `${xs.slice(0, -1).join(', ')} and ${xs[xs.length - 1]}`);

/**
 * A tab that waits because stages have nobody: how many more participants the
 * run needs, and how to add them (or that the coordinator is starting its own).
 */
function WaitingHelp({ empty, stages, localMiners }: { empty: number[]; stages: number; localMiners?: number }) {
  const origin = window.location.origin;
  const n = empty.length;
  return (
    <div className="waiting-help card" data-testid="waiting-help" data-needed={n}>
      <p>
        This run has {stages} stages and {n === 1 ? 'one has' : `${n} have`} nobody yet (stage{n === 1 ? '' : 's'} {list(empty.map((i) => String(i + 1)))}):{' '}
        <strong>
          {n} more participant{n === 1 ? ' is' : 's are'} needed
        </strong>{' '}
        before it can train.
      </p>
      {localMiners !== undefined && localMiners > 0 && <p>This coordinator starts miners of its own for empty stages; they join in a few seconds.</p>}
      <p>
        To add one yourself, open <a href={origin}>{origin}</a> in another tab or on another computer and press Join, or run{' '}
        <code>npm run miner -- --coordinator {origin}</code> in a checkout of Train at Home.
      </p>
    </div>
  );
}

function Status({ tab, run }: { tab: TabState; run: ReturnType<typeof useRun> }) {
  const s = tab.status;
  const earnings = useEarnings(s?.minerId);
  const phase = s?.phase ?? (tab.probing || !tab.probe ? 'probing' : 'registering');
  const lost = s?.coordinator;
  const stage = s?.stage;
  const saved = s && s.uncompressedBytes > 0 ? 1 - (s.bytesSent + s.bytesReceived) / s.uncompressedBytes : undefined;
  // Stages nobody holds, as the coordinator last said (polled), less those this tab knows are held: its own, and its
  // neighbours' where it has peers there (the poll can be seconds older than the tab's own stage map).
  const empty = (run.emptyStages ?? []).filter(
    (e) => stage === undefined || !(e === stage || (e === stage - 1 && s!.peers.previous.length > 0) || (e === stage + 1 && s!.peers.next.length > 0)),
  );
  return (
    <section className="card">
      <h2>
        This tab: <span data-testid="phase" data-phase={phase} data-queued={s?.queued?.position}>{phase === 'probing' ? 'Measuring this device' : s ? phaseText(s) : PHASE_TEXT[phase]}</span>
        {lost && (
          <span data-testid="phase-outage">
            {' '}
            — coordinator unreachable, retrying {lost.retryInMs < 500 ? 'now' : `in ${Math.ceil(lost.retryInMs / 1000)} s`}
          </span>
        )}
      </h2>
      {lost && (
        <p className="why fault" data-testid="coordinator" data-state="unreachable">
          Coordinator unreachable — retrying {lost.retryInMs < 500 ? 'now' : `in ${Math.ceil(lost.retryInMs / 1000)} s`} (lost {Math.round(lost.sinceMs / 1000)} s ago
          {lost.error ? `: ${lost.error}` : ''}). Peers stay connected; training goes on where it can.
        </p>
      )}
      {s?.why && !(lost && s.why.startsWith('coordinator unreachable')) && <p className="why" data-testid="why">{s.why}</p>}
      {s?.note && (
        <p className="hint" data-testid="note">
          {s.note}
        </p>
      )}
      {s?.phase === 'waiting' && empty.length > 0 && s.stages !== undefined && <WaitingHelp empty={empty} stages={s.stages} localMiners={run.localMiners} />}
      {tab.probing && <Progress label={`Trying ${tab.probing.backend}`} done={tab.probing.done} total={tab.probing.total} />}
      {s?.progress && <Progress {...s.progress} />}
      <dl className="grid">
        <dt>Miner</dt>
        <dd className="mono" data-testid="miner-id" title={tab.identity?.publicKey}>
          {tab.identity ? minerLabel(tab.identity.publicKey) : '—'}
        </dd>
        <dt>Stage</dt>
        <dd data-testid="stage">{stage !== undefined ? `${stage + 1} of ${s!.stages}` : '—'}</dd>
        <dt>Peers</dt>
        <dd data-testid="peers">
          {s && stage !== undefined
            ? [
                stage > 0 ? `${miners(s.peers.previous.length)} on stage ${stage}` : undefined,
                `${s.peers.replicas.length === 0 ? 'no other miner' : `${miners(s.peers.replicas.length).replace('miner', 'other miner')}`} on stage ${stage + 1}`,
                s.stages !== undefined && stage < s.stages - 1 ? `${miners(s.peers.next.length)} on stage ${stage + 2}` : undefined,
              ]
                .filter(Boolean)
                .join(', ')
            : '—'}
        </dd>
        <dt>Microbatches</dt>
        <dd data-testid="microbatches">{s?.microbatches ?? 0}</dd>
        <dt>Training tokens/s</dt>
        <dd data-testid="tokens-per-sec">
          {s ? s.tokensPerSec.toFixed(0) : '—'}
          {s?.tflops !== undefined && s.tokensPerSec > 0 && (
            <span className="hint" data-testid="tflops" data-value={s.tflops} title="6 floating-point operations per parameter of this stage per token">
              {' '}
              · {flops(s.tflops)}
            </span>
          )}
          {s?.busyShare !== undefined && s.phase === 'training' && (
            <span className="hint" data-testid="busy">
              {' '}
              · computing {(s.busyShare * 100).toFixed(0)}% of the time
            </span>
          )}
        </dd>
        <dt>Paths</dt>
        <dd data-testid="paths">
          {tab.paths?.length ? (
            <ul className="paths">
              {tab.paths.map(([id, p]) => (
                <li key={id} data-testid="path" data-path={p.path} data-peer={id}>
                  <span className="mono">{minerLabel(id)}</span> {roleOf(s, id)}: {pathLabel(p.path, p.relayProtocol)} · {bytes(p.bytesSent)} sent, {bytes(p.bytesReceived)} received
                </li>
              ))}
            </ul>
          ) : (
            '—'
          )}
        </dd>
        <dt>Sent / received</dt>
        <dd data-testid="traffic">
          {s ? `${bytes(s.bytesSent)} / ${bytes(s.bytesReceived)} between stages` : '—'}
          {s && totalPerToken(s.traffic, s.trainedTokens) && <span className="hint"> · all traffic: {totalPerToken(s.traffic, s.trainedTokens)} trained</span>}
          {s && (
            <ul className="paths" data-testid="traffic-kinds">
              {trafficByKind(s.traffic, s.trainedTokens).map(({ kind, text }) => (
                <li key={kind} data-kind={kind}>
                  {text}
                </li>
              ))}
            </ul>
          )}
        </dd>
        <dt>Compression</dt>
        <dd data-testid="saved" data-ratio={saved !== undefined ? (s!.uncompressedBytes / (s!.bytesSent + s!.bytesReceived)).toFixed(2) : undefined}>
          {saved !== undefined
            ? `${(s!.uncompressedBytes / (s!.bytesSent + s!.bytesReceived)).toFixed(1)}× fewer bytes than fp32: ${(saved * 100).toFixed(1)}% of ${bytes(s!.uncompressedBytes)} saved`
            : '—'}
        </dd>
        <dt>Loss</dt>
        <dd data-testid="loss">{s?.lastLoss !== undefined ? s.lastLoss.toFixed(3) : s?.stage !== undefined && s.stages !== undefined && s.stage < s.stages - 1 ? 'computed by the last stage' : '—'}</dd>
        <dt>Started from</dt>
        <dd data-testid="resumed">{s?.resumedFrom ? `checkpoint ${s.resumedFrom.slice(0, 12)}…` : s?.stage !== undefined ? 'the run\'s initial weights' : '—'}</dd>
        <dt>Merges</dt>
        <dd data-testid="merges">{s?.merges ?? 0}</dd>
        <dt>Earnings</dt>
        <dd data-testid="earnings" title={earnings ? `${earnings.earned} base units` : undefined}>
          {earnings
            ? `${rewardTokens(earnings.earned)} over ${earnings.epochs} settled epoch${earnings.epochs === 1 ? '' : 's'}${earnings.flag ? ` — flagged: ${earnings.flag}` : ''}`
            : '—'}
        </dd>
      </dl>
    </section>
  );
}

function Backend({ tab }: { tab: TabState }) {
  if (!tab.probe) return null;
  return (
    <section className="card">
      <h2>
        Compute: <span data-testid="backend">{tab.status?.backend ?? tab.probe.chosen}</span>
      </h2>
      <p data-testid="backend-why">{tab.probe.why}</p>
      <table>
        <tbody>
          {tab.probe.results.map((r) => (
            <tr key={r.backend}>
              <td>{r.backend}</td>
              <td>{r.ms !== undefined ? `${r.ms.toFixed(0)} ms` : r.error}</td>
              <td>{r.fallbackAdapter ? 'software adapter' : ''}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {tab.kernelCheck && (
        <p data-testid="kernel-check" data-ok={String(!!tab.kernelCheck.result?.ok)}>
          WGSL int8 codec kernel:{' '}
          {tab.kernelCheck.result
            ? `${tab.kernelCheck.result.framesEqual ? 'frames byte-identical to' : 'frames differ from'} the WASM path (scales ${tab.kernelCheck.result.scalesEqual ? 'equal' : 'differ'}, largest int8 difference ${tab.kernelCheck.result.maxValueDiff}), ${tab.kernelCheck.result.ms.toFixed(0)} ms`
            : `not available (${tab.kernelCheck.error})`}
        </p>
      )}
      {tab.kernelCheck?.result?.optimizer && (
        <p data-testid="optimizer-check" data-ok={String(tab.kernelCheck.result.optimizer.ok)}>
          WGSL fused optimizer:{' '}
          {`${tab.kernelCheck.result.optimizer.ok ? 'in use, agrees with' : 'not used, differs from'} the WASM arithmetic (largest relative difference ${tab.kernelCheck.result.optimizer.maxRelativeDiff.toExponential(1)}, tolerance ${tab.kernelCheck.result.optimizer.tolerance.toExponential(0)}), ${tab.kernelCheck.result.optimizer.ms.toFixed(0)} ms`}
        </p>
      )}
      {(
        [
          ['layerNorm', 'layer-norm', 'WGSL fused layer norm'],
          ['gelu', 'gelu', 'WGSL fused GELU'],
          ['matMul', 'matmul', 'Matmuls without transposes'],
          ['attention', 'attention', 'WGSL fused attention'],
          ['addLayerNorm', 'add-layer-norm', 'WGSL fused residual add and layer norm'],
        ] as const
      ).map(([op, id, label]) => {
        const check = tab.kernelCheck?.result?.[op];
        return (
          check && (
            <p key={op} data-testid={`${id}-check`} data-ok={String(check.ok)}>
              {`${label}: ${check.ok ? 'in use, agrees with' : 'not used, differs from'} tfjs's own ops, forward and backward (largest relative difference ${check.maxRelativeDiff.toExponential(1)}, tolerance ${check.tolerance.toExponential(0)}), ${check.ms.toFixed(0)} ms`}
            </p>
          )
        );
      })}
    </section>
  );
}

export function TrainPage() {
  const tab = useTabContext();
  // For drills and tests: lose the GPU device as a driver reset would.
  (window as unknown as { trainAtHome?: object }).trainAtHome = { loseDevice: tab.loseDevice };
  const run = useRun();
  const [cap, setCap] = useState('');
  return (
    <main>
      <header>
        <h1>Train at Home</h1>
        <p className="lede">
          Lend this tab to a language model that thousands of people train together. Press Join: the tab measures your device, takes a slice of the
          model and trains it with its peers. No install, no account.
        </p>
      </header>
      <section className="card run" data-testid="run">
        Run <strong>{run.name ?? '…'}</strong> ({run.preset ?? '…'}, {run.stages ?? '…'} stages), {run.miners ?? '…'} miners active, held-out loss{' '}
        <strong data-testid="heldout">{run.heldOut !== undefined ? run.heldOut.toFixed(3) : '—'}</strong>
      </section>
      <section className="controls">
        {!tab.joined && (
          <button data-testid="join" onClick={tab.join}>
            Join
          </button>
        )}
        {tab.joined && !tab.paused && (
          <button data-testid="pause" onClick={tab.pause}>
            Pause
          </button>
        )}
        {tab.joined && tab.paused && (
          <button data-testid="resume" onClick={tab.resume}>
            Resume
          </button>
        )}
        {tab.joined && (
          <button data-testid="leave" onClick={tab.leave}>
            Leave
          </button>
        )}
        <label>
          Upload cap (MB/s){' '}
          <input
            data-testid="upload-cap"
            type="number"
            min={0}
            step={0.1}
            placeholder="none"
            value={cap}
            onChange={(e) => {
              setCap(e.target.value);
              tab.setUploadCap(Number(e.target.value) || 0);
            }}
          />
        </label>
      </section>
      {tab.error && (
        <p className="error" data-testid="error">
          {tab.error}
        </p>
      )}
      {tab.joined && <Status tab={tab} run={run} />}
      <Backend tab={tab} />
      {tab.notices.length > 0 && (
        <section className="card log">
          {tab.notices.map((n, i) => (
            <div key={i}>{n}</div>
          ))}
        </section>
      )}
    </main>
  );
}

/** Which of this tab's neighbours a peer is, for the paths list. */
function roleOf(s: TabStatus | undefined, id: string): string {
  if (!s || s.stage === undefined) return '';
  if (s.peers.replicas.includes(id)) return `(replica, stage ${s.stage + 1})`;
  if (s.peers.previous.includes(id)) return `(stage ${s.stage})`;
  if (s.peers.next.includes(id)) return `(stage ${s.stage + 2})`;
  return '';
}
