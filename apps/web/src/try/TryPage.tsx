import { useEffect, useRef, useState } from 'react';
import type { FromTryWorker, ToTryWorker } from './messages';

type Ready = Extract<FromTryWorker, { ev: 'ready' }>;
type TooLarge = Extract<FromTryWorker, { ev: 'too-large' }>;

const GiB = 1024 ** 3;
const formatBytes = (n: number): string => (n >= GiB ? `${(n / GiB).toFixed(1)} GiB` : `${Math.round(n / 1024 ** 2)} MiB`);

/**
 * "Try it": the model the swarm has trained so far, run in this tab. Every stage's latest agreed checkpoint is
 * loaded into one chain in a worker (try/worker.ts), and a prompt is continued token by token with a temperature
 * and a top-k, the text shown as it comes with its tokens per second. The note says which merge rounds the weights
 * are from and the held-out loss last measured. A model too large for this device's memory is not loaded: the
 * page says what it would need.
 */
export function TryPage() {
  const worker = useRef<Worker | undefined>(undefined);
  const [loading, setLoading] = useState<{ done: number; total: number; what: string }>();
  const [ready, setReady] = useState<Ready>();
  const [tooLarge, setTooLarge] = useState<TooLarge>();
  const [error, setError] = useState<string>();
  const [prompt, setPrompt] = useState('The people of the United States');
  const [temperature, setTemperature] = useState(0.8);
  const [topK, setTopK] = useState(40);
  const [maxTokens, setMaxTokens] = useState(60);
  const [output, setOutput] = useState<{ text: string; tokens: number; ms: number }>();
  const [busy, setBusy] = useState(false);

  useEffect(() => {
    const w = new Worker(new URL('./worker.ts', import.meta.url), { type: 'module' });
    worker.current = w;
    w.onmessage = (e: MessageEvent<FromTryWorker>) => {
      const m = e.data;
      if (m.ev === 'loading') setLoading(m);
      else if (m.ev === 'ready') (setReady(m), setLoading(undefined));
      else if (m.ev === 'too-large') (setTooLarge(m), setLoading(undefined));
      else if (m.ev === 'text') setOutput(m);
      else if (m.ev === 'done') setBusy(false);
      else (setError(m.message), setBusy(false), setLoading(undefined));
    };
    // The device's memory as the browser tells it (Chrome: navigator.deviceMemory, in GiB, at most 8); 4 GiB elsewhere.
    const memoryBytes = ((navigator as Navigator & { deviceMemory?: number }).deviceMemory ?? 4) * GiB;
    const load: ToTryWorker = { cmd: 'load', url: location.origin, memoryBytes };
    w.postMessage(load);
    return () => w.terminate();
  }, []);

  const go = (): void => {
    setError(undefined);
    setBusy(true);
    setOutput({ text: '', tokens: 0, ms: 0 });
    const m: ToTryWorker = { cmd: 'generate', prompt, temperature, topK, maxTokens, seed: Math.floor(Math.random() * 2 ** 31) };
    worker.current?.postMessage(m);
  };
  const rate = output && output.tokens > 0 && output.ms > 0 ? (output.tokens / output.ms) * 1000 : undefined;
  const rounds = ready ? [...new Set(ready.rounds)] : [];

  return (
    <main>
      <header>
        <h1>Try it</h1>
        <p className="lede">The model this run's swarm has trained so far, running in this tab: give it the start of a text and it goes on.</p>
      </header>
      <section className="card">
        {error && <p className="error" data-testid="try-error">{error}</p>}
        {loading && (
          <div className="progress" data-testid="try-loading">
            Loading the model: {loading.what}…
            <progress value={loading.done} max={loading.total} />
          </div>
        )}
        {tooLarge && (
          <p className="why" data-testid="try-too-large">
            This run's model ({tooLarge.preset}, {tooLarge.parameters.toLocaleString('en')} parameters) needs about {formatBytes(tooLarge.needBytes)} of memory to run in a tab; this
            device reports {formatBytes(tooLarge.haveBytes)}. Download it from the Dashboard and run it with onnxruntime or transformers.js on a machine with more memory.
          </p>
        )}
        {ready && (
          <p className="hint" data-testid="try-note">
            Weights of merge round{rounds.length === 1 ? ` ${rounds[0]}` : `s ${ready.rounds.join(', ')}`} of the {ready.stages} stages ({ready.preset},{' '}
            {ready.parameters.toLocaleString('en')} parameters, boundaries through {ready.codec} as in the run)
            {ready.heldOutLoss !== null && <>; held-out loss last measured {ready.heldOutLoss.toFixed(3)}</>}. Running on {ready.backend}.
          </p>
        )}
        <label className="prompt">
          Prompt
          <textarea data-testid="try-prompt" rows={3} value={prompt} onChange={(e) => setPrompt(e.target.value)} />
        </label>
        <div className="controls">
          <label>
            Temperature <input data-testid="try-temperature" type="number" min={0} max={2} step={0.1} value={temperature} onChange={(e) => setTemperature(Math.max(0, Number(e.target.value) || 0))} />
          </label>
          <label>
            Top-k <input data-testid="try-topk" type="number" min={0} max={4096} step={1} value={topK} onChange={(e) => setTopK(Math.max(0, Math.floor(Number(e.target.value) || 0)))} />
          </label>
          <label>
            Tokens <input data-testid="try-tokens" type="number" min={1} max={500} step={1} value={maxTokens} onChange={(e) => setMaxTokens(Math.min(500, Math.max(1, Math.floor(Number(e.target.value) || 1))))} />
          </label>
          <button data-testid="try-generate" onClick={go} disabled={!ready || busy || prompt.trim() === ''}>
            {busy ? 'Writing…' : 'Continue'}
          </button>
        </div>
        {output && (
          <figure className="sample latest">
            <blockquote data-testid="try-output">
              <strong>{prompt}</strong>
              {output.text}
            </blockquote>
            <figcaption className="hint" data-testid="try-rate">
              {output.tokens} tokens{rate !== undefined && <>, {rate.toFixed(1)} tokens/s</>}
              {temperature <= 0 ? ' · greedy' : ` · temperature ${temperature}${topK > 0 ? `, top-${topK}` : ''}`}
            </figcaption>
          </figure>
        )}
      </section>
    </main>
  );
}
