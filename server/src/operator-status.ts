import { networkInterfaces } from 'node:os';
import { PRESETS } from '@train-at-home/model';
import type { App } from './app';
import { epochAt } from './ledger/epochs';
import { runStartMs } from './ledger/queries';

/**
 * What the coordinator's command line tells its operator in words (main.ts), beside the JSON log: where to open the
 * run, and one status line a minute.
 */

/** The addresses a person opens: localhost, and this machine's network addresses when it listens on all of them. */
export function openUrls(host: string, port: number, scheme: 'http' | 'https' = 'http'): { local: string; network: string[] } {
  const all = host === '0.0.0.0' || host === '::';
  const network = all
    ? Object.values(networkInterfaces())
        .flat()
        .filter((a) => a && a.family === 'IPv4' && !a.internal)
        .map((a) => `${scheme}://${a!.address}:${port}`)
    : [];
  return { local: `${scheme}://${all ? 'localhost' : host}:${port}`, network };
}

/** The start-up lines: the run, the address to open, the dashboard's, and what other machines can open. */
export function startupLines(app: App, host: string, port: number, statusSeconds: number, scheme: 'http' | 'https' = 'http'): string[] {
  const { run } = app.coordinator;
  const { local, network } = openUrls(host, port, scheme);
  const lines = [
    `Train at Home: run "${run.name}" (${run.preset}, ${run.stages} stages) is up.`,
    `  Open ${local} in a browser and press Join to train; the dashboard is ${local}/dashboard.`,
  ];
  if (network.length)
    lines.push(
      `  From other machines: ${network.join(', ')}${scheme === 'https' ? '' : ' (browsers give WebGPU only to https or localhost: there a tab trains on WASM; --tls-cert and --tls-key serve https)'}.`,
    );
  lines.push(`  ${statusSeconds > 0 ? `A status line follows every ${span(statusSeconds * 1000)}; ` : ''}Ctrl-C stops the coordinator.`);
  return lines;
}

/** A status line's window in words: "minute", "10 s", "5 minutes". */
const span = (ms: number): string => (ms === 60_000 ? 'minute' : ms % 60_000 === 0 ? `${ms / 60_000} minutes` : `${Math.round(ms / 1000)} s`);

/**
 * One line on the run now: miners per stage, what the last minute trained (microbatches, tokens/s, mean loss), the
 * emission epoch and the last settled, and anything failing (miners flagged in the last minute, the validator down).
 */
export async function statusLine(app: App, windowMs = 60_000): Promise<string> {
  const { coordinator, db } = app;
  const { run, runId } = coordinator;
  const stages = await coordinator.stageMap();
  const perStage = Array.from({ length: run.stages }, (_, s) => stages.find((x) => x.stage === s)?.miners.length ?? 0);
  const since = new Date(Date.now() - windowMs);
  const [trained] = await db.query<{ n: number; loss: number | null }>(
    `SELECT count(*)::int AS n, avg(value)::float8 AS loss FROM metrics WHERE run_id = $1 AND name = 'train_loss' AND created_at > $2`,
    [runId, since],
  );
  const [settled] = await db.query<{ epoch: number | null }>('SELECT max(epoch) AS epoch FROM settlements WHERE run_id = $1', [runId]);
  const [flagged] = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM flags WHERE run_id = $1 AND created_at > $2', [runId, since]);
  const microbatches = trained?.n ?? 0;
  const tokensPerSec = (microbatches * run.training.batchSize * PRESETS[run.preset].contextLength) / (windowMs / 1000);
  const epoch = epochAt(await runStartMs(db, runId), run.incentives.epochMs, Date.now());
  const failing = [
    ...(flagged && flagged.n > 0 ? [`${flagged.n} miner flag${flagged.n === 1 ? '' : 's'} raised`] : []),
    ...(app.validator.process.up ? [] : ['the validator is not up (starting, or restarting after it exited)']),
  ];
  const busy = validatorBusy(app, windowMs);
  return (
    `status: miners by stage ${perStage.join(' / ')}` +
    ` · last ${span(windowMs)} ${microbatches} microbatch${microbatches === 1 ? '' : 'es'}, ${Math.round(tokensPerSec).toLocaleString('en-US')} tokens/s` +
    (trained?.loss != null ? `, loss ${trained.loss.toFixed(3)}` : '') +
    ` · epoch ${epoch}, ${settled?.epoch == null ? 'none settled yet' : `settled through ${settled.epoch}`}` +
    ` · ${busy}` +
    ` · ${failing.length ? `failing: ${failing.join('; ')}` : 'nothing failing'}`
  );
}

/** What the operator reads for each kind of validator job. */
const JOB_WORDS: Partial<Record<keyof App['validator']['process']['busyMs'], string>> = {
  audit: 'audits',
  replay: 'spot checks',
  evaluate: 'held-out loss',
  generate: 'samples',
  score: 'scoring',
};

/** The validator's busy time at the last status line, per app: each line tells the time since the one before. */
const lastBusy = new WeakMap<App, { at: number; busyMs: Record<string, number> }>();

/**
 * The share of the time since the last status line (of `windowMs`, for the first) the validator process spent on
 * its jobs, by kind: "validator busy 43% (audits 10%, spot checks 20%, held-out loss 13%)". A validator that takes a
 * core on the operator's machine is named, with what it spends it on.
 */
export function validatorBusy(app: App, windowMs: number): string {
  const now = Date.now();
  const busyMs = { ...app.validator.process.busyMs } as Record<string, number>;
  const last = lastBusy.get(app) ?? { at: now - windowMs, busyMs: {} };
  lastBusy.set(app, { at: now, busyMs });
  const span = Math.max(1, now - last.at);
  const share = (kind: string): number => ((busyMs[kind] ?? 0) - (last.busyMs[kind] ?? 0)) / span;
  const kinds = Object.keys(busyMs);
  const total = kinds.reduce((a, k) => a + share(k), 0);
  const pct = (x: number): string => `${Math.round(100 * x)}%`;
  const parts = kinds
    .filter((k) => share(k) >= 0.005)
    .sort((a, b) => share(b) - share(a))
    .map((k) => `${JOB_WORDS[k as keyof typeof JOB_WORDS] ?? k} ${pct(share(k))}`);
  return `validator busy ${pct(Math.min(1, total))}${parts.length ? ` (${parts.join(', ')})` : ''}`;
}
