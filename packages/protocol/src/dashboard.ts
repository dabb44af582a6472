import type { Traffic } from './traffic';

/**
 * What the coordinator pushes to dashboard viewers (socket.io namespace
 * /dashboard, one `update` per push) and serves as REST (/api/dashboard,
 * /api/metrics/:series, /api/samples). Numbers that come from miners are
 * checked on both ends with `sane`: NaN, infinite, negative or absurd values
 * never reach a chart.
 */

/** The namespace viewers connect to; it takes no event from them. */
export const DASHBOARD_NAMESPACE = '/dashboard';

/** Bounds of every figure the dashboard shows: anything outside is not shown. */
export const DASHBOARD_BOUNDS = {
  loss: { min: 0, max: 100 },
  tokensPerSec: { min: 0, max: 1e7 },
  perSec: { min: 0, max: 1e6 },
  bytesPerSec: { min: 0, max: 1e11 },
  bytes: { min: 0, max: 1e18 },
  ms: { min: 0, max: 1e10 },
} as const;

/** The value when it is a finite number within the bounds; else undefined (not shown). */
export function sane(value: unknown, bounds: { min: number; max: number }): number | undefined {
  return typeof value === 'number' && Number.isFinite(value) && value >= bounds.min && value <= bounds.max ? value : undefined;
}

export interface DashboardPoint {
  /** The point's place in its series (GET /api/metrics/:series?after=id backfills from it). */
  id: number;
  value: number;
  /** ISO time it was stored. */
  at: string;
  round: number | null;
}

export interface DashboardMiner {
  id: string;
  backend: string;
  /** What the miner reports doing, with why when it waits; 'silent' when no report is fresh. */
  state: string;
  why?: string;
  tokensPerSec?: number;
  microbatches?: number;
  /** The miner's own word on how its peers are reached (its heartbeats'). */
  paths?: PathSummary;
}

/** Per path a miner's peers take (direct, through TURN, through the coordinator's relay): how many, and the bytes both ways. */
export type PathSummary = Partial<Record<'direct' | 'turn' | 'coordinator', { peers: number; bytes: number }>>;

export interface DashboardSwarm {
  /**
   * `traffic`: what the stage's miners (with a fresh report) say they sent and received since they started, by kind,
   * and the tokens they processed meanwhile (bytes per trained token is one over the other).
   */
  stages: Array<{ stage: number; phase: string; round: number; miners: DashboardMiner[]; traffic: { tokens: number; kinds: Traffic } }>;
  /** Between stage `from` and `to`: confirmed transfers per second each way, and bytes per second. */
  boundaries: Array<{ from: number; to: number; activationsPerSec: number; gradientsPerSec: number; bytesPerSec: number }>;
  traffic: {
    /** Bytes of confirmed transfers (activations and gradients) since the coordinator started. */
    bytes: number;
    /** What the same tensors would have been in fp32: bytes − this is what compression saved. */
    uncompressedBytes: number;
    savedBytes: number;
    /** Of the transfers' bytes, those the coordinator carried (no direct path), and signaling. */
    relayedBytes: number;
    signalBytes: number;
  };
  /** The latest merge rounds, newest first. */
  merges: Array<{ stage: number; round: number; mode: string | null; participants: number; startedAt: string; endedAt: string | null; durationMs: number | null }>;
}

export interface DashboardSample {
  id: number;
  rounds: number[];
  heldOutLoss: number | null;
  prompt: string;
  text: string;
  at: string;
}

export interface DashboardUpdate {
  /** When the coordinator sent it (ms since epoch): viewers measure delivery with it. */
  sentAt: number;
  /** The ids the points follow, per series: a viewer whose own last id is behind backfills the gap first. */
  after: { trainLoss: number; heldOutLoss: number };
  /** Points stored since the previous update, per series, oldest first. */
  points: { trainLoss: DashboardPoint[]; heldOutLoss: DashboardPoint[] };
  swarm: DashboardSwarm;
  /** A sample the validator wrote since the previous update. */
  sample?: DashboardSample;
  /** The newest settled emission epoch, when it changed (viewers fetch the leaderboard then). */
  settledEpoch?: number;
  bigramLoss?: number;
}

/**
 * One loss series as a viewer holds it, by id, with no hole: pages fetched
 * over REST are appended in order, and a pushed update is applied only when
 * it follows what the series holds (`after` ≤ its last id); otherwise the
 * viewer backfills first (`gap`). Points that are not sane are never kept.
 */
