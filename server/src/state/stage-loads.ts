import type { Queryable } from '../db/database';
import type { StageLoad } from '../assignment';

/**
 * Each stage's active miners and their summed throughput, as the statement triggers on `miners` keep them
 * (migration 24, stage_loads): one row per stage, whatever the number of miners.
 */
export async function stageLoads(db: Queryable, runId: number): Promise<StageLoad[]> {
  return db.query<StageLoad>(`SELECT stage, miners, tokens_per_sec AS "tokensPerSec" FROM stage_loads WHERE run_id = $1 AND miners > 0 ORDER BY stage`, [runId]);
}

/** The run's active miners, and how many stages hold at least one. */
export async function activeCounts(db: Queryable, runId: number): Promise<{ miners: number; stagesHeld: number }> {
  const [row] = await db.query<{ miners: number; stagesHeld: number }>(
    `SELECT coalesce(sum(miners), 0)::int AS miners, count(*) FILTER (WHERE miners > 0)::int AS "stagesHeld" FROM stage_loads WHERE run_id = $1`,
    [runId],
  );
  return row ?? { miners: 0, stagesHeld: 0 };
}
