import wrtc from '@roamhq/wrtc';
import { encodeFrames, framedBytes, generateIdentity, PROTOCOL_VERSION, verifySignature, type Identity } from '@train-at-home/protocol';
import { DATA_DIR, datasetName, loadDataset, prepareData } from '@train-at-home/model/node';
import { CoordinatorError, MeshPort, NO_PATH, PeerMesh, coordinatorRelay, noPathText, coordinatorSignals, hostMesh, httpTokenSource, register, request, summarizePaths, TrafficMeter, countMesh, type MeshHost } from '@train-at-home/swarm';
import { io as connect, type Socket } from 'socket.io-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp, type App } from '../src/app';
import { testDatabase } from '@train-at-home/testkit/database';

let app: App;
let url: string;
const sockets: Socket[] = [];
const meshes: PeerMesh[] = [];

/** Each miner's byte counters by kind, as a Miner keeps them (traffic.ts): its mesh's messages and its coordinator socket. */
async function miner(relayOnly = false): Promise<{ id: string; socket: Socket; identity: Identity; mesh: PeerMesh; meter: TrafficMeter }> {
  const socket = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
  sockets.push(socket);
  const meter = new TrafficMeter();
  meter.countSocket(socket);
  await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
  const identity = generateIdentity();
  const { minerId } = await register(socket, identity, { backend: 'wasm', tokensPerSec: 100 });
  const signals = coordinatorSignals(socket, identity, (from, signed, signature) => verifySignature('signal', signed, signature, `0x${from}`));
  const mesh = new PeerMesh({ selfId: minerId, signals, wrtc, relay: coordinatorRelay(socket), relayOnly });
  countMesh(mesh, meter);
  meshes.push(mesh);
  return { id: minerId, socket, identity, mesh, meter };
}

function bytes(length: number, seed: number): Uint8Array {
  return Uint8Array.from({ length }, (_, i) => (i * 31 + seed) & 0xff);
}

beforeAll(async () => {
  app = await buildApp({
    database: await testDatabase(), run: { name: 'mesh', preset: 'tiny', stages: 2, bottleneck: 32 }, dataRoot: DATA_DIR,
    // The relay is off by default (network.ts); these tests use it, under a cap of 3 MB per miner per minute.
    network: { relay: { enabled: true, bytesPerMinute: 3_000_000 } } });
  url = await app.fastify.listen({ port: 0, host: '127.0.0.1' });
});
afterAll(async () => {
  meshes.forEach((m) => m.close());
  sockets.forEach((s) => s.disconnect());
  await app.close();
});