export class LiveSeries {
  readonly points: DashboardPoint[] = [];
  /** The id of the last point this series has seen (kept or not). */
  lastId = 0;

  /** Appends points newer than the last id; `upTo` moves the cursor past ids the server holds nothing sane for. */
  append(points: readonly DashboardPoint[], upTo = 0): number {
    let added = 0;
    for (const p of points) {
      if (typeof p?.id !== 'number' || !Number.isSafeInteger(p.id) || p.id <= this.lastId) continue;
      this.lastId = p.id;
      if (sane(p.value, DASHBOARD_BOUNDS.loss) === undefined || typeof p.at !== 'string' || Number.isNaN(Date.parse(p.at))) continue;
      this.points.push({ id: p.id, value: p.value, at: p.at, round: typeof p.round === 'number' ? p.round : null });
      added++;
    }
    if (upTo > this.lastId) this.lastId = upTo;
    return added;
  }

  /** A pushed update's points for this series: applied, or 'gap' when the viewer must backfill after its last id first. */
  apply(after: number, points: readonly DashboardPoint[]): 'applied' | 'gap' {
    if (after > this.lastId) return 'gap';
    this.append(points);
    return 'applied';
  }
}

export type DashboardSeriesName = 'train_loss' | 'heldout_loss';
/** Points per REST page when a follower backfills (the API's largest page). */
export const BACKFILL_PAGE = 5000;

/**
 * How a viewer follows the run (the Dashboard page, and tests in Node): give
 * it every update of the feed in order (`push`, subscribed before `start`),
 * and `start` it: each loss series is backfilled page by page over REST
 * (GET /api/metrics/:series?after=), then the updates that came meanwhile are
 * applied in order. An update that follows points it never saw (it connected
 * meanwhile, the feed reconnected after a restart) makes it backfill that gap
 * first: its series never have a hole.
 */
export class DashboardFollower {
  readonly series: Record<DashboardSeriesName, LiveSeries> = { train_loss: new LiveSeries(), heldout_loss: new LiveSeries() };
  private queue: Promise<void>;
  private ready!: () => void;
  private stopped = false;
  /** Gaps found and backfilled (for tests and the curious). */
  gaps = 0;

  constructor(
    /** GET a path of the coordinator's API (relative in a page, absolute in Node) as JSON. */
    private readonly getJson: <T>(path: string) => Promise<T>,
    /** Called after each applied update, and after the first backfill (no update). */
    private readonly onChange: (update?: DashboardUpdate) => void = () => {},
    private readonly onError: (e: Error) => void = () => {},
  ) {
    this.queue = new Promise<void>((r) => (this.ready = r));
  }

  /** An update of the feed, in the order it came. */
  push(update: DashboardUpdate): void {
    this.queue = this.queue.then(() => (this.stopped ? undefined : this.apply(update))).catch((e: unknown) => this.onError(e as Error));
  }

  /** Backfills both series, then applies the updates that came meanwhile (and all later ones). */
  async start(): Promise<void> {
    try {
      await this.backfill('train_loss');
      await this.backfill('heldout_loss');
      this.onChange();
    } finally {
      this.ready();
    }
  }

  /** Resolves once every update pushed so far is applied. */
  settled(): Promise<void> {
    return this.queue;
  }

  stop(): void {
    this.stopped = true;
  }

  /** Pages a series after its last id; `upTo`: the server holds nothing sane up to it (a pushed update's cursor). */
  private async backfill(name: DashboardSeriesName, upTo = 0): Promise<void> {
    const s = this.series[name];
    for (;;) {
      const page = await this.getJson<{ points: DashboardPoint[]; nextAfter: number | null }>(`/api/metrics/${name}?after=${s.lastId}&limit=${BACKFILL_PAGE}`);
      s.append(Array.isArray(page?.points) ? page.points : [], page?.nextAfter === null ? upTo : 0);
      if (typeof page?.nextAfter !== 'number' || this.stopped) return;
      if (page.nextAfter > s.lastId) s.lastId = page.nextAfter;
    }
  }

  private async apply(u: DashboardUpdate): Promise<void> {
    for (const [name, key] of [['train_loss', 'trainLoss'], ['heldout_loss', 'heldOutLoss']] as const) {
      const after = Number(u?.after?.[key] ?? 0);
      const points = Array.isArray(u?.points?.[key]) ? u.points[key] : [];
      if (this.series[name].apply(after, points) === 'gap') {
        this.gaps++;
        await this.backfill(name, after);
        this.series[name].apply(after, points);
      }
    }
    this.onChange(u);
  }
}
