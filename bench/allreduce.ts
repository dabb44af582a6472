/**
 * npm run bench:allreduce — the butterfly all-reduce's bytes per peer and round
 * time as the number of replicas grows, for the largest stage of the `small`
 * preset (3 stages), beside a naive all-gather.
 *
 * Peers run in this process over MemoryNetwork (in-process transports that
 * count every byte each peer sends and receives): 16 miner processes with
 * WebRTC do not fit on a 2-core machine. The round's bytes are those of the
 * same ButterflyNode code the miners run over WebRTC; round time here is
 * compute and scheduling only (no network latency), all peers sharing one core.
 * The naive all-gather's bytes are computed: every peer sends its whole
 * vector, at the same precision, to every other peer.
 */
import { PRESETS, paramSpecs, stageSpecs } from '@train-at-home/model';
import { MemoryNetwork, contributionBytes, topKOf, type AllReducePrecision } from '@train-at-home/swarm';
import { join } from 'node:path';
import { writeChartPng, writeCsv } from './charts';
import { RESULTS_DIR, finish, machine } from './lib';

const layout = { stages: 3, bottleneck: 64, int8: true };
const specs = stageSpecs(PRESETS.small, layout);
const sizes = specs.map((s) => paramSpecs(s).reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0));
const stage = sizes.indexOf(Math.max(...sizes));
const P = sizes[stage]!;
const paramBytes = 4 * P;
console.log(`small preset, stage ${stage} of 3: ${P.toLocaleString()} parameters (${(paramBytes / 2 ** 20).toFixed(1)} MiB fp32)`);

function vector(seed: number): Float32Array {
  let s = seed >>> 0;
  const v = new Float32Array(P);
  for (let i = 0; i < P; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    v[i] = (s / 2 ** 32 - 0.5) * 1e-3;
  }
  return v;
}

const rows: Array<{ n: number; precision: AllReducePrecision; bytesSentPerPeerRatio: number; bytesRecvPerPeerRatio: number; roundMs: number; naiveBytesSentPerPeerRatio: number }> = [];
for (const precision of ['fp16', 'int8', 'topk32'] as const) {
  for (const n of [2, 4, 8, 16]) {
    const net = new MemoryNetwork();
    const peers = Array.from({ length: n }, (_, i) => `peer-${String(i).padStart(2, '0')}`);
    const local = peers.map((_, i) => vector(i + 1));
    const spec = {
      round: 1,
      seed: 1234,
      participants: peers,
      weights: Object.fromEntries(peers.map((p) => [p, 1])),
      precision,
      reduction: { kind: 'mean' as const },
      timeouts: { senderMs: 600_000, reducerMs: 600_000, roundMs: 1_800_000 },
    };
    const started = performance.now();
    const results = await Promise.all(peers.map((p, i) => net.node(p).run(spec, local[i]!)));
    const roundMs = performance.now() - started;
    if (results.some((r) => r.sources.agreed !== n)) throw new Error('a partition was not agreed');
    const sent = Math.max(...peers.map((p) => net.sent.get(p)!));
    const recv = Math.max(...peers.map((p) => net.received.get(p)!));
    const row = {
      n,
      precision,
      bytesSentPerPeerRatio: +(sent / paramBytes).toFixed(4),
      bytesRecvPerPeerRatio: +(recv / paramBytes).toFixed(4),
      roundMs: Math.round(roundMs),
      naiveBytesSentPerPeerRatio: +(((n - 1) * contributionBytes(P, precision)) / paramBytes).toFixed(4),
      // What the protocol must send, headers aside: its slice of every partition to each owner
      // other than itself (2·(n−1)/n of the vector) and its 2 partitions' results to the n − 1
      // others (2·(n−1)/n again), so 4·(n−1)/n encoded vectors. A top-k round's results are as
      // sparse as the union of the contributions' indices: its figure counts the contributions only.
      protocolRatio: +(((topKOf(precision) ? 2 : 4) * (n - 1) * contributionBytes(P, precision)) / n / paramBytes).toFixed(4),
    };
    rows.push(row);
    console.log(JSON.stringify(row));
  }
}

