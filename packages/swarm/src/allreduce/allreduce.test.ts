import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex } from '@noble/hashes/utils';
import { mulberry32 as rng } from '@train-at-home/model';
import { describe, expect, it } from 'vitest';
import { AllReduceError, MSG, decodeMessage, encodeMessage, roundPartitionMap, type RoundResult, type RoundSpec } from './butterfly';
import { blockLeaves, contributionRoot, merkleRoot, rangeProof, verifyRange } from './commitment';
import { MemoryNetwork } from './memory';
import { OuterOptimizer } from './outer';
import { partitionMap } from './partition';
import { reduceContributions } from './reduce';
import { contributionBytes, decodeContribution, encodeContribution, roundPrecision } from './codec';
import { decodeTopK, encodeTopK } from './sparse';
import { decodeValues, encodeValues, encodedBytes, type AllReducePrecision } from './values';

function vectors(ids: string[], length: number, seed = 1): Map<string, Float32Array> {
  const r = rng(seed);
  return new Map(ids.map((id) => [id, Float32Array.from({ length }, () => (r() - 0.5) * 0.02)]));
}

const ids = (n: number): string[] => Array.from({ length: n }, (_, i) => `peer-${i}`);
const FAST = { senderMs: 300, reducerMs: 200, roundMs: 2_000 };

function spec(peers: string[], extra: Partial<RoundSpec> = {}): RoundSpec {
  return {
    round: 1,
    seed: 42,
    participants: peers,
    weights: Object.fromEntries(peers.map((id, i) => [id, i + 1])),
    precision: 'fp32',
    reduction: { kind: 'mean' },
    timeouts: FAST,
    ...extra,
  };
}

/** The weighted mean of the named peers' vectors over [start, end), in float64. */
function meanOf(local: Map<string, Float32Array>, weights: Record<string, number>, names: string[], start: number, end: number): Float64Array {
  const total = names.reduce((s, id) => s + weights[id]!, 0);
  const out = new Float64Array(end - start);
  for (const id of names) for (let i = start; i < end; i++) out[i - start]! += (weights[id]! / total) * local.get(id)![i]!;
  return out;
}

const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
};

async function runAll(net: MemoryNetwork, peers: string[], s: RoundSpec, local: Map<string, Float32Array>): Promise<Map<string, RoundResult>> {
  const results = await Promise.all(peers.map(async (id) => [id, await net.node(id).run(s, local.get(id)!)] as const));
  return new Map(results);
}

describe('partition map', () => {
  it('is the same on every peer for a seed, covers every parameter exactly twice, and follows bandwidth', () => {
    for (const [n, align] of [[2, 1], [3, 1], [4, 1], [8, 1], [16, 1], [3, 256], [16, 256], [39, 256]] as const) {
      const peers = ids(n);
      const length = 10_007;
      const map = partitionMap({ peers, length, seed: 7, align });
      // Same map whatever order a peer lists the others in.
      expect(partitionMap({ peers: [...peers].reverse(), length, seed: 7, align })).toEqual(map);
      // Cut on whole blocks (what a commitment's range proof needs).
      expect(map.every((p) => p.start % align === 0)).toBe(true);
      expect(map).toHaveLength(n);
      const owners = new Uint8Array(length);
      let next = 0;
      for (const p of map) {
        expect(p.start).toBe(next);
        next = p.end;
        expect(p.owners[0]).not.toBe(p.owners[1]);
        for (let i = p.start; i < p.end; i++) owners[i]! += 2;
        if (n >= 3) expect(p.owners).not.toContain(p.auditor);
      }
      expect(next).toBe(length);
      expect(owners.every((c) => c === 2)).toBe(true);
      // Every peer owns exactly two partitions.
      for (const id of peers) expect(map.filter((p) => p.owners.includes(id))).toHaveLength(2);
    }
    // Another seed, another map.
    expect(partitionMap({ peers: ids(8), length: 1000, seed: 8 })).not.toEqual(partitionMap({ peers: ids(8), length: 1000, seed: 7 }));
    // A fast pair of owners gets a bigger partition.
    const bw = Object.fromEntries(ids(4).map((id, i) => [id, i === 0 ? 10 : 1]));
    const sized = partitionMap({ peers: ids(4), length: 1000, seed: 3, bandwidth: bw });
    const withFast = sized.filter((p) => p.owners.includes('peer-0'));
    const without = sized.filter((p) => !p.owners.includes('peer-0'));
    expect(Math.min(...withFast.map((p) => p.end - p.start))).toBeGreaterThan(Math.max(...without.map((p) => p.end - p.start)));
  });

  it('refuses a round of one, and duplicates', () => {
    expect(() => partitionMap({ peers: ['a'], length: 10, seed: 1 })).toThrow(/TOO_FEW_PEERS/);
    expect(() => partitionMap({ peers: ['a', 'a'], length: 10, seed: 1 })).toThrow(/DUPLICATE_PEER/);
    expect(() => partitionMap({ peers: ids(41), length: 10_007, seed: 1, align: 256 })).toThrow(/BAD_LENGTH/);
  });
});

