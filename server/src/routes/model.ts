import type { FastifyPluginAsync, FastifyReply } from 'fastify';
import type { Coordinator } from '../coordinator';
import { ModelExportError, exportModel, exportableRounds, zipModel } from '../model-export';
import { BadRequest, answerBadRequests, integer, type Query } from './query';

const INT4_MAX = 2 ** 31 - 1;
const STATUS: Record<ModelExportError['code'], number> = { NO_SUCH_ROUND: 404, NO_COMMON_ROUND: 404, BAD_CHECKPOINT: 409, NO_TOKENIZER: 503 };

/**
 * GET /api/model?round=N: the model folder of a merge round (model-export.ts) as one zip, `<run>-round-<N>/…`;
 * without `round`, the latest round every stage holds. One archive is built at a time (a second request meanwhile
 * is told to come back), and the last one is kept: every tab that presses Download after a merge gets the same
 * bytes without the coordinator assembling them again.
 */
export const modelRoutes: FastifyPluginAsync<{ coordinator: Coordinator; dataRoot?: string }> = async (app, { coordinator, dataRoot }) => {
  answerBadRequests(app);
  let building = false;
  let last: { round: number; name: string; zip: Uint8Array } | undefined;
  app.get<{ Querystring: Query }>('/api/model', async (req, reply) => {
    for (const key of Object.keys(req.query)) if (key !== 'round') throw new BadRequest(`unknown parameter ${key.slice(0, 40)}`);
    const host = req.headers.host;
    const src = { db: coordinator.db, runId: coordinator.runId, run: coordinator.run, dataRoot, coordinator: host ? `${req.protocol}://${host}` : undefined };
    // A round's agreed weights never change once it has ended: the archive of one is kept.
    const round = integer(req.query, 'round', INT4_MAX) ?? (await exportableRounds(src))[0];
    if (last && last.round === round) return send(reply, last);
    if (building) return reply.code(503).header('retry-after', '5').send({ error: 'EXPORT_BUSY', message: 'a model is being assembled; try again in a few seconds' });
    building = true;
    try {
      const { round: at, files } = await exportModel(src, round);
      const name = `${coordinator.run.name}-round-${at}`.replace(/[^A-Za-z0-9._-]/g, '_');
      last = { round: at, name, zip: zipModel(name, files) };
      return send(reply, last);
    } catch (e) {
      if (e instanceof ModelExportError) return reply.code(STATUS[e.code]).send({ error: e.code, message: e.message });
      throw e;
    } finally {
      building = false;
    }
  });
};

function send(reply: FastifyReply, model: { round: number; name: string; zip: Uint8Array }): FastifyReply {
  return reply
    .type('application/zip')
    .header('content-disposition', `attachment; filename="${model.name}.zip"`)
    .header('x-round', String(model.round))
    .send(Buffer.from(model.zip.buffer, model.zip.byteOffset, model.zip.byteLength));
}
