/**
 * A registered miner's peer mesh in one of the lab's homes (scripts/nat-lab.sh), for server/test/nat.test.ts:
 * it takes its ICE servers from its registration and asks for fresh ones when a connection fails, as the
 * Miner does (miner.ts). Over IPC: `send` a payload to a peer, `paths` (the mesh's per-peer paths, what
 * arrived, how often fresh ICE servers were asked for), `gather` (the candidate types one
 * RTCPeerConnection gathers with the given ICE servers: does coturn take these credentials?), and for
 * bench/paths.ts `timed` (timestamped messages to a peer) and `arrivals` (when those arrived here).
 */
import wrtc from '@roamhq/wrtc';
import { cryptoReady, generateIdentity, verifySignature, type IceServer } from '@train-at-home/protocol';
import { PeerMesh, coordinatorRelay, coordinatorSignals, register, requestIce } from '@train-at-home/swarm';
import { io } from 'socket.io-client';

const { url, relayOnly } = JSON.parse(process.env.TAH_NAT_PEER ?? '{}') as { url: string; relayOnly?: boolean };
await cryptoReady();
const socket = io(url, { transports: ['websocket'], reconnection: false });
await new Promise<void>((resolve, reject) => {
  socket.once('connect', () => resolve());
  socket.once('connect_error', reject);
});
const identity = generateIdentity();
const registration = await register(socket, identity, { backend: 'wasm', tokensPerSec: 1 });
let iceRefreshes = 0;
const received: number[] = [];
const mesh: PeerMesh = new PeerMesh({
  selfId: registration.minerId,
  wrtc,
  signals: coordinatorSignals(socket, identity, (from, signed, sig) => verifySignature('signal', signed, sig, `0x${from}`)),
  iceServers: registration.ice?.iceServers ?? [],
  refreshIce: async () => {
    iceRefreshes++;
    mesh.setIceServers((await requestIce(socket)).iceServers);
  },
  ...(registration.ice?.relay ? { relay: coordinatorRelay(socket) } : {}),
  // bench/paths.ts measures the coordinator's relay with both ends relaying everything.
  ...(relayOnly ? { relayOnly: true } : {}),
  connectTimeoutMs: 10_000,
});
/** Timed messages (bench/paths.ts): the first 8 bytes are the sender's clock (ms since the epoch, this machine's), then a sequence number. */
const arrivals: Array<{ seq: number; latencyMs: number; at: number; bytes: number }> = [];
mesh.onMessage((_from, m) => {
  received.push(m.payload.length);
  if (m.payload.length >= 12) {
    const view = new DataView(m.payload.buffer, m.payload.byteOffset, m.payload.byteLength);
    const at = performance.timeOrigin + performance.now();
    arrivals.push({ seq: view.getUint32(8), latencyMs: at - view.getFloat64(0), at, bytes: m.payload.length });
  }
});
process.send!({ ready: { minerId: registration.minerId, ice: registration.ice } });

/** Candidate types (and for relay candidates, the transport to the TURN server) gathered in 4 s. */
async function gather(iceServers: IceServer[]): Promise<string[]> {
  const pc = new wrtc.RTCPeerConnection({ iceServers });
  const types: string[] = [];
  pc.onicecandidate = (e: { candidate: { candidate: string } | null }) => {
    if (e.candidate) types.push(/ typ (\w+)/.exec(e.candidate.candidate)?.[1] ?? '?');
  };
  pc.createDataChannel('probe');
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((r) => setTimeout(r, 4000));
  pc.close();
  return types;
}

/** `count` timed messages of `bytes` to `to`, each after the previous was handed to the channel and `gapMs` more. */
async function timed(to: string, bytes: number, count: number, gapMs: number): Promise<{ firstSentAt: number }> {
  let firstSentAt = 0;
  for (let seq = 0; seq < count; seq++) {
    const payload = new Uint8Array(bytes);
    const view = new DataView(payload.buffer);
    const now = performance.timeOrigin + performance.now();
    if (seq === 0) firstSentAt = now;
    view.setFloat64(0, now);
    view.setUint32(8, seq);
    await mesh.send(to, { kind: 'activation', runId: 1, epoch: 0, activationId: crypto.getRandomValues(new Uint8Array(16)), pathway: [] }, payload);
    if (gapMs > 0) await new Promise((r) => setTimeout(r, gapMs));
  }
  return { firstSentAt };
}

process.on('message', (m: { send?: { to: string; bytes: number }; paths?: true; gather?: IceServer[]; timed?: { to: string; bytes: number; count: number; gapMs: number }; arrivals?: true }) => {
  if (m.timed) {
    const { to, bytes, count, gapMs } = m.timed;
    timed(to, bytes, count, gapMs).then(
      (r) => process.send!({ timed: { ok: true, ...r } }),
      (e: Error) => process.send!({ timed: { ok: false, error: e.message } }),
    );
  }
  if (m.arrivals) process.send!({ arrivals: arrivals.splice(0) });
  if (m.send) {
    const { to, bytes } = m.send;
    const payload = Uint8Array.from({ length: bytes }, (_, i) => (i * 7) & 0xff);
    mesh.send(to, { kind: 'activation', runId: 1, epoch: 0, activationId: crypto.getRandomValues(new Uint8Array(16)), pathway: [] }, payload).then(
      () => process.send!({ send: { ok: true } }),
      (e: Error) => process.send!({ send: { ok: false, error: e.message } }),
    );
  }
  if (m.paths) process.send!({ paths: { paths: [...mesh.paths()], received, iceRefreshes } });
  if (m.gather) void gather(m.gather).then((types) => process.send!({ gather: types }));
});
process.on('disconnect', () => {
  mesh.close();
  socket.disconnect();
  process.exit(0);
});
