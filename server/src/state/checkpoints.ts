import type { Queryable } from '../db/database';

/** The run's state a read of it needs: its database and which run. */
export interface RunState {
  db: Queryable;
  runId: number;
}

/** The latest agreed weights of a stage and the merge round they are the result of (what a late joiner and an audit start from). */
export async function latestCheckpoint(run: RunState, stage: number): Promise<{ data: Uint8Array; epoch: number } | undefined> {
  if (!Number.isInteger(stage)) return undefined;
  // Only a round's agreed weights: what its majority of replicas ended with (phases.ts), never a lone upload.
  const [row] = await run.db.query<{ data: Uint8Array; epoch: number }>(
    `SELECT c.data, c.epoch FROM checkpoints c JOIN epochs e ON e.run_id = c.run_id AND e.stage = c.stage AND e.epoch = c.epoch AND e.merged_hash = c.hash
     WHERE c.run_id = $1 AND c.stage = $2 AND c.data IS NOT NULL ORDER BY c.epoch DESC, c.created_at DESC LIMIT 1`,
    [run.runId, stage],
  );
  return row ? { data: new Uint8Array(row.data), epoch: row.epoch } : undefined;
}
