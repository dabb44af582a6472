/**
 * npm run bench:paths — one pipeline boundary's transfers on each path two homes can take, in the NAT lab
 * (scripts/nat-lab.sh via testkit/src/nat-lab.ts: a public namespace with the coordinator and
 * Debian's coturn, two homes behind their own nftables NATs; needs root):
 *   direct      endpoint-independent NATs: server-reflexive candidates from coturn's STUN
 *   TURN/UDP    symmetric NATs: through coturn's relay over UDP
 *   TURN/TCP    UDP blocked at one home: that end reaches coturn over TCP
 *   relay       the coordinator's own frame relay (both ends relay everything)
 * Per path: latency per frame (p50, p99: COUNT frames sent one at a time, GAP_MS apart, from the
 * sender's clock to the receiver's, one machine), and throughput (BLAST frames back to back: bytes over
 * first send to last arrival; each send waits for the one before, as the pipeline's do). The frame is the default run's activation boundary (`small`, bottleneck 8,
 * int8: 16 × 128 rows). For the relay, the coordinator process's CPU time per relayed MB.
 * Then path quality: real miners (testkit/src/swarm-process.ts), a replica of each of 2 stages of `tiny` in each home, both
 * NATs symmetric, so each stage 0 can feed the stage-1 replica in its own home (direct) or the one across the NATs (TURN
 * only). ROUTE_MS of training each without and with preferDirect (PipelineWorkerOptions): the share of activations that
 * crossed the NATs, and microbatches through the pipeline per second.
 *   npm run bench:paths
 */
import { encodedBytes, PRESETS } from '@train-at-home/model';
import { defaultRunConfig } from '../server/src/run-config';
import { ask } from '@train-at-home/testkit/netns';
import { startNatLab, type LabPeer, type NatMode } from '@train-at-home/testkit/nat-lab';
import { DATA_DIR, prepareData } from '@train-at-home/model/node';
import { MinerSwarm } from '@train-at-home/testkit/swarm';
import { finish, machine } from './lib';

const ROUTE_MS = 60_000;
const COUNT = 100;
const GAP_MS = 20;
const BLAST = 400;
const run = defaultRunConfig();
const FRAME_BYTES = encodedBytes(run.training.batchSize * PRESETS[run.preset].contextLength, run.bottleneck, run.codec ?? 'int8');

interface Arrival {
  seq: number;
  latencyMs: number;
  at: number;
  bytes: number;
}

const quantile = (xs: number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
};
const round = (x: number, digits = 2): number => Math.round(x * 10 ** digits) / 10 ** digits;

async function arrivals(p: LabPeer, n: number): Promise<Arrival[]> {
  const got: Arrival[] = [];
  const until = Date.now() + 120_000;
  while (got.length < n && Date.now() < until) {
    got.push(...(await ask<Arrival[]>(p.child, 'arrivals')));
    if (got.length < n) await new Promise((r) => setTimeout(r, 100));
  }
  if (got.length < n) throw new Error(`only ${got.length} of ${n} frames arrived`);
  return got;
}

