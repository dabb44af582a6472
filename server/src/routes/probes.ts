import type { FastifyPluginAsync } from 'fastify';
import type { SpotChecker } from '../jobs/spot-checks';
import { MAX_PROBE_BYTES, ProbeError } from '../jobs/spot-checks';

const STATUS: Record<ProbeError['code'], number> = { NO_SUCH_PROBE: 404, NOT_YOUR_PROBE: 403, HASH_MISMATCH: 409, TOO_LARGE: 413 };

/**
 * Answers to the validator's probes: a miner uploads the payload of a sampled
 * transfer it took part in (application/octet-stream). Only probes the
 * coordinator sent are open, only to the miner asked, and only the bytes
 * both ends of the transfer confirmed are taken.
 */
export const probeRoutes: FastifyPluginAsync<{ spotChecks: SpotChecker }> = async (app, { spotChecks }) => {
  app.addContentTypeParser('application/octet-stream', { parseAs: 'buffer', bodyLimit: MAX_PROBE_BYTES }, (_req, body, done) => done(null, body));
  app.put<{ Params: { probeId: string } }>('/api/probes/:probeId', { bodyLimit: MAX_PROBE_BYTES }, async (req, reply) => {
    const { probeId } = req.params;
    const minerId = String(req.headers['x-miner-id'] ?? '');
    if (!/^[0-9a-f]{32}$/.test(probeId)) return reply.code(404).send({ error: 'NO_SUCH_PROBE', message: 'a probe id is 32 hex characters' });
    if (!/^[0-9a-f]{64}$/.test(minerId)) return reply.code(400).send({ error: 'SCHEMA', message: 'x-miner-id (64 hex characters) is required' });
    if (!(req.body instanceof Buffer)) return reply.code(415).send({ error: 'BAD_CONTENT_TYPE', message: 'send the payload as application/octet-stream' });
    try {
      await spotChecks.answer(probeId, minerId, new Uint8Array(req.body.buffer, req.body.byteOffset, req.body.byteLength));
    } catch (e) {
      if (e instanceof ProbeError) return reply.code(STATUS[e.code]).send({ error: e.code, message: e.message });
      throw e;
    }
    return reply.code(204).send();
  });
};
