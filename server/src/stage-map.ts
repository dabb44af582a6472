import { PROTOCOL_VERSION, applyStageDelta, isStageDelta, isStageView, neighbourhood, sortedPlace, stageChange, type StageDelta, type StageSnapshot, type StageView } from '@train-at-home/protocol';

/** Where the feed sends a delta: the rooms of the stages that talk to it (their miners get it once each). */
export type StageDeltaSink = (rooms: string[], delta: StageDelta) => void;

/** One change of who holds a stage, as the database logged it (stage_changes, migration 25). */
export interface StageChange {
  stage: number;
  minerId: string;
  joined: boolean;
}

/** Where the feed learns who holds which stage. */
export interface StageSource {
  /** Forgets the changes logged so far, then reads who holds each stage: when the feed starts, and after a takeover. */
  readAll(): Promise<string[][]>;
  /** Takes the changes logged since the last read or take, oldest first (each miner's in the order they were made). */
  takeChanges(): Promise<StageChange[]>;
}


/**
 * The shortest time between two publishes: each sends a delta to every miner
 * of the neighbouring stages, and registrations come one after another (they
 * serialize on the assignment lock), so one publish per join made a ramp of N
 * joins cost O(N²) messages. Joins and departures within it reach the miners
 * as one delta per stage, that much later.
 */
export const PUBLISH_EVERY_MS = 200;
/**
 * …and longer as the run grows (0.1 ms per miner, at most PUBLISH_MAX_MS): while
 * miners keep joining, each publish sends a delta to every miner of the
 * neighbouring stages, N messages each time; with the interval growing with N,
 * a miner receives a bounded number of them per second however many join (at
 * 10,000 miners a join reaches its neighbours within 1 s). The bytes are the
 * same (each change goes once to each neighbour), in fewer, larger messages.
 */
export const PUBLISH_MS_PER_MINER = 0.1;
export const PUBLISH_MAX_MS = 2000;

/** The wait between two publishes of a map of `miners` miners. */
export function publishEveryMs(miners: number): number {
  return Math.min(PUBLISH_MAX_MS, Math.max(PUBLISH_EVERY_MS, miners * PUBLISH_MS_PER_MINER));
}
/** How far each stage's number jumps when another process takes over publishing (StageMapFeed.lead). */
export const TAKEOVER_SEQ_JUMP = 1000;

/** The room a stage's miners are in (socket.io). */
export const stageRoom = (stage: number): string => `stage:${stage}`;

/**
 * The stage map as miners were told it, and what tells them (protocol's
 * stage-map.ts). `publish` takes the changes the database logged since the
 * last publish (whatever made them: a registration, a departure, a drop, a
 * flag, a rebalance; a whole read only at the start and after a takeover) and
 * sends each stage that changed as one delta, numbered, encoded once for the
 * rooms of the stages that talk to it: its cost follows the changes, not the
 * number of miners. Calls made while a publish runs or waits its turn
 * (publishEveryMs) are folded into one more: a burst of joins costs one read.
 * A snapshot (`view`) is taken from what was published, never from the
 * database, so that it and the deltas after it follow one numbering.
 */
export class StageMapFeed {
  private readonly published: StageView[];
  private tail: Promise<void> = Promise.resolve();
  private queued?: Promise<void>;
  private lastRead = -Infinity;
  /** Whether the next publish reads the whole map (at the start, and after a takeover) rather than the logged changes. */
  private whole = true;

  constructor(
    private readonly stages: number,
    private readonly source: StageSource,
    private readonly sink: StageDeltaSink,
  ) {
    this.published = Array.from({ length: stages }, (_, stage) => ({ stage, seq: 0, miners: [] }));
  }

  /** Whether this process publishes; in scale-out mode one process does, the others mirror its deltas. */
  private leading = true;
  /** A follower's request that the publishing process look (scale-out.ts). */
  private askLeader?: () => void;
  /** A follower whose mirror missed a delta asks for the published views again. */
  private resync?: () => void;

  /** Stops publishing: what changes here is published by another process (`ask`), whose deltas this one mirrors. */
  follow(ask: () => void, resync: () => void): void {
    this.leading = false;
    this.askLeader = ask;
    this.resync = resync;
  }