describe('partition values on the wire', () => {
  it('fp32 is exact; fp16 and int8 are within their stated error, deterministic, and their stated size', () => {
    const v = vectors(['x'], 5_000).get('x')!;
    expect(decodeValues(encodeValues(v, 'fp32'), v.length, 'fp32')).toEqual(v);
    for (const [precision, bound] of [
      ['fp16', 2 ** -11],
      ['int8', 0.5 / 127],
    ] as const) {
      const bytes = encodeValues(v, precision);
      expect(bytes.length).toBe(encodedBytes(v.length, precision));
      expect(encodeValues(v, precision)).toEqual(bytes);
      const back = decodeValues(bytes, v.length, precision);
      // Relative to each block's largest magnitude.
      for (let b = 0; b < v.length; b += 256) {
        const block = v.subarray(b, b + 256);
        const max = Math.max(...Array.from(block, Math.abs));
        expect(maxDiff(block, back.subarray(b, b + 256))).toBeLessThanOrEqual(bound * max * 1.0001);
      }
    }
    expect(() => decodeValues(new Uint8Array(7), 2, 'fp32')).toThrow(/BAD_LENGTH/);
    expect(() => encodeValues(Float32Array.of(1, NaN), 'int8')).toThrow(/NOT_FINITE/);
  });
});

