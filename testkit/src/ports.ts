import { createServer, type AddressInfo } from 'node:net';

/** A port free on `host` now (for a server whose address must be known before it listens: a domain, a command line). */
export async function freePort(host = '127.0.0.1'): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}
