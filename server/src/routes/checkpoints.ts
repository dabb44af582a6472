import { PRESETS, WeightsError, checkStageWeights, contentHash, stageSpecs } from '@train-at-home/model';
import { verifySignature } from '@train-at-home/protocol';
import type { FastifyPluginAsync, FastifyReply } from 'fastify';
import type { Coordinator } from '../coordinator';

/** Stage weights are at most this large (the `small` preset's largest stage is ~10 MB). */
export const MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024;
/** Checkpoints kept per stage; older ones are deleted. */
export const KEEP_CHECKPOINTS = 3;

function fail(reply: FastifyReply, status: number, code: string, message: string): FastifyReply {
  return reply.code(status).send({ error: code, message });
}

/**
 * Stage checkpoints: a miner uploads its stage's weights (signed over run,
 * stage, step and content hash); a late joiner downloads the latest. Every
 * upload is checked against the stage's parameter list before it is stored.
 */
export const checkpointRoutes: FastifyPluginAsync<{ coordinator: Coordinator }> = async (app, { coordinator }) => {
  app.addContentTypeParser('application/octet-stream', { parseAs: 'buffer', bodyLimit: MAX_CHECKPOINT_BYTES }, (_req, body, done) => done(null, body));
  const specs = stageSpecs(PRESETS[coordinator.run.preset], coordinator.run);

  app.put<{ Params: { stage: string } }>('/api/checkpoints/:stage', { bodyLimit: MAX_CHECKPOINT_BYTES }, async (req, reply) => {
    const stage = Number(req.params.stage);
    if (!Number.isInteger(stage) || stage < 0 || stage >= specs.length) return fail(reply, 404, 'NO_SUCH_STAGE', `stage ${req.params.stage}`);
    if (!(req.body instanceof Buffer)) return fail(reply, 415, 'BAD_CONTENT_TYPE', 'send the weights as application/octet-stream');
    const minerId = String(req.headers['x-miner-id'] ?? '');
    const step = Number(req.headers['x-step']);
    const signature = String(req.headers['x-signature'] ?? '');
    if (!/^[0-9a-f]{64}$/.test(minerId) || !Number.isInteger(step) || step < 0) return fail(reply, 400, 'SCHEMA', 'x-miner-id and x-step are required');
    const bytes = new Uint8Array(req.body.buffer, req.body.byteOffset, req.body.byteLength);
    const hash = contentHash(bytes);
    if (!verifySignature('checkpoint', { runId: coordinator.runId, stage, step, hash }, signature, `0x${minerId}`)) {
      return fail(reply, 401, 'BAD_SIGNATURE', 'signature over { runId, stage, step, hash } does not verify');
    }
    const [miner] = await coordinator.db.query<{ stage: number; status: string }>('SELECT stage, status FROM miners WHERE id = $1 AND run_id = $2', [minerId, coordinator.runId]);
    if (miner?.status !== 'active' || miner.stage !== stage) return fail(reply, 403, 'NOT_YOUR_STAGE', 'only an active miner of this stage may upload its weights');
    try {
      checkStageWeights(bytes, specs[stage]!);
    } catch (e) {
      if (e instanceof WeightsError) return fail(reply, 400, 'BAD_WEIGHTS', e.message);
      throw e;
    }
    await coordinator.db.transaction(async (tx) => {
      await tx.query(
        `INSERT INTO checkpoints (run_id, stage, epoch, hash, bytes, miner_id, data) VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (run_id, stage, epoch) DO UPDATE SET hash = $4, bytes = $5, miner_id = $6, data = $7, created_at = now()`,
        [coordinator.runId, stage, step, hash, bytes.length, minerId, bytes],
      );
      await tx.query(
        `DELETE FROM checkpoints WHERE run_id = $1 AND stage = $2 AND epoch NOT IN
           (SELECT epoch FROM checkpoints WHERE run_id = $1 AND stage = $2 ORDER BY epoch DESC LIMIT $3)`,
        [coordinator.runId, stage, KEEP_CHECKPOINTS],
      );
    });
    return reply.code(201).send({ stage, step, hash });
  });

  app.get<{ Params: { stage: string } }>('/api/checkpoints/:stage/latest', async (req, reply) => {
    const stage = Number(req.params.stage);
    const latest = await latestCheckpoint(coordinator, stage);
    if (!latest) return fail(reply, 404, 'NO_CHECKPOINT', `no checkpoint for stage ${req.params.stage}`);
    return reply.type('application/octet-stream').header('x-content-hash', contentHash(latest.data)).send(Buffer.from(latest.data));
  });
};

export async function latestCheckpoint(coordinator: Coordinator, stage: number): Promise<{ data: Uint8Array; epoch: number } | undefined> {
  if (!Number.isInteger(stage)) return undefined;
  const [row] = await coordinator.db.query<{ data: Uint8Array; epoch: number }>(
    'SELECT data, epoch FROM checkpoints WHERE run_id = $1 AND stage = $2 AND data IS NOT NULL ORDER BY epoch DESC, created_at DESC LIMIT 1',
    [coordinator.runId, stage],
  );
  return row ? { data: new Uint8Array(row.data), epoch: row.epoch } : undefined;
}
