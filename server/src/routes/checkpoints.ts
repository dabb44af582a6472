import { PRESETS, WeightsError, checkStageWeights, contentHash, countStageParameters, stageSpecs, type StageSpec } from '@train-at-home/model';
import { verifySignature } from '@train-at-home/protocol';
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import type { Coordinator } from '../coordinator';
import { latestCheckpoint } from '../state/checkpoints';

/** Room beyond a stage's fp32 values for the weights blob's header (names and shapes). */
const HEADER_ROOM_BYTES = 1024 * 1024;

/**
 * The largest body a checkpoint upload of this run may have: its largest
 * stage's weights in fp32 and their header (the `small` preset's largest
 * stage is ~10 MB; a 4-stage `gpu` run's ~99 MB). Anything longer is refused
 * from its content-length, unread.
 */
export function checkpointLimitBytes(specs: StageSpec[]): number {
  return Math.max(...specs.map(countStageParameters)) * 4 + HEADER_ROOM_BYTES;
}
/** Checkpoints kept per stage; older ones are deleted, but for those an audit still to replay may start from. */
export const KEEP_CHECKPOINTS = 3;

function fail(reply: FastifyReply, status: number, code: string, message: string): FastifyReply {
  return reply.code(status).send({ error: code, message });
}

/**
 * Stage checkpoints: a miner uploads its stage's weights (signed over run,
 * stage, step and content hash); a late joiner downloads the latest. Every
 * upload is checked against the stage's parameter list before it is stored.
 */
const MAX_INT4 = 2 ** 31 - 1;

