import type { Socket as NetSocket } from 'node:net';
import { createConnection } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { hardeningHarness, rawRequest } from '@train-at-home/testkit/hardening-harness';

/** Defect 3: a body that never finished held its connection for ever, and connections per IP had no cap. */
describe('a request that never finishes', () => {
  const h = hardeningHarness();
  afterEach(() => h.close());

  it('times out, and connections per IP address are capped', async () => {
    const { url } = await h.start('hardening-limits', undefined, { http: { requestTimeoutMs: 1500, headersTimeoutMs: 1500, maxConnectionsPerIp: 4 } });
    // A body of 32 KiB promised (within the JSON limit), 12 bytes sent: answered 408 and closed once the request's time is up.
    const head = `POST /api/rewards/challenge HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${32 * 1024}\r\n\r\n`;
    const slow = await rawRequest(url, head, Buffer.from('{"kind":"li"'));
    expect(slow.status === 408 || slow.status === 'closed', JSON.stringify(slow)).toBe(true);
    expect(slow.ms).toBeLessThan(10_000);
    // Four connections from this address stay open; a fifth is closed at once.
    const { hostname, port } = new URL(url);
    const held = await Promise.all(Array.from({ length: 4 }, () => new Promise<NetSocket>((r) => h.raw.push(createConnection({ host: hostname, port: Number(port) }, function (this: NetSocket) { r(this); })))));
    const fifth = createConnection({ host: hostname, port: Number(port) });
    await new Promise<void>((r) => fifth.once('close', () => r()));
    // Once one closes, a new connection is served.
    held.pop()!.destroy();
    await new Promise((r) => setTimeout(r, 200));
    expect((await fetch(`${url}/api/status`)).status).toBe(200);
  });

  it('leaves the cap to a trusted load balancer: connections from it are not counted', async () => {
    const { url } = await h.start('hardening-limits-proxy', undefined, { http: { maxConnectionsPerIp: 2, trustedProxies: ['loopback'] } });
    const { hostname, port } = new URL(url);
    await Promise.all(Array.from({ length: 5 }, () => new Promise<NetSocket>((r) => h.raw.push(createConnection({ host: hostname, port: Number(port) }, function (this: NetSocket) { r(this); })))));
    // Five held from the balancer's address, and a sixth request still served.
    expect((await fetch(`${url}/api/status`)).status).toBe(200);
    await new Promise((r) => setTimeout(r, 200));
    expect(h.raw.filter((s) => !s.destroyed).length).toBeGreaterThanOrEqual(5);
  });
});