describe('butterfly all-reduce', () => {
  it('8 peers end with identical vectors equal to the work-weighted mean; reassembly is exact', async () => {
    const peers = ids(8);
    const local = vectors(peers, 4_099);
    const net = new MemoryNetwork();
    const s = spec(peers);
    const results = await runAll(net, peers, s, local);
    const expected = meanOf(local, s.weights, peers, 0, 4_099);
    for (const r of results.values()) {
      expect(maxDiff(r.values, expected)).toBeLessThan(1e-7);
      expect(r.values).toEqual(results.get('peer-0')!.values);
      expect(r.sources.agreed).toBe(8);
      expect(r.contributors).toEqual(peers);
      expect(r.evidence).toEqual([]);
    }
    expect(net.rejections).toEqual([]);
  });

  it('int8 and fp16 rounds agree on every peer, within quantization error of the mean', async () => {
    const peers = ids(4);
    const local = vectors(peers, 2_000, 5);
    for (const precision of ['fp16', 'int8'] as const) {
      const net = new MemoryNetwork();
      const s = spec(peers, { precision });
      const results = await runAll(net, peers, s, local);
      const expected = meanOf(local, s.weights, peers, 0, 2_000);
      const first = results.get('peer-0')!.values;
      for (const r of results.values()) expect(r.values).toEqual(first);
      expect(maxDiff(first, expected)).toBeLessThan(precision === 'int8' ? 2 * 0.01 / 127 + 1e-6 : 1e-5);
    }
  });

  it('CenteredClip reports the clipped contribution and stays near the honest mean', async () => {
    const peers = ids(5);
    const local = vectors(peers, 1_000, 9);
    const outlier = local.get('peer-4')!;
    for (let i = 0; i < outlier.length; i++) outlier[i] = 5;
    const net = new MemoryNetwork();
    const s = spec(peers, { weights: Object.fromEntries(peers.map((id) => [id, 1])), reduction: { kind: 'centered-clip', radius: 0.5 } });
    const results = await runAll(net, peers, s, local);
    const honest = meanOf(local, s.weights, peers.slice(0, 4), 0, 1_000);
    const clipped = [...results.values()].reduce((n, r) => n + r.clipped, 0);
    // Each of the 5 partitions is reduced by 2 owners, each of which clips the outlier, and names it.
    expect(clipped).toBe(10);
    const named = [...results.values()].flatMap((r) => r.clippedFrom);
    expect(named.map((c) => c.from)).toEqual(Array(10).fill('peer-4'));
    expect(new Set(named.map((c) => c.partition))).toEqual(new Set([0, 1, 2, 3, 4]));
    for (const r of results.values()) {
      expect(r.values).toEqual(results.get('peer-0')!.values);
      expect(maxDiff(r.values, honest)).toBeLessThan(0.02);
    }
  });

  it('CenteredClip relative to the stage peers (the default): a scaled contribution is clipped, whatever the scale, honest ones are not', async () => {
    for (const scale of [1e-4, 1, 1e3]) {
      const peers = ids(5);
      const local = vectors(peers, 1_000, 11);
      for (const v of local.values()) for (let i = 0; i < v.length; i++) v[i]! *= scale;
      // A poisoned contribution: an honest one scaled up twentyfold.
      const poisoned = local.get('peer-4')!;
      for (let i = 0; i < poisoned.length; i++) poisoned[i]! *= 20;
      const s = spec(peers, { weights: Object.fromEntries(peers.map((id) => [id, 1])), reduction: { kind: 'centered-clip', radius: 2, relative: true } });
      const results = await runAll(new MemoryNetwork(), peers, s, local);
      // Each of the 5 partitions is reduced by 2 owners, each of which clips the poisoned one and no other.
      expect([...results.values()].reduce((n, r) => n + r.clipped, 0)).toBe(10);
      expect(new Set([...results.values()].flatMap((r) => r.clippedFrom.map((c) => c.from)))).toEqual(new Set(['peer-4']));
      const honest = meanOf(local, s.weights, peers.slice(0, 4), 0, 1_000);
      const plain = meanOf(local, s.weights, peers, 0, 1_000);
      for (const r of results.values()) {
        expect(r.values).toEqual(results.get('peer-0')!.values);
        // Far nearer the honest mean than a plain mean is: the poisoned one counts at most τ.
        expect(maxDiff(r.values, honest)).toBeLessThan(0.25 * maxDiff(Float32Array.from(plain), honest));
      }
    }
  });

  it('CenteredClip relative to the stage peers: honest contributions alone reduce to their weighted mean, and two are never clipped', () => {
    const r = rng(5);
    const honest = Array.from({ length: 6 }, (_, i) => ({ values: Float32Array.from({ length: 500 }, () => (r() - 0.5) * 0.02), weight: i + 1 }));
    const relative = { kind: 'centered-clip', radius: 2, relative: true } as const;
    for (const group of [honest, honest.slice(0, 2)]) {
      const clip = reduceContributions(group, relative);
      const mean = reduceContributions(group, { kind: 'mean' });
      expect(clip.clipped).toBe(0);
      expect(maxDiff(clip.values, mean.values)).toBeLessThan(1e-7);
    }
    // Two contributions, one of them huge: at the same distance from their median, neither is clipped.
    const two = [honest[0]!, { values: honest[1]!.values.map((x) => 100 * x), weight: 1 }];
    expect(reduceContributions(two, relative).clipped).toBe(0);
  });

  it('a round with too few peers fails with a typed error', async () => {
    const net = new MemoryNetwork();
    await expect(net.node('a').run(spec(['a']), new Float32Array(10))).rejects.toThrow(AllReduceError);
    await expect(net.node('b').run(spec(['a', 'c']), new Float32Array(10))).rejects.toThrow(/NOT_A_PARTICIPANT/);
    // The other peer never comes: only this peer's own contribution reaches the owners.
    await expect(net.node('c').run(spec(['c', 'd']), new Float32Array(10))).rejects.toThrow(/TOO_FEW_PEERS/);
  });

  for (const [when, victims] of [
    ['before sending', 1],
    ['before sending', 3],
    ['mid-send', 2],
    ['mid-reduce', 1],
    ['mid-reduce', 3],
  ] as const) {
    it(`8 replicas, ${victims} killed ${when}: the round completes, nothing is lost or NaN, survivors agree`, async () => {
      const peers = ids(8);
      const length = 3_001;
      const local = vectors(peers, length, victims * 13);
      const net = new MemoryNetwork();
      const s = spec(peers);
      const map = roundPartitionMap(peers, length, s.seed);
      const dead = peers.slice(2, 2 + victims);
      const sentContribs = new Map<string, number>();
      // Which partitions' contributions each victim delivered before dying (mid-send).
      net.intercept = (from, to, bytes) => {
        if (!dead.includes(from)) return bytes;
        const m = decodeMessage(bytes);
        if (when === 'mid-send' && m.type === MSG.contribution) {
          const n = (sentContribs.get(from) ?? 0) + 1;
          sentContribs.set(from, n);
          if (n > 5) {
            net.kill(from);
            return null;
          }
        }
        if (when === 'mid-reduce' && m.type === MSG.result) {
          net.kill(from);
          return null;
        }
        return bytes;
      };
      if (when === 'before sending') dead.forEach((d) => net.kill(d));
      const survivors = peers.filter((p) => !dead.includes(p));
      const running = peers.filter((p) => when !== 'before sending' || survivors.includes(p));
      const all = await Promise.all(running.map(async (id) => [id, await net.node(id).run(s, local.get(id)!).catch((e: Error) => e)] as const));
      const results = new Map(all.filter(([id]) => survivors.includes(id)) as Array<[string, RoundResult]>);
      expect(results.size).toBe(survivors.length);
      for (const r of results.values()) {
        expect(r).not.toBeInstanceOf(Error);
        expect(r.values.every(Number.isFinite)).toBe(true);
      }
      for (const p of map) {
        const liveOwners = p.owners.filter((o) => survivors.includes(o));
        const reducerFailed = liveOwners.length < 2;
        const slices = [...results.values()].map((r) => r.values.subarray(p.start, p.end));
        if (liveOwners.length === 0) {
          // Both owners died: every peer keeps its own local value.
          for (const [id, r] of results) expect(r.values.subarray(p.start, p.end)).toEqual(local.get(id)!.subarray(p.start, p.end));
          continue;
        }
        for (const slice of slices) expect(slice).toEqual(slices[0]);
        if (reducerFailed) continue;
        // Both owners alive: the mean over the contributors they named, which are the survivors
        // (plus, mid-send, a victim whose slice reached both owners before it died).
        const contributorsHere = survivors.concat(
          when === 'before sending' ? [] : dead.filter((d) => when === 'mid-reduce' || p.owners.every((o) => receivedFrom(o, d, p.index))),
        );
        expect(maxDiff(slices[0]!, meanOf(local, s.weights, contributorsHere, p.start, p.end))).toBeLessThan(1e-5);
      }

      function receivedFrom(owner: string, victim: string, partition: number): boolean {
        // The victim sent contributions in partition order, to owners[0] then owners[1]; it got 5 out.
        const order = map.flatMap((q) => q.owners.filter((o) => o !== victim).map((o) => [q.index, o] as const));
        return order.slice(0, 5).some(([q, o]) => q === partition && o === owner);
      }
    });
  }

  for (const lie of ['scaled', 'noisy'] as const) {
    it(`a lying owner (${lie}) is caught by every receiver, the true value is used, and the liar is named`, async () => {
      const peers = ids(6);
      const length = 1_200;
      const local = vectors(peers, length, 77);
      const net = new MemoryNetwork();
      const s = spec(peers);
      const map = roundPartitionMap(peers, length, s.seed);
      const liar = 'peer-3';
      const r = rng(3);
      net.intercept = (from, _to, bytes) => {
        if (from !== liar) return bytes;
        const m = decodeMessage(bytes);
        if (m.type !== MSG.result) return bytes;
        const p = map[m.partition]!;
        const v = decodeValues(m.values, p.end - p.start, 'fp32');
        for (let i = 0; i < v.length; i++) v[i] = lie === 'scaled' ? v[i]! * 1.5 : v[i]! + (r() - 0.5) * 1e-3;
        return encodeMessage({ ...m, values: encodeValues(v, 'fp32') });
      };
      const results = await runAll(net, peers, s, local);
      const expected = meanOf(local, s.weights, peers, 0, length);
      const liarsPartitions = map.filter((p) => p.owners.includes(liar)).map((p) => p.index);
      for (const [id, res] of results) {
        expect(maxDiff(res.values, expected)).toBeLessThan(1e-7);
        if (id === liar) continue;
        expect(res.evidence.map((e) => e.partition).sort()).toEqual([...liarsPartitions].sort());
        for (const e of res.evidence) {
          expect(e.liar).toBe(liar);
          expect(e.hashes[0]).not.toBe(e.hashes[1]);
        }
      }
    });
  }

  it('refuses malformed, foreign and misdirected messages by name, and the round is unharmed', async () => {
    const peers = ids(3);
    const local = vectors(peers, 300);
    const net = new MemoryNetwork();
    const s = spec(peers);
    const map = roundPartitionMap(peers, 300, s.seed);
    const running = runAll(net, peers, s, local);
    const victim = net.node('peer-0');
    const notOwned = map.find((p) => !p.owners.includes('peer-0'))!;
    victim.deliver('peer-1', new Uint8Array(5));
    victim.deliver('stranger', encodeMessage({ type: MSG.contribution, precision: 'fp32', partition: 0, round: 1, weight: 1, indices: [], verdict: 0, values: new Uint8Array(4 * (map[0]!.end - map[0]!.start)) }));
    victim.deliver('peer-1', encodeMessage({ type: MSG.contribution, precision: 'fp32', partition: notOwned.index, round: 1, weight: 1, indices: [], verdict: 0, values: new Uint8Array(4) }));
    victim.deliver('peer-1', encodeMessage({ type: MSG.contribution, precision: 'fp32', partition: 9, round: 1, weight: 1, indices: [], verdict: 0, values: new Uint8Array(0) }));
    const results = await running;
    const expected = meanOf(local, s.weights, peers, 0, 300);
    for (const r of results.values()) expect(maxDiff(r.values, expected)).toBeLessThan(1e-7);
    expect(net.rejections.map((r) => r.code).sort()).toEqual(['BAD_PARTITION', 'MALFORMED', 'NOT_OWNER', 'NOT_PARTICIPANT']);
  });
});

