import { boundaryCodec } from '@train-at-home/model';
import type { FastifyPluginAsync } from 'fastify';
import type { Coordinator } from '../coordinator';
import type { DashboardFeed } from '../dashboard/feed';
import { bigramLoss, lastIds, latestSettled, samples, swarmSnapshot } from '../dashboard/snapshot';
import { answerBadRequests, integer, limit, type Query } from './query';

export const DEFAULT_SAMPLES = 10;
export const MAX_SAMPLES = 100;

/**
 * The dashboard's REST: its first paint (the swarm now, the newest sample, the
 * bigram baseline, the newest settled epoch, where the live feed's series
 * stand) and the samples of what the model writes, paged. Loss history is
 * GET /api/metrics/:series (routes/status.ts); the leaderboard and epochs are
 * routes/incentives.ts. Read-only, for anyone.
 */
export const dashboardRoutes: FastifyPluginAsync<{ coordinator: Coordinator; feed: DashboardFeed }> = async (app, { coordinator, feed }) => {
  answerBadRequests(app);

  app.get('/api/dashboard', async () => {
    const [swarm, latest, bigram, settled, cursors] = await Promise.all([swarmSnapshot(coordinator), samples(coordinator, 1), bigramLoss(coordinator), latestSettled(coordinator), lastIds(coordinator)]);
    return {
      run: { name: coordinator.run.name, preset: coordinator.run.preset, stages: coordinator.run.stages, bottleneck: coordinator.run.bottleneck, codec: boundaryCodec(coordinator.run) },
      pushMs: feed.pushMs,
      swarm,
      sample: latest[0] ?? null,
      bigramLoss: bigram ?? null,
      settledEpoch: settled ?? null,
      // The coordinator's last restart: a time nothing could be recorded (null on a first start).
      outage: coordinator.outage ?? null,
      lastIds: { trainLoss: cursors.train_loss, heldOutLoss: cursors.heldout_loss },
    };
  });

  /** What the model wrote after merged rounds, newest first (`before` an id). */
  app.get<{ Querystring: Query }>('/api/samples', async (req) => {
    const n = limit(req.query, DEFAULT_SAMPLES, MAX_SAMPLES);
    const before = integer(req.query, 'before', 2 ** 31 - 1);
    const rows = await samples(coordinator, n + 1, before);
    const page = rows.slice(0, n);
    return { samples: page, nextBefore: rows.length > n ? page[page.length - 1]!.id : null };
  });
};