export const checkpointRoutes: FastifyPluginAsync<{ coordinator: Coordinator }> = async (app, { coordinator }) => {
  const specs = stageSpecs(PRESETS[coordinator.run.preset], coordinator.run);
  const maxBytes = checkpointLimitBytes(specs);
  app.addContentTypeParser('application/octet-stream', { parseAs: 'buffer', bodyLimit: maxBytes }, (_req, body, done) => done(null, body));

  /** A stage index of this run from a path parameter (digits only), else undefined. */
  const stageOf = (raw: string): number | undefined => (/^(?:0|[1-9][0-9]{0,3})$/.test(raw) && Number(raw) < specs.length ? Number(raw) : undefined);

  /**
   * The large body limit is this route's, for weights only: an upload is refused from its headers
   * (path, type, length, an active miner of the stage) before a byte of its body is read.
   */
  const beforeBody = async (req: FastifyRequest<{ Params: { stage: string } }>, reply: FastifyReply): Promise<FastifyReply | undefined> => {
    const stage = stageOf(req.params.stage);
    if (stage === undefined) return fail(reply, 404, 'NO_SUCH_STAGE', `stage ${req.params.stage.slice(0, 20)}`);
    const type = String(req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
    if (type !== 'application/octet-stream') return fail(reply, 415, 'BAD_CONTENT_TYPE', 'send the weights as application/octet-stream');
    const length = Number(req.headers['content-length'] ?? NaN);
    if (!Number.isSafeInteger(length) || length < 0) return fail(reply, 411, 'LENGTH_REQUIRED', 'say the body\'s content-length');
    if (length > maxBytes) return fail(reply, 413, 'TOO_LARGE', `${length} bytes exceed ${maxBytes}`);
    const minerId = String(req.headers['x-miner-id'] ?? '');
    if (!/^[0-9a-f]{64}$/.test(minerId)) return fail(reply, 400, 'SCHEMA', 'x-miner-id (64 hex) is required');
    const [miner] = await coordinator.db.query<{ stage: number; status: string }>('SELECT stage, status FROM miners WHERE id = $1 AND run_id = $2', [minerId, coordinator.runId]);
    if (miner?.status !== 'active' || miner.stage !== stage) return fail(reply, 403, 'NOT_YOUR_STAGE', 'only an active miner of this stage may upload its weights');
    return undefined;
  };

  app.put<{ Params: { stage: string } }>('/api/checkpoints/:stage', { bodyLimit: maxBytes, onRequest: beforeBody }, async (req, reply) => {
    const stage = stageOf(req.params.stage)!;
    if (!(req.body instanceof Buffer)) return fail(reply, 415, 'BAD_CONTENT_TYPE', 'send the weights as application/octet-stream');
    const minerId = String(req.headers['x-miner-id']); // checked by beforeBody
    const rawStep = String(req.headers['x-step'] ?? '');
    const step = Number(rawStep);
    const signature = String(req.headers['x-signature'] ?? '');
    // The step is the merge round: an int4 column.
    if (!/^(?:0|[1-9][0-9]{0,9})$/.test(rawStep) || step > MAX_INT4) return fail(reply, 400, 'SCHEMA', `x-step (an integer in 0…${MAX_INT4}) is required`);
    const bytes = new Uint8Array(req.body.buffer, req.body.byteOffset, req.body.byteLength);
    const hash = contentHash(bytes);
    if (!verifySignature('checkpoint', { runId: coordinator.runId, stage, step, hash }, signature, `0x${minerId}`)) {
      return fail(reply, 401, 'BAD_SIGNATURE', 'signature over { runId, stage, step, hash } does not verify');
    }
    // Asked again now that the body is in: the miner may have left or moved while it uploaded.
    const [miner] = await coordinator.db.query<{ stage: number; status: string }>('SELECT stage, status FROM miners WHERE id = $1 AND run_id = $2', [minerId, coordinator.runId]);
    if (miner?.status !== 'active' || miner.stage !== stage) return fail(reply, 403, 'NOT_YOUR_STAGE', 'only an active miner of this stage may upload its weights');
    try {
      checkStageWeights(bytes, specs[stage]!);
    } catch (e) {
      if (e instanceof WeightsError) return fail(reply, 400, 'BAD_WEIGHTS', e.message);
      throw e;
    }
    // A round's checkpoint is its majority's weights: once the round has ended, only those are taken. (One
    // uploaded while it is still merging is kept until then, and dropped if the majority ended elsewhere.)
    const [round] = await coordinator.db.query<{ merged_hash: string | null; phase: string }>('SELECT merged_hash, phase FROM epochs WHERE run_id = $1 AND stage = $2 AND epoch = $3', [coordinator.runId, stage, step]);
    if (round && round.phase === 'training' && round.merged_hash !== hash) {
      return fail(reply, 409, 'CHECKPOINT_MISMATCH', `round ${step} of stage ${stage + 1} ended with weights ${round.merged_hash?.slice(0, 12) ?? '(none agreed)'}, not ${hash.slice(0, 12)}`);
    }
    await coordinator.db.transaction(async (tx) => {
      await tx.query(
        `INSERT INTO checkpoints (run_id, stage, epoch, hash, bytes, miner_id, data) VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (run_id, stage, epoch) DO UPDATE SET hash = $4, bytes = $5, miner_id = $6, data = $7, created_at = now()`,
        [coordinator.runId, stage, step, hash, bytes.length, minerId, bytes],
      );
      await tx.query(
        // An audit still to replay starts from a recent checkpoint of its stage: those are kept until it is done.
        `DELETE FROM checkpoints WHERE run_id = $1 AND stage = $2 AND epoch NOT IN
           (SELECT epoch FROM checkpoints WHERE run_id = $1 AND stage = $2 ORDER BY epoch DESC LIMIT $3)
           AND epoch < coalesce((SELECT min(round) - $4 FROM audits WHERE run_id = $1 AND stage = $2 AND status IN ('open', 'replaying')), 2147483647)`,
        [coordinator.runId, stage, KEEP_CHECKPOINTS, KEEP_CHECKPOINTS],
      );
    });
    return reply.code(201).send({ stage, step, hash });
  });

  app.get<{ Params: { stage: string } }>('/api/checkpoints/:stage/latest', async (req, reply) => {
    const stage = stageOf(req.params.stage);
    if (stage === undefined) return fail(reply, 404, 'NO_SUCH_STAGE', `stage ${req.params.stage.slice(0, 20)}`);
    const latest = await latestCheckpoint(coordinator, stage);
    if (!latest) return fail(reply, 404, 'NO_CHECKPOINT', `no checkpoint for stage ${req.params.stage}`);
    // The merge round it is the result of: a miner's round record starts from it (audits replay from it).
    return reply.type('application/octet-stream').header('x-content-hash', contentHash(latest.data)).header('x-round', String(latest.epoch)).send(Buffer.from(latest.data));
  });
};
