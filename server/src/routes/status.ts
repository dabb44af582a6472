import type { FastifyPluginAsync } from 'fastify';
import type { Coordinator } from '../coordinator';

/** Read-only REST: the run, its stage map and its checkpoints. */
export const statusRoutes: FastifyPluginAsync<{ coordinator: Coordinator }> = async (app, { coordinator }) => {
  app.get('/api/status', async () => {
    const [{ count }] = await coordinator.db.query<{ count: number }>(
      `SELECT count(*)::int AS count FROM miners WHERE run_id = $1 AND status = 'active'`,
      [coordinator.runId],
    ) as [{ count: number }];
    return { run: coordinator.run, activeMiners: count, database: coordinator.db.kind };
  });
  app.get('/api/stages', async () => ({ stages: await coordinator.stageMap() }));
  const series = (name: string) =>
    coordinator.db.query(`SELECT epoch, value, created_at AS "createdAt" FROM metrics WHERE run_id = $1 AND name = $2 ORDER BY created_at`, [coordinator.runId, name]);
  app.get('/api/metrics', async () => ({ trainLoss: await series('train_loss'), heldOutLoss: await series('heldout_loss') }));
  app.get('/api/merges', async () => ({
    stages: coordinator.phases.status(),
    rounds: await coordinator.db.query(
      `SELECT stage, epoch AS round, phase, mode, participants, merged_hash AS "mergedHash", clipped, started_at AS "startedAt", ended_at AS "endedAt"
       FROM epochs WHERE run_id = $1 ORDER BY epoch, stage`,
      [coordinator.runId],
    ),
    events: await coordinator.db.query(
      `SELECT stage, round, kind, miner_id AS "minerId", reporter, detail, created_at AS "createdAt" FROM merge_events WHERE run_id = $1 ORDER BY id`,
      [coordinator.runId],
    ),
  }));
  app.get('/api/receipts', async () => coordinator.receiptSummary());
  app.get('/api/checkpoints', async () => ({
    checkpoints: await coordinator.db.query(
      `SELECT stage, epoch, hash, bytes, created_at AS "createdAt" FROM checkpoints WHERE run_id = $1 ORDER BY epoch DESC, stage`,
      [coordinator.runId],
    ),
  }));
};
