import type { DashboardSample } from '@train-at-home/protocol';
import { Link } from 'react-router';
import { useTabContext } from '../tab/TabContext';
import { IncentivesPanel } from './IncentivesPanel';
import { LossChart } from './LossChart';
import { SwarmPanel } from './SwarmPanel';
import { useDashboard } from './useDashboard';

function Sample({ sample, latest }: { sample: DashboardSample; latest?: boolean }) {
  return (
    <figure className={latest ? 'sample latest' : 'sample'} data-testid={latest ? 'sample' : undefined}>
      <blockquote>
        <strong>{sample.prompt}</strong>
        {sample.text}
      </blockquote>
      <figcaption className="hint">
        {new Set(sample.rounds).size === 1
          ? `every stage's weights of merge round ${sample.rounds[0]}`
          : `each stage's latest merged weights (${sample.rounds.map((r, s) => `stage ${s + 1}: round ${r}`).join(', ')})`}
        {sample.heldOutLoss !== null && <>, held-out loss {sample.heldOutLoss.toFixed(3)}</>} · {new Date(sample.at).toLocaleTimeString()}
      </figcaption>
    </figure>
  );
}

/**
 * The run, live, for anyone: loss over time or microbatches with the bigram
 * baseline, the swarm, the incentives, and what the model writes now.
 */
export function DashboardPage() {
  const { state, series } = useDashboard();
  // This browser tab's own miner, if it joined: the swarm marks it "you".
  const self = useTabContext().identity?.publicKey;
  const train = series.train_loss;
  const held = series.heldout_loss;
  const lastTrain = train.points[train.points.length - 1];
  const lastHeld = held.points[held.points.length - 1];
  return (
    <main className="wide">
      <header>
        <h1>Dashboard</h1>
        <p className="lede" data-testid="run-line">
          {state.run ? (
            <>
              Run <strong>{state.run.name}</strong>: {state.run.preset}, {state.run.stages} stages, boundary {state.run.bottleneck} wide, {state.run.codec}.{' '}
            </>
          ) : (
            'Reading the run… '
          )}
          <span className={`connection ${state.connection}`} data-testid="connection" data-state={state.connection}>
            {state.connection === 'live' ? '● live' : state.connection === 'reconnecting' ? '○ reconnecting…' : '○ connecting…'}
          </span>
        </p>
        {state.error && <p className="error">{state.error}</p>}
      </header>
      <section className="card">
        <h2>
          Loss{' '}
          <span className="hint">
            {lastTrain && <>train {lastTrain.value.toFixed(3)}</>}
            {lastHeld && <> · held-out {lastHeld.value.toFixed(3)}</>}
            {state.bigramLoss !== undefined && <> · bigram baseline {state.bigramLoss.toFixed(3)}</>}
          </span>
        </h2>
        <LossChart train={train} held={held} bigram={state.bigramLoss} version={state.version} outages={state.outage ? [state.outage] : []} />
      </section>
      <section className="card" data-testid="samples">
        <h2>What the model writes now</h2>
        {state.samples.length === 0 ? (
          <p className="hint">After the stages' next merge the validator assembles the model and writes a continuation of a fixed prompt here.</p>
        ) : (
          <>
            <Sample sample={state.samples[0]!} latest />
            {state.samples.slice(1, 4).map((s) => (
              <Sample key={s.id} sample={s} />
            ))}
            <p className="hint">
              <Link to="/try" data-testid="try-link">
                Try the model
              </Link>{' '}
              with a prompt of your own, in this tab, or{' '}
              <a href="/api/model" download data-testid="download-model">
                download it
              </a>{' '}
              from the latest round every stage agreed on: a folder with <code>model.safetensors</code>, an ONNX graph, the tokenizer and a model card, which
              onnxruntime and transformers.js load (<code>npm run export</code> writes the same).
            </p>
          </>
        )}
      </section>
      <SwarmPanel swarm={state.swarm} self={self} />
      <IncentivesPanel settledEpoch={state.settledEpoch} self={self} />
    </main>
  );
}