describe('peer mesh over WebRTC, signaled through the coordinator', () => {
  it('connects two registered miners directly and moves a chunked message both ways, the coordinator carrying no frame', async () => {
    const a = await miner();
    const b = await miner();
    const received = new Promise<{ from: string; payload: Uint8Array; pathway: number[] }>((resolve) =>
      b.mesh.onMessage((from, m) => resolve({ from, payload: m.payload, pathway: m.pathway })),
    );
    const payload = bytes(1_000_000, 1);
    const activationId = bytes(16, 9);
    await a.mesh.send(b.id, { kind: 'activation', runId: 1, epoch: 0, activationId, pathway: [0] }, payload);
    const got = await received;
    expect(got.from).toBe(a.id);
    expect(got.payload).toEqual(payload);
    expect(got.pathway).toEqual([0]);

    const back = new Promise<Uint8Array>((resolve) => a.mesh.onMessage((_from, m) => resolve(m.payload)));
    await b.mesh.send(a.id, { kind: 'gradient', runId: 1, epoch: 0, activationId, pathway: [0, 0] }, bytes(300_000, 2));
    expect(await back).toEqual(bytes(300_000, 2));

    expect(a.mesh.stats.bytesSent).toBeGreaterThan(1_000_000);
    expect(b.mesh.stats.bytesReceived).toBe(a.mesh.stats.bytesSent);
    expect(app.coordinator.relayed.frameBytes).toBe(0);
    expect(app.coordinator.relayed.signalBytes).toBeGreaterThan(0);
    // Each end names the pair's path (the ICE agent's selected pair: host candidates here) and its bytes.
    await expect.poll(() => a.mesh.paths().get(b.id)?.path).toBe('direct');
    expect(a.mesh.paths().get(b.id)).toMatchObject({ bytesSent: a.mesh.stats.bytesSent, bytesReceived: a.mesh.stats.bytesReceived });
    expect(b.mesh.paths().get(a.id)?.bytesReceived).toBe(a.mesh.stats.bytesSent);
    // Counted by kind as the frames that carried them, at both ends alike; signaling went over the coordinator's socket.
    expect(a.meter.read().activation).toEqual({ sent: a.mesh.stats.bytesSent, received: 0 });
    expect(a.mesh.stats.bytesSent).toBe(framedBytes(1_000_000, 1));
    expect(b.meter.read().activation).toEqual({ sent: 0, received: a.mesh.stats.bytesSent });
    expect(b.meter.read().gradient).toEqual({ sent: b.mesh.stats.bytesSent, received: 0 });
    expect(a.meter.read().gradient).toEqual({ sent: 0, received: framedBytes(300_000, 2) });
    for (const m of [a, b]) {
      const t = m.meter.read();
      expect(t.coordinator.sent).toBeGreaterThan(0);
      expect(t.coordinator.received).toBeGreaterThan(0);
      expect([t.merge, t.audit, t.checkpoint, t.data]).toEqual(Array(4).fill({ sent: 0, received: 0 }));
    }
  });

  it('says by name when no path reaches a peer (no direct connection, no TURN, no relay), after trying again with fresh ICE servers', async () => {
    const a = await miner();
    const b = await miner();
    b.mesh.close();
    b.socket.off('signal'); // b never answers: no connection can be made
    let refreshed = 0;
    const lonely = new PeerMesh({
      selfId: a.id,
      signals: coordinatorSignals(a.socket, a.identity, (from, signed, sig) => verifySignature('signal', signed, sig, `0x${from}`)),
      wrtc,
      connectTimeoutMs: 1500,
      refreshIce: async () => void refreshed++,
    });
    meshes.push(lonely);
    a.mesh.close();
    const sent = lonely.send(b.id, { kind: 'activation', runId: 1, epoch: 0, activationId: bytes(16, 5), pathway: [] }, bytes(10, 1));
    await expect(sent).rejects.toThrow(new RegExp(`^${NO_PATH}${b.id}: neither a direct connection nor TURN reached it, and this run has no coordinator relay`));
    expect(refreshed).toBe(1);
    expect(noPathText(2)).toMatch(/^cannot reach 2 peers: .*Try another network/);
  });

  it('an end that only answers learns that the connection never came: its mesh names the peer unreachable (a last stage sends nothing to fail)', async () => {
    const a = await miner();
    const b = await miner();
    b.mesh.close();
    b.socket.off('signal');
    const answering = new PeerMesh({
      selfId: b.id,
      signals: coordinatorSignals(b.socket, b.identity, (from, signed, sig) => verifySignature('signal', signed, sig, `0x${from}`)),
      wrtc,
      connectTimeoutMs: 1500,
    });
    meshes.push(answering);
    a.socket.off('signal'); // b's answer and candidates never reach a: neither end connects
    void a.mesh.send(b.id, { kind: 'activation', runId: 1, epoch: 0, activationId: bytes(16, 6), pathway: [] }, bytes(10, 1)).catch(() => {});
    await expect.poll(() => answering.paths().get(a.id)?.path, { timeout: 10_000 }).toBe('unreachable');
    expect(summarizePaths(answering.paths())).toEqual({});
  });

  it('opens a connection ahead of need (warm: replicas before their all-reduce), so the first message finds it open; a relay-only mesh opens none', async () => {
    const a = await miner();
    const b = await miner();
    a.mesh.warm(b.id);
    a.mesh.warm(b.id); // once is enough: a second call while connecting opens nothing more
    await expect.poll(() => a.mesh.isConnected(b.id) && b.mesh.isConnected(a.id), { timeout: 20_000 }).toBe(true);
    expect(a.mesh.stats.messagesSent).toBe(0);
    const received = new Promise<Uint8Array>((resolve) => b.mesh.onMessage((_from, m) => resolve(m.payload)));
    await a.mesh.send(b.id, { kind: 'partition', runId: 1, epoch: 0, activationId: bytes(16, 4), pathway: [] }, bytes(5000, 3));
    expect(await received).toEqual(bytes(5000, 3));
    expect(a.mesh.paths().get(b.id)?.path).toBe('direct');
    // A mesh that reaches peers only through the coordinator's relay makes no WebRTC attempt.
    const c = await miner(true);
    c.mesh.warm(b.id);
    await new Promise((r) => setTimeout(r, 500));
    expect(c.mesh.paths().get(b.id)).toBeUndefined();
    expect(b.mesh.isConnected(c.id)).toBe(false);
  });

  it('makes one working connection when both miners send to each other at once (glare)', async () => {
    const a = await miner();
    const b = await miner();
    const atA = new Promise<Uint8Array>((resolve) => a.mesh.onMessage((_f, m) => resolve(m.payload)));
    const atB = new Promise<Uint8Array>((resolve) => b.mesh.onMessage((_f, m) => resolve(m.payload)));
    const header = { kind: 'activation' as const, runId: 1, epoch: 0, activationId: bytes(16, 3), pathway: [] };
    await Promise.all([a.mesh.send(b.id, header, bytes(1000, 4)), b.mesh.send(a.id, header, bytes(2000, 5))]);
    expect(await atB).toEqual(bytes(1000, 4));
    expect(await atA).toEqual(bytes(2000, 5));
    expect(a.mesh.isConnected(b.id) && b.mesh.isConnected(a.id)).toBe(true);
  });

  it('refuses forged, replayed and misaddressed signals by name', async () => {
    const a = await miner();
    const b = await miner();
    const signed = { to: b.id, kind: 'offer' as const, payload: '{}', seq: 100 };
    const forger = generateIdentity();
    expect(await code(request(a.socket, 'signal', { v: PROTOCOL_VERSION, ...signed, signature: forger.sign('signal', signed) }))).toBe('BAD_SIGNATURE');
    const c = await miner();
    const ok = { to: b.id, kind: 'candidate' as const, payload: '{}', seq: 5000 };
    await request(c.socket, 'signal', { v: PROTOCOL_VERSION, ...ok, signature: c.identity.sign('signal', ok) });
    expect(await code(request(c.socket, 'signal', { v: PROTOCOL_VERSION, ...ok, signature: c.identity.sign('signal', ok) }))).toBe('REPLAYED');
    const nobody = { to: 'f'.repeat(64), kind: 'offer' as const, payload: '{}', seq: 6000 };
    expect(await code(request(c.socket, 'signal', { v: PROTOCOL_VERSION, ...nobody, signature: c.identity.sign('signal', nobody) }))).toBe('UNKNOWN_PEER');
    const unregistered = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
    sockets.push(unregistered);
    expect(await code(request(unregistered, 'signal', { v: PROTOCOL_VERSION, ...ok, seq: 1, signature: c.identity.sign('signal', { ...ok, seq: 1 }) }))).toBe('NOT_REGISTERED');
  });
});

