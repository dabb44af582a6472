import { DASHBOARD_BOUNDS as B, DASHBOARD_NAMESPACE, DashboardFollower, sane, saneTraffic, type DashboardSample, type DashboardSeriesName, type DashboardSwarm, type DashboardUpdate, LiveSeries } from '@train-at-home/protocol';
import { io, type Socket } from 'socket.io-client';
import { useEffect, useRef, useState } from 'react';

/** The series the chart shows, as the API names them. */
export type SeriesName = DashboardSeriesName;

export interface RunInfo {
  name: string;
  preset: string;
  stages: number;
  bottleneck: number;
  codec: string;
}

export interface DashboardState {
  run?: RunInfo;
  swarm?: DashboardSwarm;
  samples: DashboardSample[];
  bigramLoss?: number;
  settledEpoch?: number;
  /** The coordinator's last restart, from the previous process's last heartbeat to this one's start (ms since epoch). */
  outage?: { from: number; to: number };
  /** 'live' while the feed is connected; 'reconnecting' after it dropped (the coordinator restarted, the network failed). */
  connection: 'connecting' | 'live' | 'reconnecting';
  /** Bumped whenever a series gained points: the chart redraws. */
  version: number;
  /** Updates received, and the latest's delivery delay (ms). */
  updates: number;
  lastDelayMs?: number;
  error?: string;
}

/** Only figures within bounds reach the page: a miner's NaN or absurd rate is dropped here too. */
function saneSwarm(s: DashboardSwarm): DashboardSwarm {
  return {
    stages: (s?.stages ?? []).map((st) => ({
      ...st,
      traffic: { tokens: sane(st.traffic?.tokens, B.bytes) ?? 0, kinds: saneTraffic(st.traffic?.kinds) },
      miners: (st.miners ?? []).map((m) => {
        const tokensPerSec = sane(m.tokensPerSec, B.tokensPerSec);
        return { id: String(m.id), backend: String(m.backend), state: String(m.state), ...(m.why ? { why: String(m.why).slice(0, 200) } : {}), ...(tokensPerSec !== undefined ? { tokensPerSec } : {}), ...(Number.isSafeInteger(m.microbatches) && m.microbatches! >= 0 ? { microbatches: m.microbatches } : {}) };
      }),
    })),
    boundaries: (s?.boundaries ?? []).map((b) => ({
      from: b.from,
      to: b.to,
      activationsPerSec: sane(b.activationsPerSec, B.perSec) ?? 0,
      gradientsPerSec: sane(b.gradientsPerSec, B.perSec) ?? 0,
      bytesPerSec: sane(b.bytesPerSec, B.bytesPerSec) ?? 0,
    })),
    traffic: {
      bytes: sane(s?.traffic?.bytes, B.bytes) ?? 0,
      uncompressedBytes: sane(s?.traffic?.uncompressedBytes, B.bytes) ?? 0,
      savedBytes: sane(s?.traffic?.savedBytes, B.bytes) ?? 0,
      relayedBytes: sane(s?.traffic?.relayedBytes, B.bytes) ?? 0,
      signalBytes: sane(s?.traffic?.signalBytes, B.bytes) ?? 0,
    },
    merges: (s?.merges ?? []).map((m) => ({ ...m, durationMs: sane(m.durationMs, B.ms) ?? null })),
  };
}

async function getJson<T>(url: string): Promise<T> {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  return (await res.json()) as T;
}

/**
 * The dashboard's data: a first paint over REST (/api/dashboard), and the
 * loss series followed by the shared DashboardFollower (backfill over REST,
 * then the live feed, socket.io /dashboard, with gaps backfilled: no hole
 * after a reconnect or a coordinator restart). Works for anyone: no wallet,
 * no miner.
 */
export function useDashboard(): { state: DashboardState; series: Record<SeriesName, LiveSeries> } {
  const follower = useRef<DashboardFollower | undefined>(undefined);
  const [state, setState] = useState<DashboardState>({ samples: [], connection: 'connecting', version: 0, updates: 0 });

  useEffect(() => {
    let stopped = false;
    const patch = (p: Partial<DashboardState>): void => {
      if (!stopped) setState((s) => ({ ...s, ...p }));
    };
    const f = new DashboardFollower(
      getJson,
      (u) => {
        if (stopped) return;
        setState((s) =>
          u
            ? {
                ...s,
                swarm: saneSwarm(u.swarm),
                ...(u.sample ? { samples: [u.sample, ...s.samples.filter((x) => x.id !== u.sample!.id)].slice(0, 10) } : {}),
                ...(u.settledEpoch !== undefined ? { settledEpoch: u.settledEpoch } : {}),
                ...(sane(u.bigramLoss, B.loss) !== undefined ? { bigramLoss: u.bigramLoss } : {}),
                updates: s.updates + 1,
                lastDelayMs: sane(Date.now() - u.sentAt, B.ms),
                version: s.version + 1,
              }
            : { ...s, version: s.version + 1 },
        );
      },
      (e) => patch({ error: e.message }),
    );
    follower.current = f;
    // Subscribe first (updates wait in the follower's queue), then paint and backfill: nothing falls between.
    const socket: Socket = io(DASHBOARD_NAMESPACE, { transports: ['websocket', 'polling'] });
    socket.on('update', (u: DashboardUpdate) => f.push(u));
    socket.on('connect', () => patch({ connection: 'live', error: undefined }));
    socket.on('disconnect', () => patch({ connection: 'reconnecting' }));
    void (async () => {
      try {
        const first = await getJson<{ run: RunInfo; swarm: DashboardSwarm; bigramLoss: number | null; settledEpoch: number | null; outage?: { from: string; to: string } | null }>('/api/dashboard');
        const outage = first.outage ? { from: Date.parse(first.outage.from), to: Date.parse(first.outage.to) } : undefined;
        const { samples } = await getJson<{ samples: DashboardSample[] }>('/api/samples?limit=5');
        patch({ run: first.run, swarm: saneSwarm(first.swarm), samples, bigramLoss: sane(first.bigramLoss, B.loss), settledEpoch: first.settledEpoch ?? undefined, ...(outage && outage.to >= outage.from ? { outage } : {}) });
        await f.start();
      } catch (e) {
        patch({ error: `could not read the run: ${(e as Error).message}` });
      }
    })();
    // For drills and tests: the series as this page holds them.
    (window as unknown as { trainAtHomeDashboard?: object }).trainAtHomeDashboard = { series: f.series, follower: f };
    return () => {
      stopped = true;
      f.stop();
      socket.close();
    };
  }, []);

  return { state, series: follower.current?.series ?? EMPTY };
}

const EMPTY: Record<SeriesName, LiveSeries> = { train_loss: new LiveSeries(), heldout_loss: new LiveSeries() };