const lab = await startNatLab(`tb${process.pid % 100000}`);
const routes: Record<string, { crossedShare: number; activations: number; microbatchesPerSec: number }> = {};
const results: Record<string, { path: string; relayProtocol?: string; p50Ms: number; p99Ms: number; MBps: number; cpuMsPerMB?: number }> = {};
try {
  const paths: Array<[string, NatMode, NatMode, boolean]> = [
    ['direct', 'eim', 'eim', false],
    ['turnUdp', 'symmetric', 'symmetric', false],
    ['turnTcp', 'udp-blocked', 'eim', false],
    ['relay', 'eim', 'eim', true],
  ];
  for (const [name, nat1, nat2, relayOnly] of paths) {
    lab.nat(1, nat1);
    lab.nat(2, nat2);
    const a = await lab.peer(1, { relayOnly });
    const b = await lab.peer(2, { relayOnly });
    // Connect (and warm up) first.
    await ask(a.child, 'timed', { to: b.minerId, bytes: FRAME_BYTES, count: 5, gapMs: 0 }, 60_000);
    await arrivals(b, 5);
    const seen = new Map((await ask<{ paths: Array<[string, { path: string; relayProtocol?: string }]> }>(a.child, 'paths')).paths).get(b.minerId)!;
    // Latency: one frame at a time.
    await ask(a.child, 'timed', { to: b.minerId, bytes: FRAME_BYTES, count: COUNT, gapMs: GAP_MS }, 120_000);
    const latencies = (await arrivals(b, COUNT)).map((x) => x.latencyMs);
    // Throughput: back to back.
    const cpuBefore = await ask<{ user: number; system: number }>(lab.coordinator, 'cpu');
    const relayedBefore = (await ask<{ frameBytes: number }>(lab.coordinator, 'relayed')).frameBytes;
    const { firstSentAt } = await ask<{ firstSentAt: number }>(a.child, 'timed', { to: b.minerId, bytes: FRAME_BYTES, count: BLAST, gapMs: 0 }, 300_000);
    const blast = await arrivals(b, BLAST);
    const cpuAfter = await ask<{ user: number; system: number }>(lab.coordinator, 'cpu');
    const relayedMB = ((await ask<{ frameBytes: number }>(lab.coordinator, 'relayed')).frameBytes - relayedBefore) / 1e6;
    const seconds = (Math.max(...blast.map((x) => x.at)) - firstSentAt) / 1000;
    const cpuMs = (cpuAfter.user + cpuAfter.system - cpuBefore.user - cpuBefore.system) / 1000;
    results[name] = {
      path: seen.path,
      ...(seen.relayProtocol ? { relayProtocol: seen.relayProtocol } : {}),
      p50Ms: round(quantile(latencies, 0.5)),
      p99Ms: round(quantile(latencies, 0.99)),
      MBps: round((BLAST * FRAME_BYTES) / 1e6 / seconds),
      ...(relayedMB > 0 ? { cpuMsPerMB: round(cpuMs / relayedMB) } : {}),
    };
    console.log(`${name.padEnd(8)} ${seen.path}${seen.relayProtocol ? `/${seen.relayProtocol}` : ''}: p50 ${results[name]!.p50Ms} ms, p99 ${results[name]!.p99Ms} ms, ${results[name]!.MBps} MB/s${relayedMB > 0 ? `, coordinator ${results[name]!.cpuMsPerMB} CPU ms per relayed MB` : ''}`);
    a.child.disconnect();
    b.child.disconnect();
  }

  // Path quality: without, then with, preferring next-stage peers reached directly.
  prepareData({ outDir: DATA_DIR, vocabSize: 320 });
  for (const preferDirectPeers of [false, true]) {
    lab.nat(1, 'symmetric');
    lab.nat(2, 'symmetric');
    const swarm = new MinerSwarm();
    try {
      // One home after the other, so each holds a replica of each stage (the first two miners fill both stages).
      const miners = [...(await swarm.start(lab.url, [2], [`${lab.prefix}-home1`], { preferDirectPeers })), ...(await swarm.start(lab.url, [2], [`${lab.prefix}-home2`], { preferDirectPeers }))];
      const home1 = new Set(miners.slice(0, 2).map((m) => m.minerId));
      const stagesOf = (ms: typeof miners): string => ms.map((m) => m.stage).sort().join(',');
      if (stagesOf(miners.slice(0, 2)) !== '0,1' || stagesOf(miners.slice(2)) !== '0,1') throw new Error(`each home should hold both stages: ${JSON.stringify(miners)}`);
      const ours = new Set(miners.map((m) => m.minerId));
      const firsts = new Set(miners.filter((m) => m.stage === 0).map((m) => m.minerId));
      const until = Date.now() + 240_000;
      while ((await swarm.stats()).some((m) => m.microbatches < 3) && Date.now() < until) await new Promise((r) => setTimeout(r, 2000));
      const pairs = async (): Promise<{ crossed: number; total: number }> => {
        const rows = (await ask<Array<[string, string, number]>>(lab.coordinator, 'activations')).filter(([from]) => ours.has(from));
        return { crossed: rows.filter(([from, to]) => home1.has(from) !== home1.has(to)).reduce((s, [, , n]) => s + n, 0), total: rows.reduce((s, [, , n]) => s + n, 0) };
      };
      const stage0 = async (): Promise<number> => (await swarm.stats()).filter((m) => firsts.has(m.minerId)).reduce((s, m) => s + m.microbatches, 0);
      const [p0, m0, t0] = [await pairs(), await stage0(), Date.now()];
      await new Promise((r) => setTimeout(r, ROUTE_MS));
      const [p1, m1, t1] = [await pairs(), await stage0(), Date.now()];
      const key = preferDirectPeers ? 'preferDirect' : 'anyPath';
      routes[key] = { crossedShare: round((p1.crossed - p0.crossed) / Math.max(1, p1.total - p0.total), 3), activations: p1.total - p0.total, microbatchesPerSec: round(((m1 - m0) * 1000) / (t1 - t0), 3) };
      console.log(`route ${key}: ${JSON.stringify(routes[key])}`);
    } finally {
      swarm.stop();
    }
  }
} finally {
  lab.close();
}

finish('paths', {
  directMBps: results.direct!.MBps,
  turnUdpMBps: results.turnUdp!.MBps,
  turnTcpMBps: results.turnTcp!.MBps,
  relayMBps: results.relay!.MBps,
  coordinatorCpuMsPerRelayedMB: results.relay!.cpuMsPerMB ?? null,
  crossedShareBefore: routes.anyPath!.crossedShare,
  crossedShareAfter: routes.preferDirect!.crossedShare,
  microbatchesPerSecBefore: routes.anyPath!.microbatchesPerSec,
  microbatchesPerSecAfter: routes.preferDirect!.microbatchesPerSec,
  frameBytes: FRAME_BYTES,
  paths: results,
  routes,
  budget: `${COUNT} frames one at a time (${GAP_MS} ms apart) and ${BLAST} back to back per path, one pair of Node miners (@roamhq/wrtc), NAT lab on one machine (no link delay or loss: figures of the software on each path, not of a real link); the relay acknowledges each chunk and takes at most 200 frame events a second per connection (socket/rate-limits.ts), which bounds relayMBps here; path quality: ${ROUTE_MS / 1000} s of training each way, 4 miners of tiny in 2 stages, 2 homes`,
  machine: machine('wasm'),
});
process.exit(0);
