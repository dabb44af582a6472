/**
 * Peer to peer across home networks, through real NATs (scripts/nat-lab.sh: a public namespace with the
 * coordinator and Debian's coturn, two homes each behind its own nftables NAT, no route between the
 * homes but through their NATs; traffic never leaves these namespaces). In each home a registered
 * miner's PeerMesh (testkit/src/nat-peer.ts) on @roamhq/wrtc, told its STUN and TURN servers and its
 * per-miner TURN credentials by the coordinator; the coordinator's frame relay is on, so a byte it
 * carried would show; and real miners (testkit/src/swarm-process.ts) training through the NATs. Needs root
 * (network namespaces), like the browser tests.
 */
import type { PeerPathStats } from '@train-at-home/swarm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { turnCredentials } from '../src/network';
import { ask } from '@train-at-home/testkit/netns';
import { PUBLIC, startNatLab, type LabPeer as Peer, type NatLab } from '@train-at-home/testkit/nat-lab';
import { MinerSwarm } from '@train-at-home/testkit/swarm';

const P = `tn${process.pid % 100000}`;
let labs: NatLab;
let url: string;
let SECRET: string;
let coordinator: NatLab['coordinator'];

const peer = (home: 1 | 2): Promise<Peer> => labs.peer(home);

beforeAll(async () => {
  labs = await startNatLab(P);
  ({ url, secret: SECRET, coordinator } = labs);
}, 180_000);

afterAll(() => labs?.close());

interface Seen {
  paths: Array<[string, PeerPathStats]>;
  received: number[];
  iceRefreshes: number;
}

/** a sends 300 kB to b and b 200 kB back; both ends' view of the pair, and the coordinator's relayed frame bytes meanwhile. */
async function exchange(a: Peer, b: Peer): Promise<{ a: PeerPathStats; b: PeerPathStats; aSeen: Seen; bSeen: Seen; relayedFrameBytes: number }> {
  const before = (await ask<{ frameBytes: number }>(coordinator!, 'relayed')).frameBytes;
  const there = await ask<{ ok: boolean; error?: string }>(a.child, 'send', { to: b.minerId, bytes: 300_000 }, 60_000);
  expect(there, 'a reaches b').toEqual({ ok: true });
  const arrived = await waitFor(async () => (await ask<Seen>(b.child, 'paths')).received.includes(300_000), 20_000);
  expect(arrived, `b got a's message; a saw ${JSON.stringify(await ask<Seen>(a.child, 'paths'))}, b saw ${JSON.stringify(await ask<Seen>(b.child, 'paths'))}`).toBe(true);
  const back = await ask<{ ok: boolean; error?: string }>(b.child, 'send', { to: a.minerId, bytes: 200_000 }, 60_000);
  expect(back, 'b reaches a').toEqual({ ok: true });
  await expect.poll(async () => (await ask<Seen>(a.child, 'paths')).received, { timeout: 20_000 }).toContain(200_000);
  // The path is read from the ICE agent's stats once the connection is up.
  await expect.poll(async () => new Map((await ask<Seen>(a.child, 'paths')).paths).get(b.minerId)?.path, { timeout: 5000 }).not.toBe('connecting');
  await expect.poll(async () => new Map((await ask<Seen>(b.child, 'paths')).paths).get(a.minerId)?.path, { timeout: 5000 }).not.toBe('connecting');
  const aSeen = await ask<Seen>(a.child, 'paths');
  const bSeen = await ask<Seen>(b.child, 'paths');
  const after = (await ask<{ frameBytes: number }>(coordinator!, 'relayed')).frameBytes;
  return { a: new Map(aSeen.paths).get(b.minerId)!, b: new Map(bSeen.paths).get(a.minerId)!, aSeen, bSeen, relayedFrameBytes: after - before };
}

async function waitFor(test: () => Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const until = Date.now() + timeoutMs;
  while (Date.now() < until) {
    if (await test()) return true;
    await new Promise((r) => setTimeout(r, 250));
  }
  return test();
}

