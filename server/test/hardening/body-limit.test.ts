import { afterEach, describe, expect, it } from 'vitest';
import { hardeningHarness, rawRequest } from '@train-at-home/testkit/hardening-harness';

/** Defect 2: a 60 MB JSON body to the checkpoint route was read whole before it was refused, and stalled everything. */
describe('a large body', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  it('is refused from its headers, before it is read, and the coordinator stays responsive', async () => {
    const { app, url } = await h.start();
    const rss = process.memoryUsage().rss;
    // Headers promise 60 MB of JSON; one byte follows. An answer can only come from the headers.
    const head = `PUT /api/checkpoints/0 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${60 * 1024 * 1024}\r\n\r\n`;
    expect((await rawRequest(url, head, Buffer.from('{'))).status).toBe(415);
    const octets = `PUT /api/checkpoints/0 HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: ${65 * 1024 * 1024}\r\nx-miner-id: ${'ab'.repeat(32)}\r\n\r\n`;
    expect((await rawRequest(url, octets, Buffer.alloc(1))).status).toBe(413);
    const stranger = octets.replace(`${65 * 1024 * 1024}`, `${1024 * 1024}`);
    expect((await rawRequest(url, stranger, Buffer.alloc(1))).status).toBe(403);
    // A JSON body over the 64 KiB limit of every other route is refused from its length too.
    const json = `POST /api/rewards/challenge HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${10 * 1024 * 1024}\r\n\r\n`;
    expect((await rawRequest(url, json, Buffer.from('{'))).status).toBe(413);
    const status = await app.fastify.inject({ method: 'GET', url: '/api/status' });
    expect(status.statusCode).toBe(200);
    expect(process.memoryUsage().rss - rss).toBeLessThan(50 * 1024 * 1024);
    expect(await app.db.query('SELECT 1 FROM checkpoints')).toEqual([]);
  });
});