describe('the mesh across a thread boundary (a browser worker\'s miner, the page\'s WebRTC)', () => {
  const hosts: MeshHost[] = [];
  afterAll(() => hosts.forEach((h) => h.close()));

  /** Miner `a`'s mesh moved behind a port, as in a browser worker: its own PeerMesh closed, the page's hosting the real one. */
  function workerMesh(a: { id: string; socket: Socket; identity: Identity; mesh: PeerMesh }): { host: MeshHost; port: MeshPort } {
    a.mesh.close();
    const channel = new MessageChannel();
    const host = hostMesh(channel.port1 as unknown as import('@train-at-home/swarm').PortLike, { wrtc });
    hosts.push(host);
    const signals = coordinatorSignals(a.socket, a.identity, (from, signed, sig) => verifySignature('signal', signed, sig, `0x${from}`));
    return { host, port: new MeshPort(channel.port2 as unknown as import('@train-at-home/swarm').PortLike, { selfId: a.id, signals, connectTimeoutMs: 3000 }) };
  }

  it('a MeshPort sends and receives through the page\'s PeerMesh: whole payloads, signals signed by the worker', async () => {
    const a = await miner();
    const b = await miner();
    // a's miner "lives in a worker": its mesh is a port; the page side holds the real PeerMesh.
    const { host, port } = workerMesh(a);
    const atB = new Promise<{ from: string; payload: Uint8Array; pathway: number[] }>((resolve) => b.mesh.onMessage((from, m) => resolve({ from, payload: m.payload, pathway: m.pathway })));
    const payload = bytes(700_000, 11);
    const sent = await port.send(b.id, { kind: 'activation', runId: 1, epoch: 0, activationId: bytes(16, 2), pathway: [1] }, payload.subarray(0));
    const got = await atB;
    expect(got).toEqual({ from: a.id, payload, pathway: [1] });
    expect(sent.bytes).toBe(payload.length);
    const atA = new Promise<{ from: string; payload: Uint8Array }>((resolve) => port.onMessage((from, m) => resolve({ from, payload: m.payload })));
    await b.mesh.send(a.id, { kind: 'gradient', runId: 1, epoch: 0, activationId: bytes(16, 2), pathway: [1, 0] }, bytes(90_000, 12));
    expect(await atA).toEqual({ from: b.id, payload: bytes(90_000, 12) });
    expect(host.mesh!.stats.bytesSent).toBeGreaterThan(700_000);
    expect(app.coordinator.relayed.frameBytes).toBe(0);
    // The worker's miner knows the page's paths (for its heartbeat): told them every PATHS_EVERY_MS.
    await expect.poll(() => port.paths().get(b.id), { timeout: 10_000 }).toMatchObject(host.mesh!.paths().get(b.id)!);
    const seen = port.paths().get(b.id)!;
    expect(seen.bytesSent).toBeGreaterThan(700_000);
    expect(seen.bytesReceived).toBeGreaterThan(90_000);
    expect(summarizePaths(port.paths())).toEqual({ direct: { peers: 1, bytes: seen.bytesSent + seen.bytesReceived } });
    // A send to a peer that is not there fails in the worker with the page's reason, and nothing hangs.
    await expect(port.send('e'.repeat(64), { kind: 'activation', runId: 1, epoch: 0, activationId: bytes(16, 3), pathway: [] }, bytes(10, 1))).rejects.toThrow(/no connection|closed|failed/);
  }, 60_000);

  it('a MeshPort warms a connection in the page\'s PeerMesh ahead of need', async () => {
    const a = await miner();
    const b = await miner();
    const { host, port } = workerMesh(a);
    port.warm(b.id);
    await expect.poll(() => host.mesh?.isConnected(b.id) === true && b.mesh.isConnected(a.id), { timeout: 20_000 }).toBe(true);
    expect(host.mesh!.stats.messagesSent).toBe(0);
    port.close();
  }, 60_000);

  it('honours an upload cap: a 1.5 MB message at 1 MB/s takes at least half a second beyond its first second of budget', async () => {
    const a = await miner();
    const b = await miner();
    a.mesh.close();
    const channel = new MessageChannel();
    const host = hostMesh(channel.port1 as unknown as import('@train-at-home/swarm').PortLike, { wrtc, uploadBytesPerSec: 1_000_000 });
    hosts.push(host);
    const port = new MeshPort(channel.port2 as unknown as import('@train-at-home/swarm').PortLike, {
      selfId: a.id,
      signals: coordinatorSignals(a.socket, a.identity, (from, signed, sig) => verifySignature('signal', signed, sig, `0x${from}`)),
    });
    await port.send(b.id, { kind: 'activation', runId: 1, epoch: 0, activationId: bytes(16, 4), pathway: [] }, bytes(10, 1)); // connect first
    const got = new Promise<Uint8Array>((resolve) => b.mesh.onMessage((_f, m) => m.payload.length > 10 && resolve(m.payload)));
    const started = performance.now();
    await port.send(b.id, { kind: 'activation', runId: 1, epoch: 0, activationId: bytes(16, 5), pathway: [] }, bytes(1_500_000, 6));
    expect(await got).toEqual(bytes(1_500_000, 6));
    // The bucket starts full (1 s of budget); the remaining ~0.5 MB must wait for it to refill.
    expect(performance.now() - started).toBeGreaterThan(400);
    // Lifting the cap: the same message goes without waiting on the bucket.
    host.setUploadCap(0);
    const again = new Promise<Uint8Array>((resolve) => b.mesh.onMessage((_f, m) => m.payload.length === 1_400_000 && resolve(m.payload)));
    await port.send(b.id, { kind: 'activation', runId: 1, epoch: 0, activationId: bytes(16, 7), pathway: [] }, bytes(1_400_000, 8));
    expect(await again).toEqual(bytes(1_400_000, 8));
  }, 60_000);
});

