/** A miner as stage assignment sees it. */
export interface StageMember {
  id: string;
  stage: number;
  tokensPerSec: number;
}

/** A stage as a newcomer's assignment sees it: how many miners hold it, and their total measured throughput. */
export interface StageLoad {
  stage: number;
  miners: number;
  tokensPerSec: number;
}

/**
 * The stage that needs a new miner most: the one with the fewest miners, and
 * among those the slowest (least total measured throughput), then the lowest
 * index. A pipeline runs at the pace of its weakest stage. Takes each stage's
 * totals (one aggregate query), not its members: a registration among N
 * miners reads `stages` rows, not N.
 */
export function stageForNewcomer(stages: number, loads: StageLoad[]): number {
  let best = 0;
  let bestKey: [number, number] = [Infinity, Infinity];
  for (let s = 0; s < stages; s++) {
    const here = loads.find((l) => l.stage === s);
    const key: [number, number] = [here?.miners ?? 0, here?.tokensPerSec ?? 0];
    if (key[0] < bestKey[0] || (key[0] === bestKey[0] && key[1] < bestKey[1])) {
      best = s;
      bestKey = key;
    }
  }
  return best;
}

/**
 * When a stage has emptied, moves miners so that every stage has one: each
 * empty stage takes a miner from the most crowded stage (the fastest of its
 * miners stays; the slowest moves, having the least to lose). Returns the moves.
 */
export function rebalance(stages: number, members: StageMember[]): Array<{ id: string; from: number; to: number }> {
  const moves: Array<{ id: string; from: number; to: number }> = [];
  const current = members.map((m) => ({ ...m }));
  for (let s = 0; s < stages; s++) {
    if (current.some((m) => m.stage === s)) continue;
    const counts = Array.from({ length: stages }, (_, i) => current.filter((m) => m.stage === i).length);
    const donor = counts.indexOf(Math.max(...counts));
    if (counts[donor]! < 2) break; // not enough miners to fill every stage
    const candidates = current.filter((m) => m.stage === donor).sort((a, b) => a.tokensPerSec - b.tokensPerSec || (a.id < b.id ? -1 : 1));
    const moving = candidates[0]!;
    moves.push({ id: moving.id, from: donor, to: s });
    moving.stage = s;
  }
  return moves;
}
