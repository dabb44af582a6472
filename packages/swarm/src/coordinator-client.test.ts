import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { getRetrying } from './coordinator-client';

let server: Server | undefined;
const stop = (): Promise<void> =>
  new Promise<void>((r) => {
    if (!server) return r();
    server.closeAllConnections();
    server.close(() => r());
    server = undefined;
  });
afterEach(stop);

/** A server that closes the connection of its first `drop` requests instead of answering (what a miner sees as "fetch failed"). */
async function flaky(drop: number): Promise<{ url: string; requests: () => number }> {
  let n = 0;
  server = createServer((req, res) => {
    if (++n <= drop) return void req.socket.destroy();
    res.end('weights');
  });
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/x`, requests: () => n };
}

describe('getRetrying', () => {
  it('gets through connections closed before an answer, and gives up by name after its attempts', async () => {
    const twice = await flaky(2);
    const res = await getRetrying(twice.url);
    expect(await res.text()).toBe('weights');
    expect(twice.requests()).toBe(3);
    await stop();
    const always = await flaky(Infinity);
    await expect(getRetrying(always.url, 2)).rejects.toThrow(/fetch failed/);
    expect(always.requests()).toBe(2);
  });
});