  /**
   * Publishes from now on (this process took over the singleton jobs). Every stage's
   * number jumps by TAKEOVER_SEQ_JUMP, so that a miner the last publisher told
   * something this mirror missed sees a gap at the next delta, and fetches again.
   */
  lead(): Promise<void> {
    if (!this.leading) {
      this.leading = true;
      this.whole = true; // what the last publisher took from the log and never published is in no delta this one saw
      for (let s = 0; s < this.stages; s++) this.published[s] = { ...this.published[s]!, seq: this.published[s]!.seq + TAKEOVER_SEQ_JUMP };
    }
    return this.publish();
  }

  /** A follower's copy of a delta the publishing process sent. */
  mirror(delta: unknown): void {
    if (this.leading || !isStageDelta(delta) || delta.stage >= this.stages) return;
    const next = applyStageDelta(this.published[delta.stage]!, delta);
    if (next === 'gap') this.resync?.();
    else if (next !== 'stale') this.published[delta.stage] = next;
  }

  /** A follower's copy of the published views (after a gap, or when it starts). */
  replace(views: unknown): void {
    if (this.leading || !Array.isArray(views)) return;
    for (const v of views) if (isStageView(v) && v.stage < this.stages && v.seq >= this.published[v.stage]!.seq) this.published[v.stage] = v;
  }

  /** Publishes what changed; resolves once a read begun after this call has been published. A follower asks the publisher instead. */
  publish(): Promise<void> {
    if (!this.leading) {
      this.askLeader?.();
      return Promise.resolve();
    }
    if (this.queued) return this.queued;
    const next = this.tail.then(async () => {
      // Reads at most every publishEveryMs: what changes meanwhile (a burst of registrations) goes out in one.
      const wait = this.lastRead + publishEveryMs(this.published.reduce((n, v) => n + v.miners.length, 0)) - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      this.queued = undefined;
      this.lastRead = performance.now();
      return this.once();
    });
    this.queued = next;
    this.tail = next.catch(() => {});
    return next;
  }

  private async once(): Promise<void> {
    const next = this.whole ? await this.readWhole() : this.apply(await this.source.takeChanges());
    this.whole = false;
    for (let stage = 0; stage < this.stages; stage++) {
      const before = this.published[stage]!;
      const miners = next[stage];
      if (!miners) continue;
      const { joined, left } = stageChange(before.miners, miners);
      if (joined.length === 0 && left.length === 0) continue;
      const seq = before.seq + 1;
      this.published[stage] = { stage, seq, miners };
      // The stages whose miners talk to this one are the ones it talks to.
      this.sink(neighbourhood(stage, this.stages).map(stageRoom), { v: PROTOCOL_VERSION, stage, seq, joined, left });
    }
  }

  /** Every stage's miners, sorted, read whole. */
  private async readWhole(): Promise<Array<string[] | undefined>> {
    const now = await this.source.readAll();
    return Array.from({ length: this.stages }, (_, stage) => [...(now[stage] ?? [])].sort());
  }

  /**
   * The published lists with the changes applied in order (a change that is already true, as after a whole read
   * that saw it, changes nothing): a new sorted list for each stage a change names, undefined for the others.
   */
  private apply(changes: StageChange[]): Array<string[] | undefined> {
    const next: Array<string[] | undefined> = Array.from({ length: this.stages }, () => undefined);
    for (const { stage, minerId, joined } of changes) {
      if (!Number.isInteger(stage) || stage < 0 || stage >= this.stages) continue;
      const list = (next[stage] ??= [...this.published[stage]!.miners]);
      const at = sortedPlace(list, minerId);
      const there = list[at] === minerId;
      if (joined && !there) list.splice(at, 0, minerId);
      else if (!joined && there) list.splice(at, 1);
    }
    return next;
  }

  /** The published views of some stages (a miner's neighbourhood, or what it asked for after a gap). */
  view(stages: number[]): StageView[] {
    return stages.filter((s) => Number.isInteger(s) && s >= 0 && s < this.stages).map((s) => this.published[s]!);
  }

  /** What a miner of `stage` is sent when it registers or moves: the stages it talks to. */
  snapshot(stage: number): StageSnapshot {
    return { v: PROTOCOL_VERSION, stages: this.view(neighbourhood(stage, this.stages)) };
  }
}