describe('what owners received', () => {
  it('each owner records the hash of every slice it received, so a contribution other than the honest one is seen by both its owners', async () => {
    const peers = ids(5);
    const local = vectors(peers, 2_000);
    const net = new MemoryNetwork();
    const s = spec(peers, { precision: 'int8' });
    // peer-3 sends ten times its contribution (what an audit then compares with where its round leads).
    const sent = new Map(local);
    sent.set('peer-3', local.get('peer-3')!.map((x) => x * 10));
    const results = await runAll(net, peers, s, sent);
    const map = roundPartitionMap(peers, 2_000, s.seed);
    const hash = (v: Float32Array, p: { start: number; end: number }): string => bytesToHex(sha256(encodeValues(v.subarray(p.start, p.end), 'int8')));
    for (const p of map) {
      for (const owner of p.owners) {
        const said = results.get(owner)!.received.filter((r) => r.partition === p.index);
        // Every sender, the owner itself included, once per partition it owns.
        expect(said.map((r) => r.from).sort()).toEqual([...peers].sort());
        for (const r of said) expect(r.hash).toBe(hash(sent.get(r.from)!, p));
        expect(said.find((r) => r.from === 'peer-3')!.hash).not.toBe(hash(local.get('peer-3')!, p));
      }
    }
  });
});

