import { DASHBOARD_BOUNDS as B, TRAFFIC_KINDS, emptyTraffic, sane, saneTraffic, type DashboardPoint, type DashboardSample, type DashboardSwarm, type Traffic } from '@train-at-home/protocol';
import type { Coordinator } from '../coordinator';
import { REPORT_FRESH_MS, type MinerReport } from './live';

/** Merge rounds the dashboard lists. */
export const RECENT_MERGES = 12;

/** The swarm as a dashboard viewer sees it now: stages and miners with their state, transfer rates, bytes, recent merges. */
export async function swarmSnapshot(c: Coordinator, nowMs = Date.now()): Promise<DashboardSwarm> {
  // The live figures of every process (scale-out), or this one's.
  const [map, live] = await Promise.all([c.stageMap(), c.liveSummary(nowMs)]);
  const reports = new Map(live.miners);
  const phases = c.phases.status();
  const stages = map.map(({ stage, miners }) => ({
    stage,
    phase: phases[stage]?.phase ?? 'training',
    round: phases[stage]?.round ?? 0,
    traffic: stageTraffic(miners.map((m) => reports.get(m.id)).filter((r): r is MinerReport => r !== undefined && nowMs - r.at <= REPORT_FRESH_MS)),
    miners: miners.map((m) => {
      const r = reports.get(m.id);
      const fresh = r && nowMs - r.at <= REPORT_FRESH_MS;
      return {
        id: m.id,
        backend: m.backend,
        state: fresh ? r.phase : 'silent',
        ...(fresh && r.why ? { why: r.why } : {}),
        ...(fresh && sane(r.tokensPerSec, B.tokensPerSec) !== undefined ? { tokensPerSec: r.tokensPerSec } : {}),
        ...(fresh ? { microbatches: r.microbatches } : {}),
        ...(fresh && r.paths ? { paths: r.paths } : {}),
      };
    }),
  }));
  const rounds = await c.db.query<{ stage: number; round: number; mode: string | null; participants: string[] | null; started_at: Date; ended_at: Date | null }>(
    `SELECT stage, epoch AS round, mode, participants, started_at, ended_at FROM epochs WHERE run_id = $1 ORDER BY started_at DESC LIMIT $2`,
    [c.runId, RECENT_MERGES],
  );
  const { bytes, uncompressedBytes } = live.totals;
  return {
    stages,
    boundaries: live.rates.map((r) => ({
      ...r,
      activationsPerSec: sane(r.activationsPerSec, B.perSec) ?? 0,
      gradientsPerSec: sane(r.gradientsPerSec, B.perSec) ?? 0,
      bytesPerSec: sane(r.bytesPerSec, B.bytesPerSec) ?? 0,
    })),
    traffic: {
      bytes,
      uncompressedBytes,
      savedBytes: Math.max(0, uncompressedBytes - bytes),
      relayedBytes: live.relayed.frameBytes,
      signalBytes: live.relayed.signalBytes,
    },
    merges: rounds.map((r) => {
      const started = new Date(r.started_at).getTime();
      const ended = r.ended_at ? new Date(r.ended_at).getTime() : null;
      return {
        stage: r.stage,
        round: r.round,
        mode: r.mode,
        participants: Array.isArray(r.participants) ? r.participants.length : 0,
        startedAt: new Date(started).toISOString(),
        endedAt: ended === null ? null : new Date(ended).toISOString(),
        durationMs: ended === null ? null : (sane(ended - started, B.ms) ?? null),
      };
    }),
  };
}

/** What a stage's miners say they moved, summed by kind, with the tokens they trained meanwhile (a report from another process is checked as it is read). */
function stageTraffic(reports: MinerReport[]): { tokens: number; kinds: Traffic } {
  const kinds = emptyTraffic();
  let tokens = 0;
  for (const r of reports) {
    if (!r.traffic) continue;
    tokens += sane(r.trainedTokens, B.bytes) ?? 0;
    const t = saneTraffic(r.traffic);
    for (const k of TRAFFIC_KINDS) {
      kinds[k].sent += t[k].sent;
      kinds[k].received += t[k].received;
    }
  }
  return { tokens, kinds };
}

type PointRow = { id: string | number; value: number; at: Date | string; round: number | null };

/**
 * Stored points of a series after `afterId`, oldest first, and the last id
 * read (the next cursor); a value out of bounds is left out (and never shown).
 */
export async function pointsAfter(c: Coordinator, series: 'train_loss' | 'heldout_loss', afterId: number, limit: number): Promise<{ points: DashboardPoint[]; lastId: number }> {
  const rows = await c.db.query<PointRow>(`SELECT id, value, created_at AS at, round FROM metrics WHERE run_id = $1 AND name = $2 AND id > $3 ORDER BY id LIMIT $4`, [
    c.runId,
    series,
    afterId,
    limit,
  ]);
  return {
    points: rows.filter((r) => sane(r.value, B.loss) !== undefined).map((r) => ({ id: Number(r.id), value: r.value, at: new Date(r.at).toISOString(), round: r.round })),
    lastId: rows.length ? Number(rows[rows.length - 1]!.id) : afterId,
  };
}

/** The newest id of each series (where a live feed starts). */
export async function lastIds(c: Coordinator): Promise<{ train_loss: number; heldout_loss: number; sample: number }> {
  const [row] = await c.db.query<{ t: string | null; h: string | null; s: number | null }>(
    `SELECT (SELECT max(id) FROM metrics WHERE run_id = $1 AND name = 'train_loss') AS t,
            (SELECT max(id) FROM metrics WHERE run_id = $1 AND name = 'heldout_loss') AS h,
            (SELECT max(id) FROM samples WHERE run_id = $1) AS s`,
    [c.runId],
  );
  return { train_loss: Number(row?.t ?? 0), heldout_loss: Number(row?.h ?? 0), sample: Number(row?.s ?? 0) };
}

type SampleRow = { id: number; rounds: number[] | string; held_out_loss: number | null; prompt: string; text: string; created_at: Date };
const sampleJson = (r: SampleRow): DashboardSample => ({
  id: Number(r.id),
  rounds: typeof r.rounds === 'string' ? (JSON.parse(r.rounds) as number[]) : r.rounds,
  heldOutLoss: sane(r.held_out_loss, B.loss) ?? null,
  prompt: r.prompt,
  text: r.text,
  at: new Date(r.created_at).toISOString(),
});

/** Samples of what the model writes, newest first, before `beforeId` when given. */
export async function samples(c: Coordinator, limit: number, beforeId: number | null = null): Promise<DashboardSample[]> {
  const rows = await c.db.query<SampleRow>(
    `SELECT id, rounds, held_out_loss, prompt, text, created_at FROM samples WHERE run_id = $1 AND ($2::int IS NULL OR id < $2) ORDER BY id DESC LIMIT $3`,
    [c.runId, beforeId, limit],
  );
  return rows.map(sampleJson);
}

/** The bigram baseline of the run's held-out text, once the validator has measured it. */
export async function bigramLoss(c: Coordinator): Promise<number | undefined> {
  const [row] = await c.db.query<{ value: number }>(`SELECT value FROM metrics WHERE run_id = $1 AND name = 'bigram_loss' ORDER BY id LIMIT 1`, [c.runId]);
  return sane(row?.value, B.loss);
}

/** The newest settled emission epoch, if any. */
export async function latestSettled(c: Coordinator): Promise<number | undefined> {
  const [row] = await c.db.query<{ epoch: number | null }>(`SELECT max(epoch) AS epoch FROM settlements WHERE run_id = $1`, [c.runId]);
  return row?.epoch ?? undefined;
}
