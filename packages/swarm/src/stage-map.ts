import { applyStageDelta, isStageDelta, isStageView, type StageDelta, type StageView } from '@train-at-home/protocol';

/** The longest wait between two tries to fetch a stage after a missed change. */
export const REFETCH_MAX_MS = 8000;

/**
 * A miner's view of the stages it talks to (protocol's stage-map.ts): a
 * snapshot replaces it whole, each delta moves one stage on by one number.
 * A delta that skips a number means one was missed: the stage is fetched
 * again (`fetchStages`, over REST), and deltas that arrive meanwhile are kept
 * and applied after it. `onLeft` hears of the miners that left the view
 * (gone from every stage it talks to).
 */
export class StageMapView {
  private readonly views = new Map<number, StageView>();
  /** Stages being fetched after a gap, with the deltas that arrived meanwhile. */
  private readonly fetching = new Map<number, StageDelta[]>();
  /** Stages fetched again after a missed delta (the miner's status and tests read it). */
  refetches = 0;
  private closed = false;

  private readonly onLeft: (ids: string[]) => void;
  private readonly onChange: () => void;
  private readonly log: (line: string) => void;

  /** `onChange`: after any change, once the view holds it; `onLeft`: the miners that left it. */
  constructor(
    private readonly fetchStages: (stages: number[]) => Promise<StageView[]>,
    o: { onLeft?: (ids: string[]) => void; onChange?: () => void; log?: (line: string) => void } = {},
  ) {
    this.onLeft = o.onLeft ?? (() => {});
    this.onChange = o.onChange ?? (() => {});
    this.log = o.log ?? (() => {});
  }

  /** The miners of a stage, as far as this miner knows (none for a stage it does not talk to). */
  peers(stage: number): string[] {
    return this.views.get(stage)?.miners ?? [];
  }

  /** The number of the last change of a stage this miner has (undefined for a stage it does not talk to). */
  seq(stage: number): number | undefined {
    return this.views.get(stage)?.seq;
  }

  /** Every miner this miner knows of. */
  ids(): Set<string> {
    return new Set([...this.views.values()].flatMap((v) => v.miners));
  }

  /** The coordinator's `stages` message: the stages this miner talks to now, whole. */
  snapshot(m: unknown): void {
    const stages = (m as { stages?: unknown } | null)?.stages;
    if (!Array.isArray(stages) || !stages.every(isStageView)) return this.log('a malformed stage snapshot was ignored');
    const before = this.ids();
    this.views.clear();
    for (const v of stages) this.views.set(v.stage, { stage: v.stage, seq: v.seq, miners: [...v.miners].sort() });
    this.left([...before]);
    this.onChange();
  }

  /** The coordinator's `stage-delta` message. */
  delta(d: unknown): void {
    if (!isStageDelta(d)) return this.log('a malformed stage delta was ignored');
    const waiting = this.fetching.get(d.stage);
    if (waiting) {
      waiting.push(d);
      return;
    }
    const view = this.views.get(d.stage);
    if (!view) return; // a stage this miner no longer talks to
    const next = applyStageDelta(view, d);
    if (next === 'stale') return;
    if (next === 'gap') return void this.refetch(d);
    this.views.set(d.stage, next);
    this.left(d.left);
    this.onChange();
  }

  /** Tells of the miners among `candidates` that are in no stage of the view any more. */
  private left(candidates: string[]): void {
    if (candidates.length === 0) return;
    const now = this.ids();
    const gone = candidates.filter((id) => !now.has(id));
    if (gone.length > 0) this.onLeft(gone);
  }

  private async refetch(first: StageDelta): Promise<void> {
    const { stage } = first;
    this.refetches++;
    this.fetching.set(stage, [first]);
    // Until it is fetched: a stage left with a missed change would stay wrong until its next change, which may never
    // come (a settled swarm changes no stage). Retried after 0.5 s, 1 s, 2 s… up to every REFETCH_MAX_MS.
    let fetched: StageView | undefined;
    for (let wait = 500; !this.closed && this.views.has(stage); wait = Math.min(REFETCH_MAX_MS, wait * 2)) {
      try {
        fetched = (await this.fetchStages([stage])).find((v) => v.stage === stage && isStageView(v));
        if (fetched) break;
        this.log(`stage ${stage + 1}'s map was not in the coordinator's answer after a missed change; asking again`);
      } catch (e) {
        this.log(`stage ${stage + 1}'s map could not be fetched after a missed change (${(e as Error).message}); asking again`);
      }
      await new Promise((r) => setTimeout(r, wait));
    }
    const waiting = this.fetching.get(stage) ?? [];
    this.fetching.delete(stage);
    if (this.closed) return;
    const view = this.views.get(stage);
    if (fetched && view && fetched.seq > view.seq) {
      this.views.set(stage, { stage, seq: fetched.seq, miners: [...fetched.miners].sort() });
      this.left(view.miners);
      this.onChange();
    }
    // What came meanwhile: applied in order (a later gap fetches again).
    for (const d of waiting.sort((a, b) => a.seq - b.seq)) this.delta(d);
  }

  /** Stops asking (the miner stopped). */
  close(): void {
    this.closed = true;
  }
}

/** Fetches stages' views from a coordinator's REST API. */
export function restStageMap(coordinatorUrl: string, onBytes?: (bytes: number) => void): (stages: number[]) => Promise<StageView[]> {
  return async (stages) => {
    const res = await fetch(`${coordinatorUrl}/api/stage-map?stages=${stages.join(',')}`);
    if (!res.ok) throw new Error(`GET /api/stage-map: ${res.status}`);
    const text = await res.text();
    onBytes?.(text.length);
    const body = JSON.parse(text) as { stages?: unknown };
    return Array.isArray(body.stages) ? body.stages.filter(isStageView) : [];
  };
}