describe('committed contributions', () => {
  it('a range proof ties any run of leaves to the root, and nothing else', () => {
    const leaf = (i: number): Uint8Array => sha256(Uint8Array.of(i));
    for (let total = 1; total <= 13; total++) {
      const leaves = Array.from({ length: total }, (_, i) => leaf(i));
      const root = merkleRoot(leaves);
      for (let from = 0; from < total; from++) {
        for (let to = from + 1; to <= total; to++) {
          const proof = rangeProof(leaves, from, to);
          const range = leaves.slice(from, to);
          expect(verifyRange(range, from, total, proof, root)).toBe(true);
          // Another leaf in the range, the range elsewhere, a proof with a hash more or less: refused.
          expect(verifyRange([leaf(99), ...range.slice(1)], from, total, proof, root)).toBe(false);
          if (total > 1 && to - from < total) expect(verifyRange(range, from === 0 ? 1 : from - 1, total, proof, root)).toBe(false);
          expect(verifyRange(range, from, total, [...proof, leaf(7)], root)).toBe(false);
          if (proof.length) expect(verifyRange(range, from, total, proof.slice(1), root)).toBe(false);
        }
      }
    }
  });

  it('an encoded slice cut on block boundaries has the leaves of the whole vector there, in every precision', () => {
    const v = vectors(['a'], 256 * 7 + 13).get('a')!;
    for (const precision of ['fp32', 'fp16', 'int8', 'topk8', 'topk32'] as const) {
      const whole = blockLeaves(encodeContribution(v, precision), v.length, precision);
      expect(whole.length).toBe(8);
      const slice = blockLeaves(encodeContribution(v.subarray(256 * 2, 256 * 5), precision), 256 * 3, precision);
      expect(slice.map((h) => bytesToHex(h))).toEqual(whole.slice(2, 5).map((h) => bytesToHex(h)));
      const tail = blockLeaves(encodeContribution(v.subarray(256 * 6), precision), 256 + 13, precision);
      expect(tail.map((h) => bytesToHex(h))).toEqual(whole.slice(6).map((h) => bytesToHex(h)));
      // Bytes of another length are not a contribution of this precision.
      expect(() => blockLeaves(encodeContribution(v, precision).subarray(1), v.length, precision)).toThrow(RangeError);
    }
  });

  for (const precision of ['fp32', 'int8', 'topk32'] as const) {
    it(`a contribution that differs from its commitment is refused by its owners and left out of the merge (${precision})`, async () => {
      const peers = ids(5);
      const length = 256 * 12 + 100;
      const local = vectors(peers, length, 5);
      const commitments = Object.fromEntries(peers.map((id) => [id, contributionRoot(local.get(id)!, precision)]));
      const s = spec(peers, { precision, commitments });
      // Committed and sent alike: every slice is taken.
      const honestNet = new MemoryNetwork();
      const honest = await runAll(honestNet, peers, s, local);
      expect(honestNet.rejections).toEqual([]);
      for (const r of honest.values()) {
        expect(r.contributors).toEqual([...peers].sort());
        expect(r.refused).toEqual([]);
      }
      // peer-2 committed to its honest contribution, then sends three times it.
      const net = new MemoryNetwork();
      const sent = new Map(local);
      sent.set('peer-2', local.get('peer-2')!.map((x) => 3 * x));
      const results = await runAll(net, peers, s, sent);
      const map = roundPartitionMap(peers, length, s.seed);
      const hisOwners = map.flatMap((p) => p.owners.filter((o) => o !== 'peer-2').map((o) => `${o}:${p.index}`)).sort();
      expect(net.rejections.every((r) => r.code === 'COMMITMENT_MISMATCH' && r.from === 'peer-2')).toBe(true);
      expect(net.rejections.length).toBe(hisOwners.length);
      const others = peers.filter((id) => id !== 'peer-2');
      const expected = meanOf(local, s.weights, others, 0, length);
      for (const [id, r] of results) {
        expect(r.contributors).toEqual(others);
        expect(r.refused.map((x) => `${id}:${x.partition}`).sort()).toEqual(hisOwners.filter((k) => k.startsWith(`${id}:`)));
        if (precision === 'fp32') expect(maxDiff(r.values, expected)).toBeLessThan(1e-7);
      }
      // A peer whose root the round does not have cannot start it.
      await expect(new MemoryNetwork().node('peer-0').run(spec(peers, { commitments: { ...commitments, 'peer-4': 'x' } }), local.get('peer-0')!)).rejects.toThrow(/BAD_INPUT/);
    });
  }
});

