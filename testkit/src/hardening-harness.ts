import { createConnection, type Socket as NetSocket } from 'node:net';
import { io as connect, type Socket } from 'socket.io-client';
import { buildApp, type App, type AppOptions } from '@train-at-home/server/app';
import { testDatabase } from './database';

/**
 * What each hardening test (one file per defect of issue 16) starts: a
 * coordinator of the `tiny` run on the test database, listening on a free
 * loopback port, and the client connections it opens; all closed after each test
 * (the test says so: `afterEach(() => h.close())`).
 */
export function hardeningHarness() {
  let app: App | undefined;
  const sockets: Socket[] = [];
  /** Raw TCP connections a test holds open (closed before the app, which waits for them). */
  const raw: NetSocket[] = [];

  return {
    raw,
    /** Disconnects the clients, destroys the raw connections, then closes the coordinator. */
    async close(): Promise<void> {
      sockets.splice(0).forEach((s) => s.disconnect());
      raw.splice(0).forEach((c) => c.destroy());
      await app?.close();
      app = undefined;
    },
    /** Disconnects every socket.io client opened so far. */
    disconnectAll(): void {
      sockets.splice(0).forEach((s) => s.disconnect());
    },
    /** A `tiny` run of 3 stages unless `options.run` says otherwise. */
    async start(name = 'hardening', database?: Awaited<ReturnType<typeof testDatabase>>, options: Omit<AppOptions, 'database'> = {}): Promise<{ app: App; url: string }> {
      app = await buildApp({ ...options, run: { preset: 'tiny', stages: 3, bottleneck: 32, ...options.run, name }, database: database ?? (await testDatabase()) });
      return { app, url: await app.fastify.listen({ port: 0, host: '127.0.0.1' }) };
    },
    /** A socket.io client connection; `localAddress` another loopback address it connects from (127.0.0.2…), as another host would. */
    async open(url: string, transports: Array<'websocket' | 'polling'> = ['websocket'], localAddress?: string): Promise<Socket> {
      const socket = connect(url, { transports, reconnection: false, forceNew: true, ...(localAddress ? { localAddress } : {}) } as Parameters<typeof connect>[1]);
      sockets.push(socket);
      await new Promise<void>((resolve, reject) => {
        socket.once('connect', resolve);
        socket.once('connect_error', reject);
      });
      return socket;
    },
  };
}

export type Reply = { ok: boolean; error?: { code: string; message?: string; retryAfterMs?: number }; [k: string]: unknown };

export const emitWithAck = (socket: Socket, event: string, ...args: unknown[]): Promise<Reply> => new Promise((resolve) => socket.emit(event, ...args, resolve));

export const stageMap = async (a: App): Promise<string[][]> => (await a.coordinator.stageMap()).map((s) => s.miners.map((m) => m.id));

/** Sends a request's headers and the first bytes of its body by hand; resolves with the status the server answers, or 'closed'. */
export function rawRequest(url: string, head: string, body: Buffer): Promise<{ status: number | 'closed'; ms: number }> {
  const { hostname, port } = new URL(url);
  const started = performance.now();
  return new Promise((resolve) => {
    const socket = createConnection({ host: hostname, port: Number(port) }, () => socket.write(Buffer.concat([Buffer.from(head), body])));
    let data = '';
    socket.on('data', (c) => (data += c.toString()));
    const done = (): void => {
      const m = /^HTTP\/1\.1 (\d{3})/.exec(data);
      resolve({ status: m ? Number(m[1]) : 'closed', ms: performance.now() - started });
    };
    socket.on('close', done);
    socket.on('error', () => {});
    socket.setTimeout(15_000, () => socket.destroy());
    // An answer may come before the server closes: take it as soon as its status line is in.
    socket.on('data', () => /^HTTP\/1\.1 \d{3}/.test(data) && (socket.destroy(), undefined));
  });
}