describe('training tokens over HTTP (how a tab gets them)', () => {
  it('downloads the dataset\'s training shards from /data/, hash-checked, equal to the files on disk', async () => {
    const vocab = 320;
    prepareData({ outDir: DATA_DIR, vocabSize: vocab });
    const seen: number[] = [];
    let fetched = 0;
    const tokens = await httpTokenSource(url, (done, total) => seen.push(done / total)).train(vocab, datasetName(vocab), (n) => (fetched += n));
    const disk = loadDataset(`${DATA_DIR}/${datasetName(vocab)}`).train;
    // What a miner counts as its training data's traffic: the manifest and every shard, as they came.
    const manifest = await (await fetch(`${url}/data/${datasetName(vocab)}/manifest.json`)).text();
    expect(fetched).toBe(manifest.length + disk.byteLength);
    expect(tokens.length).toBe(disk.length);
    expect(Buffer.from(tokens.buffer).equals(Buffer.from(disk.buffer, disk.byteOffset, disk.byteLength))).toBe(true);
    expect(seen[0]).toBe(0);
    expect(seen[seen.length - 1]).toBe(1);
    await expect(httpTokenSource(url).train(321, datasetName(321))).rejects.toThrow(/DataError|no dataset/);
    // A name that is not a dataset's is refused before any request.
    await expect(httpTokenSource(url).train(vocab, '../secrets')).rejects.toThrow(/not a dataset's name/);
  });
});

describe('relay fallback', () => {
  it('carries frames through the coordinator when peers cannot connect directly, counting every byte', async () => {
    const a = await miner(true);
    const b = await miner(true);
    const before = app.coordinator.relayed.frameBytes;
    const got = new Promise<Uint8Array>((resolve) => b.mesh.onMessage((_f, m) => resolve(m.payload)));
    const payload = bytes(600_000, 7);
    await a.mesh.send(b.id, { kind: 'activation', runId: 1, epoch: 0, activationId: bytes(16, 1), pathway: [] }, payload);
    expect(await got).toEqual(payload);
    expect(app.coordinator.relayed.frameBytes - before).toBe(a.mesh.stats.bytesSent);
    expect(a.mesh.isConnected(b.id)).toBe(false);
    expect(a.mesh.paths().get(b.id)).toMatchObject({ path: 'coordinator', bytesSent: a.mesh.stats.bytesSent });
    expect(b.mesh.paths().get(a.id)).toMatchObject({ path: 'coordinator', bytesReceived: a.mesh.stats.bytesSent });
    // Relayed frames count once, as what they carry (an activation), not again as the coordinator's messages.
    expect(a.meter.read().activation.sent).toBe(a.mesh.stats.bytesSent);
    expect(b.meter.read().activation.received).toBe(a.mesh.stats.bytesSent);
    expect(a.meter.read().coordinator.sent).toBeLessThan(20_000);
  });

  it('caps each miner\'s relayed bytes per minute (RELAY_CAP, with the time to wait), and a run with the relay off refuses every frame (RELAY_OFF)', async () => {
    const a = await miner(true);
    const b = await miner(true);
    const chunk = (n: number): Uint8Array => encodeFrames({ kind: 'activation', runId: 1, epoch: 0, activationId: bytes(16, n), pathway: [] }, bytes(200_000, n))[0]!;
    let sent = 0;
    let refusal: unknown;
    // 3 MB per minute, the minute starting at a's first relayed chunk: the 16th chunk of 200 KB is over.
    for (let i = 0; i < 40 && !refusal; i++) {
      const c = chunk(i);
      try {
        await request(a.socket, 'frame', { v: PROTOCOL_VERSION, to: b.id, chunk: c });
        sent += c.length;
      } catch (e) {
        refusal = e;
      }
    }
    expect(refusal).toBeInstanceOf(CoordinatorError);
    expect((refusal as CoordinatorError).code).toBe('RELAY_CAP');
    expect((refusal as CoordinatorError).message).toMatch(/3000000 bytes per miner per minute; retry in \d+ ms/);
    expect(sent).toBeLessThanOrEqual(3_000_000);
    // A mesh sending through the relay learns of the refusal (more than the minute has left): its send fails by name, no frame is lost unseen.
    const header = { kind: 'activation' as const, runId: 1, epoch: 0, activationId: bytes(16, 50), pathway: [] };
    await expect(a.mesh.send(b.id, header, bytes(250_000, 50))).rejects.toThrow(/relay refused a frame to .*RELAY_CAP/);
    // Another miner's budget is its own.
    await request(b.socket, 'frame', { v: PROTOCOL_VERSION, to: a.id, chunk: chunk(99) });
    const relay = app.coordinator.network.relay;
    app.coordinator.setNetwork({ ...app.coordinator.network, relay: { ...relay, enabled: false } });
    try {
      const before = app.coordinator.relayed.frameBytes;
      expect(await code(request(b.socket, 'frame', { v: PROTOCOL_VERSION, to: a.id, chunk: chunk(98) }))).toBe('RELAY_OFF');
      await expect(b.mesh.send(a.id, { kind: 'activation', runId: 1, epoch: 0, activationId: bytes(16, 97), pathway: [] }, bytes(1_000, 97))).rejects.toThrow(/RELAY_OFF/);
      expect(app.coordinator.relayed.frameBytes).toBe(before);
    } finally {
      app.coordinator.setNetwork({ ...app.coordinator.network, relay });
    }
  });

  it('relays only well-formed chunks between registered miners', async () => {
    const a = await miner(true);
    const b = await miner(true);
    const before = app.coordinator.relayed.frameBytes;
    expect(await code(request(a.socket, 'frame', { v: PROTOCOL_VERSION, to: b.id, chunk: new Uint8Array(100) }))).toBe('SCHEMA');
    expect(await code(request(a.socket, 'frame', { v: PROTOCOL_VERSION, to: b.id, chunk: 'not bytes' }))).toBe('SCHEMA');
    expect(await code(request(a.socket, 'frame', { v: PROTOCOL_VERSION, to: 'f'.repeat(64), chunk: new Uint8Array(100) }))).toBe('SCHEMA');
    const stranger = connect(url, { transports: ['websocket'], reconnection: false, forceNew: true });
    sockets.push(stranger);
    expect(await code(request(stranger, 'frame', { v: PROTOCOL_VERSION, to: b.id, chunk: new Uint8Array(100) }))).toBe('NOT_REGISTERED');
    expect(app.coordinator.relayed.frameBytes).toBe(before);
  });
});

async function code(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'accepted';
  } catch (e) {
    return e instanceof CoordinatorError ? e.code : `unexpected ${(e as Error).message}`;
  }
}
