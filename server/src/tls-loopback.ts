import { X509Certificate } from 'node:crypto';
import { createServer, type Socket } from 'node:net';
import { connect } from 'node:tls';

/**
 * A plain-HTTP door on 127.0.0.1 into this coordinator's own HTTPS server, for the miners it starts on its machine
 * (local-miners.ts): a certificate names the address people open, never 127.0.0.1. Each connection through it is
 * carried over TLS to the HTTPS server's address and port, and only to a server that presents this certificate (its
 * SHA-256 fingerprint, pinned: a self-signed certificate and one a CA issued alike).
 */
export async function loopbackDoor(httpsHost: string, httpsPort: number, cert: string | Buffer): Promise<{ url: string; close(): Promise<void> }> {
  const pinned = new X509Certificate(cert).fingerprint256;
  const open = new Set<Socket>();
  const server = createServer((plain) => {
    plain.pause();
    const secure = connect({ host: httpsHost, port: httpsPort, rejectUnauthorized: false });
    const both = [plain, secure];
    for (const s of both) {
      open.add(s);
      s.once('close', () => {
        open.delete(s);
        both.forEach((o) => o.destroy());
      });
      s.on('error', () => both.forEach((o) => o.destroy()));
    }
    secure.once('secureConnect', () => {
      if (secure.getPeerCertificate().fingerprint256 !== pinned) return both.forEach((o) => o.destroy());
      plain.pipe(secure).pipe(plain);
      plain.resume();
    });
  });
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        open.forEach((s) => s.destroy());
        server.close(() => resolve());
      }),
  };
}
