import { contentHash } from '@train-at-home/model';
import { verifySignature } from '@train-at-home/protocol';
import type { FastifyPluginAsync } from 'fastify';
import type { Coordinator } from '../coordinator';
import { AuditError, MAX_RECORD_BYTES, type Auditor } from '../jobs/audits';

const STATUS: Record<AuditError['code'], number> = { NO_SUCH_AUDIT: 404, NOT_YOUR_AUDIT: 403, WRONG_RECORD: 409, BAD_RECORD: 400, TOO_LARGE: 413 };

/**
 * Audits: a miner uploads the record of its round drawn for an audit
 * (application/octet-stream), signed with its key over { runId, auditId,
 * hash } (nobody can answer, and so fail, an audit for someone else). And
 * anyone can check the draw: each round's commitment, its secret once
 * revealed, the replicas drawn at the run's full rate (unproven), and the audits it chose with their outcome.
 */
export const auditRoutes: FastifyPluginAsync<{ audits: Auditor; coordinator: Coordinator }> = async (app, { audits, coordinator }) => {
  // When each request's headers came, before its body: the body's upload time is measured from here.
  const began = new WeakMap<object, number>();
  app.addHook('onRequest', async (req) => void began.set(req.raw, performance.now()));
  app.addContentTypeParser('application/octet-stream', { parseAs: 'buffer', bodyLimit: MAX_RECORD_BYTES }, (_req, body, done) => done(null, body));
  app.put<{ Params: { auditId: string } }>('/api/audits/:auditId', { bodyLimit: MAX_RECORD_BYTES }, async (req, reply) => {
    // The body has arrived: the time since its headers did is its upload's, the miner's measured rate (audits.ts).
    const uploadMs = performance.now() - (began.get(req.raw) ?? performance.now());
    const { auditId } = req.params;
    const minerId = String(req.headers['x-miner-id'] ?? '');
    const signature = String(req.headers['x-signature'] ?? '');
    if (!/^[0-9a-f]{32}$/.test(auditId)) return reply.code(404).send({ error: 'NO_SUCH_AUDIT', message: 'an audit id is 32 hex characters' });
    if (!/^[0-9a-f]{64}$/.test(minerId)) return reply.code(400).send({ error: 'BAD_REQUEST', message: 'x-miner-id (64 hex characters) is required' });
    if (!(req.body instanceof Buffer)) return reply.code(415).send({ error: 'BAD_CONTENT_TYPE', message: 'send the record as application/octet-stream' });
    const bytes = new Uint8Array(req.body.buffer, req.body.byteOffset, req.body.byteLength);
    if (!verifySignature('audit', { runId: coordinator.runId, auditId, hash: contentHash(bytes) }, signature, `0x${minerId}`)) {
      return reply.code(401).send({ error: 'BAD_SIGNATURE', message: 'x-signature over { runId, auditId, hash } does not verify for x-miner-id' });
    }
    try {
      await audits.answer(auditId, minerId, bytes, uploadMs);
    } catch (e) {
      if (e instanceof AuditError) return reply.code(STATUS[e.code]).send({ error: e.code, message: e.message });
      throw e;
    }
    return reply.code(202).send({ auditId, status: 'replaying' });
  });

  app.get<{ Querystring: { stage?: string; round?: string } }>('/api/audits', async (req, reply) => {
    const stage = Number(req.query.stage ?? NaN);
    const round = Number(req.query.round ?? NaN);
    if (!Number.isInteger(stage) || !Number.isInteger(round) || stage < 0 || round < 0 || round > 2 ** 31 - 1 || stage > 63) {
      return reply.code(400).send({ error: 'BAD_REQUEST', message: 'stage and round (non-negative integers) are required' });
    }
    const [draw] = await coordinator.db.query<{ commitment: string; secret: string; rate: number; full_rate: number | null; unproven: string[] | string | null; revealed_at: Date | null }>(
      'SELECT commitment, secret, rate, full_rate, unproven, revealed_at FROM audit_rounds WHERE run_id = $1 AND stage = $2 AND round = $3',
      [coordinator.runId, stage, round],
    );
    if (!draw) return reply.code(404).send({ error: 'NO_SUCH_ROUND', message: `no audit draw for stage ${stage}, round ${round}` });
    const committed = await coordinator.db.query<{ miner_id: string }>('SELECT miner_id FROM round_commitments WHERE run_id = $1 AND stage = $2 AND round = $3 ORDER BY miner_id', [coordinator.runId, stage, round]);
    const chosen = await coordinator.db.query<{ miner_id: string; status: string; reason: string | null; validator_ms: number | null }>(
      'SELECT miner_id, status, reason, validator_ms FROM audits WHERE run_id = $1 AND stage = $2 AND round = $3 ORDER BY miner_id',
      [coordinator.runId, stage, round],
    );
    return {
      stage,
      round,
      commitment: draw.commitment,
      rate: draw.rate,
      // The run's rate, at which the replicas named in unproven (too few audits passed when the round closed) were drawn.
      fullRate: draw.full_rate ?? draw.rate,
      unproven: draw.revealed_at && draw.unproven ? ((typeof draw.unproven === 'string' ? JSON.parse(draw.unproven) : draw.unproven) as string[]) : [],
      // The secret only once the round closed: before, it would tell miners which rounds are safe to cheat in.
      secret: draw.revealed_at ? draw.secret : null,
      committed: committed.map((c) => c.miner_id),
      audits: chosen.map((a) => ({ miner: a.miner_id, status: a.status, reason: a.reason, validatorMs: a.validator_ms })),
    };
  });
};
