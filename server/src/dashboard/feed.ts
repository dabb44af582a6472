import type { DashboardUpdate } from '@train-at-home/protocol';
import type { Namespace } from 'socket.io';
import type { Coordinator } from '../coordinator';
import { bigramLoss, lastIds, latestSettled, pointsAfter, samples, swarmSnapshot } from './snapshot';

/** How often viewers get an update: one message per push, whatever happened in between. */
export const DEFAULT_PUSH_MS = 1000;
/** Points of a series one update carries at most (a viewer backfills the rest over REST). */
export const MAX_POINTS_PER_PUSH = 2000;
/** Events a viewer may send before it is disconnected: the namespace takes none. */
const MAX_VIEWER_EVENTS = 5;

/**
 * The live feed of the dashboard: every `pushMs`, while anyone watches, one
 * `update` broadcast to the /dashboard namespace (encoded once for all
 * viewers): the points stored since the last push, the swarm as it is, a new
 * sample, a new settlement. Each update names the cursors its points follow
 * (`after`): a viewer whose own cursor is behind (it connected meanwhile, or
 * the coordinator restarted) backfills the gap over REST first, so its chart
 * has no holes. Viewers are read-only: whatever they send is ignored, and a
 * viewer that keeps sending is disconnected.
 */
export class DashboardFeed {
  private cursor?: { train_loss: number; heldout_loss: number; sample: number };
  private settled?: number;
  private busy = false;
  private readonly timer: ReturnType<typeof setInterval>;
  /** Updates sent, for operators and the load benchmark. */
  pushes = 0;

  constructor(
    private readonly c: Coordinator,
    private readonly ns: Namespace,
    readonly pushMs = DEFAULT_PUSH_MS,
  ) {
    ns.on('connection', (socket) => {
      let sent = 0;
      socket.onAny(() => {
        if (++sent > MAX_VIEWER_EVENTS) socket.disconnect(true);
      });
    });
    this.timer = setInterval(() => {
      this.push().catch((err: unknown) => c.log.warn({ err }, 'dashboard push failed'));
    }, pushMs);
    this.timer.unref();
  }

  get viewers(): number {
    return this.ns.sockets.size;
  }

  /** Builds and broadcasts one update (nothing while nobody watches). */
  async push(): Promise<DashboardUpdate | undefined> {
    if (this.busy) return undefined;
    if (this.viewers === 0) {
      this.cursor = undefined; // a viewer that comes later starts from its own REST backfill
      return undefined;
    }
    this.busy = true;
    try {
      const cursor = (this.cursor ??= await lastIds(this.c));
      const [train, held] = await Promise.all([
        pointsAfter(this.c, 'train_loss', cursor.train_loss, MAX_POINTS_PER_PUSH),
        pointsAfter(this.c, 'heldout_loss', cursor.heldout_loss, MAX_POINTS_PER_PUSH),
      ]);
      const after = { trainLoss: cursor.train_loss, heldOutLoss: cursor.heldout_loss };
      cursor.train_loss = train.lastId;
      cursor.heldout_loss = held.lastId;
      const [latest] = await samples(this.c, 1);
      const sample = latest && latest.id > cursor.sample ? latest : undefined;
      if (latest) cursor.sample = Math.max(cursor.sample, latest.id);
      const settled = await latestSettled(this.c);
      const settledChanged = settled !== undefined && settled !== this.settled;
      this.settled = settled;
      const update: DashboardUpdate = {
        sentAt: Date.now(),
        after,
        points: { trainLoss: train.points, heldOutLoss: held.points },
        swarm: await swarmSnapshot(this.c),
        ...(sample ? { sample } : {}),
        ...(settledChanged ? { settledEpoch: settled } : {}),
        ...(((b) => (b === undefined ? {} : { bigramLoss: b }))(await bigramLoss(this.c))),
      };
      this.ns.local.emit('update', update); // this process's viewers (in scale-out mode each process pushes to its own)
      this.pushes++;
      return update;
    } finally {
      this.busy = false;
    }
  }

  close(): void {
    clearInterval(this.timer);
  }
}
