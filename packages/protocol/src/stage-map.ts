/**
 * Who holds which stage, as miners learn it. A miner is told only about the
 * stages it talks to (`neighbourhood`: upstream, its own replicas, downstream):
 * once whole when it registers or moves (`stages`, a StageSnapshot), then
 * each change as it happens (`stage-delta`), numbered per stage. A miner that
 * sees a number skipped asks for those stages again over REST
 * (`GET /api/stage-map?stages=…`). A join among N miners costs O(N) bytes in
 * all: the newcomer's snapshot, and a delta of one id to each neighbour.
 */

/** One stage as the coordinator last published it: its miners (sorted ids) and the number of its last change. */
export interface StageView {
  stage: number;
  seq: number;
  miners: string[];
}

/** Coordinator → one miner (`stages`): the stages it talks to, whole. Stages it no longer talks to are forgotten. */
export interface StageSnapshot {
  v: number;
  stages: StageView[];
}

/** Coordinator → the miners that talk to `stage` (`stage-delta`): what changed from `seq - 1` to `seq`. */
export interface StageDelta {
  v: number;
  stage: number;
  seq: number;
  joined: string[];
  left: string[];
}

/** The stages a miner of `stage` talks to: the one before (its activations), its own (its replicas), the one after (its outputs). */
export function neighbourhood(stage: number, stages: number): number[] {
  return [stage - 1, stage, stage + 1].filter((s) => s >= 0 && s < stages);
}

/** What changed between two sorted lists of miner ids. */
export function stageChange(before: readonly string[], after: readonly string[]): { joined: string[]; left: string[] } {
  const was = new Set(before);
  const is = new Set(after);
  return { joined: after.filter((id) => !was.has(id)), left: before.filter((id) => !is.has(id)) };
}

/** Where `id` is, or would go, in a sorted list of ids (binary search). */
export function sortedPlace(sorted: readonly string[], id: string): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (sorted[mid]! < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * A delta applied to the view it follows: the new view; `stale` when the view
 * already has it (or a later one); `gap` when a change between them was missed
 * (the stage must be fetched again).
 */
export function applyStageDelta(view: StageView, delta: StageDelta): StageView | 'stale' | 'gap' {
  if (delta.seq <= view.seq) return 'stale';
  if (delta.seq !== view.seq + 1) return 'gap';
  const left = new Set(delta.left);
  const miners = left.size > 0 ? view.miners.filter((id) => !left.has(id)) : view.miners.slice();
  // Each newcomer goes in at its place: a join costs a miner O(N), not a sort.
  for (const id of delta.joined) {
    const at = sortedPlace(miners, id);
    if (miners[at] !== id) miners.splice(at, 0, id);
  }
  return { stage: view.stage, seq: delta.seq, miners };
}

const MINER_ID = /^[0-9a-f]{64}$/;
const ids = (x: unknown): x is string[] => Array.isArray(x) && x.every((id) => typeof id === 'string' && MINER_ID.test(id));
const count = (x: unknown): x is number => Number.isSafeInteger(x) && (x as number) >= 0;

/** Whether a message is a well-formed StageView (what a miner takes from the coordinator or REST). */
export function isStageView(x: unknown): x is StageView {
  const v = x as StageView;
  return typeof v === 'object' && v !== null && count(v.stage) && count(v.seq) && ids(v.miners);
}

/** Whether a message is a well-formed StageDelta. */
export function isStageDelta(x: unknown): x is StageDelta {
  const d = x as StageDelta;
  return typeof d === 'object' && d !== null && count(d.stage) && count(d.seq) && ids(d.joined) && ids(d.left);
}