describe('top-k rounds (compressed contributions)', () => {
  /** What each contribution carries at a top-k precision: its k largest of each block, as the owners decode them. */
  const sentOf = (local: Map<string, Float32Array>, precision: AllReducePrecision): Map<string, Float32Array> =>
    new Map([...local].map(([id, v]) => [id, decodeContribution(encodeContribution(v, precision), v.length, precision)]));

  for (const precision of ['topk32', 'topk8'] as const) {
    it(`${precision}: every peer ends with the same vector, the work-weighted mean of what the contributions carried, for a fraction of fp16's bytes`, async () => {
      const peers = ids(6);
      const length = 256 * 20 + 37;
      const local = vectors(peers, length, 11);
      const commitments = Object.fromEntries(peers.map((id) => [id, contributionRoot(local.get(id)!, precision)]));
      const net = new MemoryNetwork();
      const results = await runAll(net, peers, spec(peers, { precision, commitments }), local);
      expect(net.rejections).toEqual([]);
      const sent = sentOf(local, precision);
      const expected = meanOf(sent, spec(peers).weights, peers, 0, length);
      const first = results.get(peers[0]!)!.values;
      // The results are int8 under a scale per block: within half a step of the block's largest magnitude / 127.
      let largest = 0;
      for (const x of expected) largest = Math.max(largest, Math.abs(x));
      for (const r of results.values()) {
        expect(r.contributors).toEqual([...peers].sort());
        expect(r.sources.agreed).toBe(roundPartitionMap(peers, length, 42).length);
        expect([...r.values]).toEqual([...first]);
        expect(maxDiff(r.values, expected)).toBeLessThanOrEqual(largest / 127 / 2 + 1e-9);
      }
      // Zero wherever no contribution carried a value (an owner's result is sparse).
      let untouched = 0;
      for (let i = 0; i < length; i++) if ([...sent.values()].every((v) => v[i] === 0)) (untouched++, expect(first[i]).toBe(0));
      expect(untouched).toBeGreaterThan(0);
      const dense = new MemoryNetwork();
      await runAll(dense, peers, spec(peers, { precision: 'fp16', commitments: Object.fromEntries(peers.map((id) => [id, contributionRoot(local.get(id)!, 'fp16')])) }), local);
      const bytes = (n: MemoryNetwork): number => [...n.sent.values()].reduce((a, b) => a + b, 0);
      // Each contribution is (4 + 2k) bytes a block against fp16's 516; a result is as sparse as the union of six
      // peers' indices (up to 6k of 256), and headers and range proofs are the same in both rounds.
      expect(bytes(net) / bytes(dense)).toBeLessThan(precision === 'topk32' ? 0.5 : 0.25);
    });
  }

  it('a top-k contribution that is malformed, out of range or over its budget is refused by name and changes nothing', async () => {
    const peers = ids(4);
    const length = 256 * 8;
    const local = vectors(peers, length, 3);
    const net = new MemoryNetwork();
    const s = spec(peers, { precision: 'topk32' });
    const map = roundPartitionMap(peers, length, s.seed);
    const owned = map.find((p) => p.owners.includes('peer-0') && !p.owners.includes('peer-1'))!;
    const n = owned.end - owned.start;
    const honest = encodeContribution(local.get('peer-1')!.subarray(owned.start, owned.end), 'topk32');
    const contribution = (values: Uint8Array): Uint8Array => encodeMessage({ type: MSG.contribution, precision: 'topk32', partition: owned.index, round: 1, weight: 2, indices: [], verdict: 0, values });
    const unsorted = Uint8Array.from(honest);
    [unsorted[4], unsorted[5]] = [unsorted[5]!, unsorted[4]!];
    const outOfRange = Uint8Array.from(honest);
    new DataView(outOfRange.buffer).setInt8(4 + 32, -128);
    const badScale = Uint8Array.from(honest);
    new DataView(badScale.buffer).setFloat32(0, Number.NaN, true);
    // Before the round starts here: queued, then read first, ahead of peer-1's own contribution.
    for (const bad of [unsorted, outOfRange, badScale, encodeValues(local.get('peer-1')!.subarray(owned.start, owned.end), 'int8'), honest.subarray(0, honest.length - 2)]) net.node('peer-0').deliver('peer-1', contribution(bad));
    expect(contributionBytes(n, 'topk32')).toBe(honest.length);
    const results = await runAll(net, peers, s, local);
    expect(net.rejections.map((r) => `${r.at}<${r.from}:${r.code}`)).toEqual(Array(5).fill('peer-0<peer-1:BAD_VALUES'));
    // peer-1's honest contribution came after and was taken: the round is the one with no bad message.
    const clean = await runAll(new MemoryNetwork(), peers, { ...s, round: 2 }, local);
    for (const [id, r] of results) {
      expect(r.contributors).toEqual([...peers].sort());
      expect([...r.values]).toEqual([...clean.get(id)!.values]);
    }
  });

  it('weights are never sparsified: an average round of a top-k run runs at fp16', () => {
    expect(roundPrecision('topk32', 'outer')).toBe('topk32');
    expect(roundPrecision('topk32', 'average')).toBe('fp16');
    expect(roundPrecision('int8', 'average')).toBe('int8');
    // The top-k encoding the round sends is sparse.ts's, at its fixed size.
    const v = vectors(['a'], 600).get('a')!;
    expect([...decodeContribution(encodeContribution(v, 'topk8'), 600, 'topk8')]).toEqual([...decodeTopK(encodeTopK(v, 8), 600, 8)]);
  });
});