const main = rows.filter((r) => r.precision === 'fp16');
const ratios = main.map((r) => Math.max(r.bytesSentPerPeerRatio, r.bytesRecvPerPeerRatio));
const flatness = +(Math.max(...ratios) / Math.min(...ratios)).toFixed(4);
const flatnessFrom = (n: number): number => {
  const rs = main.filter((r) => r.n >= n).map((r) => Math.max(r.bytesSentPerPeerRatio, r.bytesRecvPerPeerRatio));
  return +(Math.max(...rs) / Math.min(...rs)).toFixed(4);
};
console.table(rows);

writeCsv(join(RESULTS_DIR, 'allreduce.csv'), rows);
await writeChartPng(join(RESULTS_DIR, 'allreduce.png'), {
  $schema: 'https://vega.github.io/schema/vega-lite/v5.json',
  title: `Bytes sent per peer per round ÷ stage parameter bytes (small, stage ${stage}, ${(paramBytes / 2 ** 20).toFixed(1)} MiB fp32)`,
  width: 520,
  height: 320,
  data: {
    values: rows.flatMap((r) => [
      { n: r.n, ratio: r.bytesSentPerPeerRatio, series: `butterfly, ${r.precision}` },
      { n: r.n, ratio: r.naiveBytesSentPerPeerRatio, series: `naive all-gather, ${r.precision}` },
    ]),
  },
  mark: { type: 'line', point: true },
  encoding: {
    x: { field: 'n', type: 'quantitative', scale: { type: 'log', base: 2 }, title: 'replicas (n)' },
    y: { field: 'ratio', type: 'quantitative', scale: { type: 'log' }, title: 'bytes sent per peer ÷ parameter bytes (log)' },
    color: { field: 'series', type: 'nominal', legend: { labelLimit: 400 } },
  },
});

finish('allreduce', {
  rows: main,
  flatness,
  flatnessFrom4: flatnessFrom(4),
  flatnessFrom8: flatnessFrom(8),
  // Bytes per peer grow as (n − 1)/n toward 2 × the parameter bytes (fp16) and never past it; the
  // 10% flatness goal over n = 2…16 would need n = 2 to send more than it must (see note).
  maxBytesPerPeerRatio: Math.max(...ratios),
  int8Rows: rows.filter((r) => r.precision === 'int8'),
  // Top-32 of each 256 values (codec.ts): each peer's contribution is fixed; the owners' results hold the union of
  // the contributions' indices. These peers' vectors are independent random ones, whose top indices rarely coincide
  // (a stage's replicas' pseudo-gradients share many), so from n = 8 most result blocks go dense: the worst case.
  topk32Rows: rows.filter((r) => r.precision === 'topk32'),
  stage: { preset: 'small', layout, index: stage, parameters: P, parameterBytes: paramBytes },
  transport: 'in-process MemoryNetwork with per-peer byte counting (same ButterflyNode as the WebRTC miners); roundMs is compute only, all peers on one core',
  note:
    'redundancy 2: each peer sends its slice of every partition to both owners and each owner sends its result to every other peer, so bytes per peer = 4·(n−1)/n encoded vectors (+ headers), the protocolRatio column: 2·(n−1)/n × the fp32 parameter bytes at fp16. ' +
    'It is bounded by 4 encoded vectors (2× the parameter bytes at fp16) for every n (O(1)), but the (n−1)/n factor (a peer keeps the share it owns) makes n = 2 cost half of n → ∞: flatness over n = 2…16 is 1.875 by construction, 1.25 from n = 4 and 1.07 from n = 8. ' +
    'No bandwidth-optimal all-reduce is flatter (reduce-scatter + all-gather sends 2·(n−1)/n vectors; redundancy 2 doubles it); meeting 10% over 2…16 would mean padding small rounds with bytes nobody needs.',
  machine: machine('js (no tensors)'),
});
