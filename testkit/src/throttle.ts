import { createConnection, createServer, type AddressInfo, type Socket } from 'node:net';
import { Transform } from 'node:stream';

/**
 * A slow uplink in front of a coordinator: a TCP proxy on loopback whose client-to-server bytes of plain HTTP
 * connections (uploads: audit records, checkpoints, probe answers) are held to `bytesPerSec` once set, each
 * connection on its own; the socket.io WebSocket passes at full speed (heartbeats are not what is measured). A miner
 * given `url` instead of the coordinator's reaches it only through here. `bytesPerSec` 0: no limit.
 */
export interface ThrottledLink {
  url: string;
  bytesPerSec: number;
  /** Client-to-server bytes held back so far. */
  readonly throttledBytes: number;
  close(): Promise<void>;
}

const SLICE = 16 * 1024;

export async function throttledLink(target: string): Promise<ThrottledLink> {
  const { hostname, port } = new URL(target);
  const sockets = new Set<Socket>();
  const link = {
    url: '',
    bytesPerSec: 0,
    throttledBytes: 0,
    close: async (): Promise<void> => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const server = createServer((client) => {
    const upstream = createConnection({ host: hostname, port: Number(port) });
    sockets.add(client).add(upstream);
    const drop = (): void => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('error', drop).on('close', drop);
    upstream.on('error', drop).on('close', drop);
    let websocket: boolean | undefined;
    // A token bucket from the connection's first throttled byte: what the rate allows by now (up to a second's worth)
    // is sent at once, so a timer that fires late (this process busy) costs no throughput, only smoothness.
    let since = 0;
    let allowed = 0;
    const slow = new Transform({
      transform(chunk: Buffer, _encoding, done) {
        // The first bytes say which kind of connection it is: a WebSocket upgrade keeps its speed.
        websocket ??= /^GET [^\r\n]*\r\n(?:[^\r\n]+\r\n)*?upgrade: websocket/im.test(chunk.subarray(0, 4096).toString('latin1'));
        if (websocket || link.bytesPerSec <= 0) return done(null, chunk);
        void (async () => {
          if (!since) since = performance.now();
          let at = 0;
          while (at < chunk.length) {
            let budget = Math.floor(((performance.now() - since) / 1000) * link.bytesPerSec) - allowed;
            // At most a second's worth at once: a keep-alive connection idle for a while gets no burst of it.
            if (budget > link.bytesPerSec) {
              allowed += budget - link.bytesPerSec;
              budget = link.bytesPerSec;
            }
            const n = Math.min(chunk.length - at, budget);
            if (n <= 0) {
              await new Promise((r) => setTimeout(r, Math.max(1, (1000 * Math.min(SLICE, chunk.length - at)) / link.bytesPerSec)));
              continue;
            }
            this.push(chunk.subarray(at, at + n));
            at += n;
            allowed += n;
            link.throttledBytes += n;
          }
          done();
        })();
      },
    });
    client.pipe(slow).pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  link.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return link;
}