describe('reduction edge cases', () => {
  it('contributions that all weigh zero (no work verified yet) are averaged equally, never NaN; none at all is refused', () => {
    const a = Float32Array.from([1, 2, 3]);
    const b = Float32Array.from([3, 4, 5]);
    for (const reduction of [{ kind: 'mean' as const }, { kind: 'centered-clip' as const, radius: 10 }]) {
      expect(Array.from(reduceContributions([{ values: a, weight: 0 }, { values: b, weight: 0 }], reduction).values)).toEqual([2, 3, 4]);
    }
    expect(() => reduceContributions([], { kind: 'mean' })).toThrow(RangeError);
  });
});

describe('outer step', () => {
  it('replicas applying the same averaged pseudo-gradient to the same anchor end identical; Nesterov as specified', () => {
    const anchor = Float32Array.of(1, 2, 3);
    const a = new OuterOptimizer(Float32Array.from(anchor));
    const b = new OuterOptimizer(Float32Array.from(anchor));
    expect(a.stateId()).toBe(b.stateId());
    const delta = a.pseudoGradient(Float32Array.of(0.9, 2.1, 3));
    expect(Array.from(delta).map((x) => +x.toFixed(5))).toEqual([0.1, -0.1, 0]);
    const next = a.step(delta, { lr: 0.7, momentum: 0.9 });
    // m = Δ; θ = anchor − 0.7(Δ + 0.9Δ)
    expect(next[0]).toBeCloseTo(1 - 0.7 * 1.9 * 0.1, 6);
    expect(b.step(delta, { lr: 0.7, momentum: 0.9 })).toEqual(next);
    expect(a.stateId()).toBe(b.stateId());
    b.reset(next);
    expect(b.stateId()).not.toBe(a.stateId()); // momentum differs
  });
});