/** Both ends' view of the pair once it shows what `expected` asks: the path is read again as ICE settles (PeerMesh.classify, up to 30 s after the connection opened). */
async function settled(a: Peer, b: Peer, expected: (a?: PeerPathStats, b?: PeerPathStats) => boolean): Promise<{ a?: PeerPathStats; b?: PeerPathStats }> {
  const read = async () => ({ a: new Map((await ask<Seen>(a.child, 'paths')).paths).get(b.minerId), b: new Map((await ask<Seen>(b.child, 'paths')).paths).get(a.minerId) });
  await waitFor(async () => {
    const r = await read();
    return expected(r.a, r.b);
  }, 40_000);
  return read();
}

function done(...ps: Peer[]): void {
  for (const p of ps) p.child.disconnect();
}

describe('peers in two homes, each behind its own NAT', () => {
  it('registration names the operator\'s STUN and TURN servers with credentials minted for the miner, and no public server', async () => {
    const a = await peer(1);
    const urls = a.ice.iceServers.flatMap((s) => s.urls);
    expect(urls).toEqual([`stun:${PUBLIC}:3478`, `turn:${PUBLIC}:3478?transport=udp`, `turn:${PUBLIC}:3478?transport=tcp`]);
    expect(a.ice.iceServers[1]!.username).toMatch(new RegExp(`^\\d+:${a.minerId}$`));
    done(a);
  }, 60_000);

  it('endpoint-independent NATs: the pair connects directly on server-reflexive candidates from coturn\'s STUN; nothing through TURN or the coordinator', async () => {
    labs.nat(1, 'eim');
    labs.nat(2, 'eim');
    const [a, b] = [await peer(1), await peer(2)];
    const r = await exchange(a, b);
    const now = await settled(a, b, (x, y) => x?.path === 'direct' && y?.path === 'direct');
    expect(now.a).toMatchObject({ path: 'direct' });
    expect(now.b).toMatchObject({ path: 'direct' });
    expect(r.relayedFrameBytes).toBe(0);
    expect(r.a.bytesSent).toBeGreaterThan(300_000);
    done(a, b);
  }, 120_000);

  it('symmetric NATs (a random port per flow): the pair connects through coturn\'s TURN relay over UDP; no frame byte through the coordinator', async () => {
    labs.nat(1, 'symmetric');
    labs.nat(2, 'symmetric');
    const [a, b] = [await peer(1), await peer(2)];
    const r = await exchange(a, b);
    const now = await settled(a, b, (x, y) => x?.path === 'turn' && y?.path === 'turn' && [x.relayProtocol, y.relayProtocol].includes('udp'));
    expect(now.a?.path).toBe('turn');
    expect(now.b?.path).toBe('turn');
    expect([now.a?.relayProtocol, now.b?.relayProtocol]).toContain('udp');
    expect(r.relayedFrameBytes).toBe(0);
    done(a, b);
  }, 120_000);

  it('symmetric NATs, real miners: a replica of each of 2 stages in each home, training through TURN past a merge; no frame through the coordinator', async () => {
    labs.nat(1, 'symmetric');
    labs.nat(2, 'symmetric');
    const swarm = new MinerSwarm();
    try {
      const before = (await ask<{ frameBytes: number }>(coordinator!, 'relayed')).frameBytes;
      // One home after the other: the first two miners fill both stages, the next two are their replicas.
      const miners = [...(await swarm.start(url, [2], [`${P}-home1`])), ...(await swarm.start(url, [2], [`${P}-home2`]))];
      const home1 = new Set(miners.slice(0, 2).map((m) => m.minerId));
      // Every stage has a replica in each home, so every merge crosses the NATs.
      expect(new Set(miners.slice(0, 2).map((m) => m.stage))).toEqual(new Set(miners.slice(2).map((m) => m.stage)));
      // Every miner merges with its replica in the other home, then trains on.
      const merged = await waitFor(async () => (await swarm.stats()).every((m) => m.merges >= 1), 300_000);
      expect(merged, `rounds ${JSON.stringify(await ask<number[]>(coordinator!, 'rounds'))}; miners ${JSON.stringify(await swarm.stats())}`).toBe(true);
      const atMerge = new Map((await swarm.stats()).map((m) => [m.minerId, m.microbatches]));
      const trainedOn = await waitFor(async () => (await swarm.stats()).every((m) => m.microbatches >= atMerge.get(m.minerId)! + 3), 120_000);
      const stats = await swarm.stats();
      expect(trainedOn, `microbatches at the merge ${JSON.stringify([...atMerge])}; now ${JSON.stringify(stats)}`).toBe(true);
      expect(stats.some((m) => m.flagged), JSON.stringify(stats)).toBe(false);
      const crossing = stats.flatMap((m) => m.paths.filter(([peer]) => home1.has(peer) !== home1.has(m.minerId)).map(([, p]) => p));
      expect(crossing.length).toBeGreaterThan(0);
      expect(crossing.every((p) => p.path === 'turn'), JSON.stringify(crossing)).toBe(true);
      expect(crossing.reduce((sum, p) => sum + p.bytesSent, 0)).toBeGreaterThan(0);
      expect((await ask<{ frameBytes: number }>(coordinator!, 'relayed')).frameBytes - before).toBe(0);
      // Path quality: each stage 0 has a next-stage replica in its own home (direct) and one across the NATs (TURN only),
      // equally loaded; its microbatches go to the direct one. What crossed is the first tries, before the path was known.
      const ours = new Set(miners.map((m) => m.minerId));
      const pairs = (await ask<Array<[string, string, number]>>(coordinator!, 'activations')).filter(([from]) => ours.has(from));
      const total = pairs.reduce((s, [, , n]) => s + n, 0);
      const crossed = pairs.filter(([from, to]) => home1.has(from) !== home1.has(to)).reduce((s, [, , n]) => s + n, 0);
      expect(crossed / total, JSON.stringify(pairs)).toBeLessThan(0.2);
    } finally {
      swarm.stop();
    }
  }, 420_000);

  it('UDP blocked at one home: that end reaches coturn over TCP and the pair connects through TURN', async () => {
    labs.nat(1, 'udp-blocked');
    labs.nat(2, 'eim');
    const [a, b] = [await peer(1), await peer(2)];
    const r = await exchange(a, b);
    const now = await settled(a, b, (x, y) => x?.path === 'turn' && x.relayProtocol === 'tcp' && y?.path === 'turn');
    expect(now.a).toMatchObject({ path: 'turn', relayProtocol: 'tcp' });
    expect(now.b?.path).toBe('turn');
    expect(r.relayedFrameBytes).toBe(0);
    done(a, b);
  }, 120_000);

  it('coturn refuses expired and forged credentials; a miner whose credentials were refused asks the coordinator for fresh ones and connects', async () => {
    labs.nat(1, 'symmetric');
    labs.nat(2, 'symmetric');
    const probe = await peer(1);
    const turnUrls = [`turn:${PUBLIC}:3478?transport=udp`];
    const relayCandidates = async (credentials: { username: string; credential: string }): Promise<number> =>
      (await ask<string[]>(probe.child, 'gather', [{ urls: turnUrls, ...credentials }], 30_000)).filter((t) => t === 'relay').length;
    expect(await relayCandidates(turnCredentials(SECRET, probe.minerId, Date.now() + 60_000)), 'valid credentials').toBeGreaterThan(0);
    expect(await relayCandidates(turnCredentials(SECRET, probe.minerId, Date.now() - 60_000)), 'expired credentials').toBe(0);
    expect(await relayCandidates(turnCredentials('forged', probe.minerId, Date.now() + 60_000)), 'forged credentials').toBe(0);
    done(probe);

    // The coordinator mints with a secret coturn does not share (as after a botched rotation) while both peers
    // register; then it gets the right one back. Their first connection cannot reach TURN, and symmetric NATs
    // leave no other path: the sender asks for fresh credentials and its second attempt goes through TURN.
    await ask(coordinator!, 'network', { turnSecret: 'not-the-shared-secret' });
    const [a, b] = [await peer(1), await peer(2)];
    await ask(coordinator!, 'network', { turnSecret: SECRET });
    const r = await exchange(a, b);
    expect(r.aSeen.iceRefreshes).toBeGreaterThanOrEqual(1);
    expect(r.a.path).toBe('turn');
    expect(r.relayedFrameBytes).toBe(0);
    done(a, b);
  }, 180_000);
});
