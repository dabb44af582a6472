import { generateIdentity } from '@train-at-home/protocol';
import { register } from '@train-at-home/swarm';
import { afterEach, describe, expect, it } from 'vitest';
import { hardeningHarness } from '@train-at-home/testkit/hardening-harness';

/** Defect 4: out-of-range integers reached the database and came back as 500s carrying its internals. */
describe('out-of-range numbers', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  it('in checkpoint stages and steps get a named 4xx, never a 500 with database internals', async () => {
    const { app, url } = await h.start();
    const { minerId } = await register(await h.open(url), generateIdentity(), { backend: 'wasm', tokensPerSec: 1 }); // stage 0
    for (const stage of ['2147483648', '1e10', '9007199254740993', '3', '-1', '01']) {
      const res = await app.fastify.inject({ method: 'GET', url: `/api/checkpoints/${stage}/latest` });
      expect([res.statusCode, res.json().error], stage).toEqual([404, 'NO_SUCH_STAGE']);
    }
    const put = await app.fastify.inject({
      method: 'PUT',
      url: '/api/checkpoints/0',
      headers: { 'content-type': 'application/octet-stream', 'x-miner-id': minerId, 'x-step': '2147483648', 'x-signature': '0x00' },
      payload: Buffer.alloc(16),
    });
    expect([put.statusCode, put.json().error]).toEqual([400, 'SCHEMA']);
    expect(await app.db.query('SELECT 1 FROM checkpoints')).toEqual([]);
  });
});
