// One file over 400 lines: one round of the butterfly (scatter, agree, gather, compare, audit of a disputed partition)
// shares one Round's state and its wire format; the encodings are codec.ts's, commitments commitment.ts's.
import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex } from '@noble/hashes/utils';
import { blockLeaves, decodeProof, encodeProof, rangeProof, verifyRange } from './commitment';
import { partitionMap, type Partition } from './partition';
import { reduceContributions, type Reduction } from './reduce';
import { contributionBytes, decodeContribution, decodeResult, encodeContribution, encodeResult } from './codec';
import { BLOCK, PRECISION_CODES, ValuesError, type AllReducePrecision } from './values';

/**
 * The butterfly all-reduce of one stage's replicas (redundancy 2).
 *
 *   scatter   every peer sends its slice of each partition to the partition's two owners;
 *   agree     the two owners swap the list of contributions each received by the
 *             sender deadline and both reduce over the intersection, so a sender
 *             that died mid-send is left out by both, identically;
 *   gather    each owner sends its reduced partition to every peer;
 *   compare   every peer receives each partition from both owners; if they
 *             disagree it is evidence, and the partition's auditor (a third peer)
 *             collects the contributions again, recomputes, and names the owner
 *             that told the truth; everyone takes that owner's value.
 *
 * A partition whose owners both died keeps each peer's local value (never lost,
 * never NaN). Every wait has a named deadline; the round always ends.
 *
 * Wire format of one all-reduce message (little-endian), the payload of a
 * 'partition' frame between peers:
 *   0  u8   type: 1 contribution, 2 contributor set, 3 result, 4 audit request, 5 audit contribution, 6 audit verdict
 *   1  u8   precision: 0 fp32, 1 fp16, 2 int8, 3 topk8, 4 topk32
 *   2  u16  partition index
 *   4  u32  round
 *   8  f64  weight of a contribution (work since the last merge), else 0
 *   16 u16  k: number of participant indices that follow
 *   18 u16  verdict bits (audit verdict: 1 = first owner right, 2 = second owner right)
 *   20 k×u16 participant indices (into the sorted participant list)
 *   .. encoded values (codec.ts: a contribution's, or a result's); a contribution in a round with
 *      commitments is followed by its range proof (commitment.ts), 32 bytes a hash
 */
export const MSG = { contribution: 1, contributors: 2, result: 3, auditRequest: 4, auditContribution: 5, auditVerdict: 6 } as const;
type MsgType = (typeof MSG)[keyof typeof MSG];
const HEADER = 20;

export interface AllReduceMessage {
  type: MsgType;
  precision: AllReducePrecision;
  partition: number;
  round: number;
  weight: number;
  indices: number[];
  verdict: number;
  values: Uint8Array;
}

export type AllReduceRejection =
  | 'MALFORMED'
  | 'NOT_PARTICIPANT'
  | 'BAD_PARTITION'
  | 'NOT_OWNER'
  | 'NOT_FROM_OWNER'
  | 'NOT_FROM_AUDITOR'
  | 'DUPLICATE'
  | 'BAD_VALUES'
  | 'COMMITMENT_MISMATCH'
  | 'STALE_ROUND';

export class AllReduceError extends Error {
  override name = 'AllReduceError';
  constructor(
    readonly code: 'TOO_FEW_PEERS' | 'NOT_A_PARTICIPANT' | 'BAD_INPUT' | AllReduceRejection,
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

export function encodeMessage(m: AllReduceMessage): Uint8Array {
  const out = new Uint8Array(HEADER + 2 * m.indices.length + m.values.length);
  const view = new DataView(out.buffer);
  view.setUint8(0, m.type);
  view.setUint8(1, PRECISION_CODES[m.precision]);
  view.setUint16(2, m.partition, true);
  view.setUint32(4, m.round, true);
  view.setFloat64(8, m.weight, true);
  view.setUint16(16, m.indices.length, true);
  view.setUint16(18, m.verdict, true);
  m.indices.forEach((x, i) => view.setUint16(HEADER + 2 * i, x, true));
  out.set(m.values, HEADER + 2 * m.indices.length);
  return out;
}

export function decodeMessage(bytes: Uint8Array): AllReduceMessage {
  if (bytes.length < HEADER) throw new AllReduceError('MALFORMED', `${bytes.length} bytes is shorter than the header`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const type = view.getUint8(0);
  if (type < 1 || type > 6) throw new AllReduceError('MALFORMED', `unknown message type ${type}`);
  const code = view.getUint8(1);
  const precision = (Object.keys(PRECISION_CODES) as AllReducePrecision[]).find((p) => PRECISION_CODES[p] === code);
  if (!precision) throw new AllReduceError('MALFORMED', `unknown precision ${code}`);
  const k = view.getUint16(16, true);
  if (bytes.length < HEADER + 2 * k) throw new AllReduceError('MALFORMED', 'truncated participant list');
  const weight = view.getFloat64(8, true);
  if (!Number.isFinite(weight) || weight < 0) throw new AllReduceError('MALFORMED', `weight ${weight}`);
  return {
    type: type as MsgType,
    precision,
    partition: view.getUint16(2, true),
    round: view.getUint32(4, true),
    weight,
    indices: Array.from({ length: k }, (_, i) => view.getUint16(HEADER + 2 * i, true)),
    verdict: view.getUint16(18, true),
    values: bytes.subarray(HEADER + 2 * k),
  };
}

export interface RoundTimeouts {
  /** Owners wait this long (from the round's start) for contributions; later senders are left out. */
  senderMs: number;
  /** Owners wait this long for their co-owner's contributor list; receivers wait twice this for results after the sender deadline. */
  reducerMs: number;
  /** The whole round, audits included; whatever is undecided then keeps its local value. */
  roundMs: number;
}

export const DEFAULT_TIMEOUTS: RoundTimeouts = { senderMs: 10_000, reducerMs: 5_000, roundMs: 30_000 };

export interface RoundSpec {
  round: number;
  /** From the coordinator: the same partition map on every peer. */
  seed: number;
  participants: string[];
  /** Work each participant did since the last merge (verified microbatches); the mean is weighted by it. */
  weights: Record<string, number>;
  precision: AllReducePrecision;
  reduction: Reduction;
  timeouts?: Partial<RoundTimeouts>;
  bandwidth?: Record<string, number>;
  /** Fewer live contributors than this fails the round (TOO_FEW_PEERS). Default 2. */
  minPeers?: number;
  /**
   * Each participant's contribution root, committed with merge-ready before
   * the round (commitment.ts): an owner refuses a slice its sender's root does
   * not prove (COMMITMENT_MISMATCH), and reduces without it. Absent: unchecked.
   */
  commitments?: Record<string, string>;
}

/**
 * The partition map of a round: cut on the encoding's blocks whenever the
 * vector has a block per peer (every stage of a real model does), so that
 * slices can be checked against commitments; per value otherwise.
 */
export function roundPartitionMap(peers: string[], length: number, seed: number, bandwidth?: Record<string, number>): Partition[] {
  return partitionMap({ peers, length, seed, bandwidth, align: length >= peers.length * BLOCK ? BLOCK : 1 });
}

export type PartitionSource = 'agreed' | 'one-owner' | 'audited' | 'own' | 'local';

export interface Evidence {
  round: number;
  partition: number;
  owners: [string, string];
  /** SHA-256 of each owner's encoded result. */
  hashes: [string, string];
  /** The owner the auditor found wrong, when it could tell. */
  liar?: string;
}

export interface RoundResult {
  /** The reduced vector; partitions no live owner delivered hold the local values. */
  values: Float32Array;
  sources: Record<PartitionSource, number>;
  /** Participants whose contribution entered at least one accepted partition. */
  contributors: string[];
  /** Contributions CenteredClip clipped, over the partitions this peer reduced. */
  clipped: number;
  /** Which: each partition this peer reduced, and the sender of each contribution clipped there. */
  clippedFrom: Array<{ partition: number; from: string }>;
  evidence: Evidence[];
  /**
   * What this peer, as an owner, received from each sender: the SHA-256 of the
   * encoded slice, per partition it owns. Reported with `merged`, so an audit
   * can check the contribution a miner sent against where its round leads.
   */
  received: Array<{ partition: number; from: string; hash: string }>;
  /** Contributions this peer, as an owner, refused because their sender's commitment does not prove them. */
  refused: Array<{ partition: number; from: string }>;
  bytesSent: number;
  bytesReceived: number;
  ms: number;
}

/** Sends one message to a peer; a failure (peer gone) is the round's to tolerate. */
export type SendFn = (to: string, bytes: Uint8Array) => Promise<void>;

interface Candidate {
  indices: number[];
  raw: Uint8Array;
  values: Float32Array;
}

const hashHex = (b: Uint8Array): string => bytesToHex(sha256(b));
const sameIndices = (a: number[], b: number[]): boolean => a.length === b.length && a.every((x, i) => x === b[i]);

function agree(a: Candidate, b: Candidate): boolean {
  if (!sameIndices(a.indices, b.indices)) return false;
  let scale = 0;
  for (let i = 0; i < a.values.length; i++) scale = Math.max(scale, Math.abs(a.values[i]!), Math.abs(b.values[i]!));
  const tol = 1e-6 * Math.max(scale, 1e-30);
  for (let i = 0; i < a.values.length; i++) if (Math.abs(a.values[i]! - b.values[i]!) > tol) return false;
  return true;
}

/** One peer's part in one round. Created by ButterflyNode.run; messages arrive through receive(). */
class Round {
  readonly map: Partition[];
  readonly peers: string[];
  private readonly me: number;
  private readonly t: RoundTimeouts;
  private readonly t0 = performance.now();
  private readonly myRaw = new Map<number, Uint8Array>();
  private readonly contributions = new Map<number, Map<number, { values: Float32Array; weight: number }>>();
  /** Hashes of the encoded contributions this owner received, by partition and sender index. */
  private readonly receivedHashes = new Map<number, Map<number, string>>();
  private readonly fixedSets = new Map<number, number[]>();
  private readonly coSets = new Map<number, number[]>();
  private readonly candidates = new Map<number, Map<string, Candidate>>();
  private readonly auditContributions = new Map<number, Map<number, { values: Float32Array; weight: number }>>();
  private readonly verdicts = new Map<number, number>();
  private readonly refused: Array<{ partition: number; from: string }> = [];
  private readonly clippedFrom: Array<{ partition: number; from: string }> = [];
  private readonly waiters = new Set<() => void>();
  bytesSent = 0;
  bytesReceived = 0;

  constructor(
    private readonly selfId: string,
    private readonly spec: RoundSpec,
    private readonly local: Float32Array,
    private readonly send: SendFn,
    private readonly onReject: (from: string, code: AllReduceRejection, message: string) => void,
  ) {
    this.peers = [...spec.participants].sort();
    this.me = this.peers.indexOf(selfId);
    if (this.me < 0) throw new AllReduceError('NOT_A_PARTICIPANT', 'this peer is not in the round');
    if (this.peers.length < (spec.minPeers ?? 2)) throw new AllReduceError('TOO_FEW_PEERS', `${this.peers.length} participant(s)`);
    this.t = { ...DEFAULT_TIMEOUTS, ...spec.timeouts };
    this.map = roundPartitionMap(this.peers, local.length, spec.seed, spec.bandwidth);
    if (spec.commitments) {
      if (local.length < this.peers.length * BLOCK) throw new AllReduceError('BAD_INPUT', `${local.length} values are too few to commit to in ${this.peers.length} partitions of whole blocks`);
      const missing = this.peers.filter((id) => !/^[0-9a-f]{64}$/.test(spec.commitments![id] ?? ''));
      if (missing.length) throw new AllReduceError('BAD_INPUT', `no contribution root for ${missing.length} participant(s)`);
    }
    for (const p of this.map) {
      this.contributions.set(p.index, new Map());
      this.receivedHashes.set(p.index, new Map());
      this.candidates.set(p.index, new Map());
      this.auditContributions.set(p.index, new Map());
    }
  }

  private weightOf(index: number): number {
    return this.spec.weights[this.peers[index]!] ?? 0;
  }

  private message(type: MsgType, partition: number, extra: Partial<AllReduceMessage> = {}): Uint8Array {
    return encodeMessage({ type, precision: this.spec.precision, partition, round: this.spec.round, weight: 0, indices: [], verdict: 0, values: new Uint8Array(0), ...extra });
  }

  private post(to: string, bytes: Uint8Array): void {
    this.bytesSent += bytes.length;
    this.send(to, bytes).catch(() => {}); // a dead peer: its deadline handles it
  }

  /** Resolves when ready() holds or at the deadline (performance.now() time); true if ready. */
  private until(ready: () => boolean, deadline: number): Promise<boolean> {
    if (ready()) return Promise.resolve(true);
    return new Promise((resolve) => {
      const check = (): void => {
        if (!ready()) return;
        this.waiters.delete(check);
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        this.waiters.delete(check);
        resolve(ready());
      }, Math.max(0, deadline - performance.now()));
      this.waiters.add(check);
    });
  }

  private poke(): void {
    for (const w of [...this.waiters]) w();
  }

  async run(): Promise<RoundResult> {
    const { precision } = this.spec;
    // Scatter: the same encoded bytes go to both owners, and an owner reduces the decoded bytes of its own slice too.
    // With commitments, each slice travels with the range proof that ties it to this peer's root.
    for (const p of this.map) this.myRaw.set(p.index, encodeContribution(this.local.subarray(p.start, p.end), precision));
    const leaves = this.spec.commitments ? this.map.flatMap((p) => blockLeaves(this.myRaw.get(p.index)!, p.end - p.start, precision)) : [];
    for (const p of this.map) {
      const slice = this.myRaw.get(p.index)!;
      let raw = slice;
      if (this.spec.commitments) {
        const proof = encodeProof(rangeProof(leaves, p.start / BLOCK, Math.ceil(p.end / BLOCK)));
        raw = new Uint8Array(slice.length + proof.length);
        raw.set(slice);
        raw.set(proof, slice.length);
      }
      for (const owner of p.owners) {
        if (owner === this.selfId) {
          this.contributions.get(p.index)!.set(this.me, { values: decodeContribution(slice, p.end - p.start, precision), weight: this.weightOf(this.me) });
          this.receivedHashes.get(p.index)!.set(this.me, hashHex(slice));
        }
        else this.post(owner, this.message(MSG.contribution, p.index, { weight: this.weightOf(this.me), values: raw }));
      }
    }
    const owned = this.map.filter((p) => p.owners.includes(this.selfId));
    const ownerWork = owned.map((p) => this.reduceAsOwner(p));
    const out = Float32Array.from(this.local);
    const sources: Record<PartitionSource, number> = { agreed: 0, 'one-owner': 0, audited: 0, own: 0, local: 0 };
    const evidence: Evidence[] = [];
    const contributors = new Set<number>();
    await Promise.all([
      ...ownerWork,
      ...this.map.map(async (p) => {
        const decided = await this.decide(p, evidence);
        sources[decided.source]++;
        if (decided.candidate) {
          out.set(decided.candidate.values, p.start);
          decided.candidate.indices.forEach((i) => contributors.add(i));
        }
      }),
    ]);
    const live = [...contributors].map((i) => this.peers[i]!);
    if (live.length < (this.spec.minPeers ?? 2)) throw new AllReduceError('TOO_FEW_PEERS', `only ${live.length} contributor(s) reached the owners in time`);
    const received = owned.flatMap((p) => [...this.receivedHashes.get(p.index)!].map(([i, hash]) => ({ partition: p.index, from: this.peers[i]!, hash })));
    return { values: out, sources, contributors: live.sort(), clipped: this.clippedFrom.length, clippedFrom: this.clippedFrom, evidence, received, refused: this.refused, bytesSent: this.bytesSent, bytesReceived: this.bytesReceived, ms: performance.now() - this.t0 };
  }

  private async reduceAsOwner(p: Partition): Promise<void> {
    const received = this.contributions.get(p.index)!;
    await this.until(() => received.size === this.peers.length, this.t0 + this.t.senderMs);
    const mine = [...received.keys()].sort((a, b) => a - b);
    this.fixedSets.set(p.index, mine);
    const coOwner = p.owners[0] === this.selfId ? p.owners[1] : p.owners[0];
    this.post(coOwner, this.message(MSG.contributors, p.index, { indices: mine }));
    // The co-owner fixes its list by the sender deadline at the latest (earlier when every contribution came).
    await this.until(() => this.coSets.has(p.index), Math.max(performance.now(), this.t0 + this.t.senderMs) + this.t.reducerMs);
    const theirs = this.coSets.get(p.index);
    const indices = theirs ? mine.filter((i) => theirs.includes(i)) : mine;
    // The two owners share no contribution (each heard only from itself, say): nothing to reduce, no result to send.
    if (indices.length === 0) return;
    const { values, clippedAt } = reduceContributions(
      indices.map((i) => received.get(i)!),
      this.spec.reduction,
    );
    for (const at of clippedAt) this.clippedFrom.push({ partition: p.index, from: this.peers[indices[at]!]! });
    const raw = encodeResult(values, this.spec.precision);
    this.candidates.get(p.index)!.set(this.selfId, { indices, raw, values: decodeResult(raw, p.end - p.start, this.spec.precision) });
    const msg = this.message(MSG.result, p.index, { indices, values: raw });
    for (const peer of this.peers) if (peer !== this.selfId) this.post(peer, msg);
    this.poke();
  }

  private async decide(p: Partition, evidence: Evidence[]): Promise<{ source: PartitionSource; candidate?: Candidate }> {
    const got = this.candidates.get(p.index)!;
    const resultsDeadline = this.t0 + this.t.senderMs + 2 * this.t.reducerMs;
    await this.until(() => got.size === 2, Math.min(resultsDeadline, this.t0 + this.t.roundMs));
    const [a, b] = [got.get(p.owners[0]), got.get(p.owners[1])];
    if (!a && !b) return { source: 'local' };
    if (!a || !b) return { source: 'one-owner', candidate: (a ?? b)! };
    if (agree(a, b)) return { source: 'agreed', candidate: a };
    // The owners disagree: evidence. An owner keeps what it computed itself; others ask the auditor.
    const record: Evidence = { round: this.spec.round, partition: p.index, owners: p.owners, hashes: [hashHex(a.raw), hashHex(b.raw)] };
    evidence.push(record);
    const iOwn = p.owners.indexOf(this.selfId);
    if (p.auditor === this.selfId) void this.audit(p, a, b);
    let verdict = 0;
    if (p.auditor) {
      await this.until(() => this.verdicts.has(p.index), this.t0 + this.t.roundMs);
      verdict = this.verdicts.get(p.index) ?? 0;
      if (verdict === 1) record.liar = p.owners[1];
      if (verdict === 2) record.liar = p.owners[0];
    }
    if (iOwn >= 0) return { source: 'own', candidate: iOwn === 0 ? a : b };
    if (verdict === 1) return { source: 'audited', candidate: a };
    if (verdict === 2) return { source: 'audited', candidate: b };
    return { source: 'local' };
  }

  /** The auditor of a disputed partition: collects every claimed contribution again and checks both owners. */
  private async audit(p: Partition, a: Candidate, b: Candidate): Promise<void> {
    const claimed = [...new Set([...a.indices, ...b.indices])].sort((x, y) => x - y);
    const mine = this.auditContributions.get(p.index)!;
    mine.set(this.me, { values: decodeContribution(this.myRaw.get(p.index)!, p.end - p.start, this.spec.precision), weight: this.weightOf(this.me) });
    const request = this.message(MSG.auditRequest, p.index);
    for (const i of claimed) if (i !== this.me) this.post(this.peers[i]!, request);
    await this.until(() => claimed.every((i) => mine.has(i)), this.t0 + this.t.roundMs - this.t.reducerMs);
    const check = (c: Candidate): boolean => {
      if (!c.indices.every((i) => mine.has(i))) return false;
      const { values } = reduceContributions(c.indices.map((i) => mine.get(i)!), this.spec.reduction);
      const raw = encodeResult(values, this.spec.precision);
      return hashHex(raw) === hashHex(c.raw);
    };
    const verdict = (check(a) ? 1 : 0) | (check(b) ? 2 : 0);
    this.verdicts.set(p.index, verdict);
    const msg = this.message(MSG.auditVerdict, p.index, { verdict });
    for (const peer of this.peers) if (peer !== this.selfId) this.post(peer, msg);
    this.poke();
  }

  receive(from: string, bytes: Uint8Array, m: AllReduceMessage): void {
    this.bytesReceived += bytes.length;
    const reject = (code: AllReduceRejection, message: string): void => this.onReject(from, code, message);
    const sender = this.peers.indexOf(from);
    if (sender < 0) return reject('NOT_PARTICIPANT', 'the sender is not in this round');
    const p = this.map[m.partition];
    if (!p) return reject('BAD_PARTITION', `no partition ${m.partition}`);
    if (m.precision !== this.spec.precision) return reject('MALFORMED', `precision ${m.precision}, the round uses ${this.spec.precision}`);
    const n = p.end - p.start;
    // A contribution has a fixed size for its partition; a result (a top-k round's is sparse) is checked as it is read.
    const values = (kind: 'contribution' | 'result', bytes = m.values): Float32Array | undefined => {
      try {
        if (kind === 'result') return decodeResult(bytes, n, m.precision);
        if (bytes.length !== contributionBytes(n, m.precision)) throw new ValuesError('BAD_LENGTH', `${bytes.length} bytes for ${n} values`);
        return decodeContribution(bytes, n, m.precision);
      } catch (e) {
        reject('BAD_VALUES', (e as Error).message);
        return undefined;
      }
    };
    const validIndices = (): boolean => {
      const ok = m.indices.every((x, i) => x < this.peers.length && (i === 0 || x > m.indices[i - 1]!));
      if (!ok) reject('MALFORMED', 'participant indices must be sorted, distinct and in range');
      return ok;
    };
    switch (m.type) {
      case MSG.contribution: {
        if (!p.owners.includes(this.selfId)) return reject('NOT_OWNER', `this peer does not own partition ${p.index}`);
        const box = this.contributions.get(p.index)!;
        // Every contribution taken or refused has its hash recorded: a second one from the sender is a duplicate either way.
        if (this.receivedHashes.get(p.index)!.has(sender)) return reject('DUPLICATE', 'contribution already received');
        if (this.fixedSets.has(p.index)) return; // late: the set is fixed; it rolls into the next round
        const root = this.spec.commitments?.[from];
        const size = contributionBytes(n, m.precision);
        const raw = root ? m.values.subarray(0, size) : m.values;
        const v = values('contribution', raw);
        if (!v) break;
        // What it sent is evidence either way (an audit compares it with where the sender's round leads).
        this.receivedHashes.get(p.index)!.set(sender, hashHex(raw));
        if (root) {
          const proof = decodeProof(m.values.subarray(size));
          if (!proof || !verifyRange(blockLeaves(raw, n, m.precision), p.start / BLOCK, Math.ceil(this.local.length / BLOCK), proof, root)) {
            this.refused.push({ partition: p.index, from });
            return reject('COMMITMENT_MISMATCH', `the slice of partition ${p.index} is not the contribution its sender committed to`);
          }
        }
        box.set(sender, { values: v, weight: this.weightOf(sender) });
        break;
      }
      case MSG.contributors: {
        if (!p.owners.includes(this.selfId) || !p.owners.includes(from)) return reject('NOT_FROM_OWNER', 'contributor lists pass between co-owners only');
        if (this.coSets.has(p.index)) return reject('DUPLICATE', 'contributor list already received');
        if (validIndices()) this.coSets.set(p.index, m.indices);
        break;
      }
      case MSG.result: {
        if (!p.owners.includes(from)) return reject('NOT_FROM_OWNER', `partition ${p.index} is not the sender's`);
        const box = this.candidates.get(p.index)!;
        if (box.has(from)) return reject('DUPLICATE', 'result already received');
        if (!validIndices()) return;
        const v = values('result');
        if (v) box.set(from, { indices: m.indices, raw: m.values, values: v });
        break;
      }
      case MSG.auditRequest: {
        if (p.auditor !== from) return reject('NOT_FROM_AUDITOR', `partition ${p.index} is audited by another peer`);
        this.post(from, this.message(MSG.auditContribution, p.index, { weight: this.weightOf(this.me), values: this.myRaw.get(p.index) ?? new Uint8Array(0) }));
        break;
      }
      case MSG.auditContribution: {
        if (p.auditor !== this.selfId) return reject('NOT_OWNER', `this peer does not audit partition ${p.index}`);
        const box = this.auditContributions.get(p.index)!;
        if (box.has(sender)) return reject('DUPLICATE', 'audit contribution already received');
        const v = values('contribution');
        if (v) box.set(sender, { values: v, weight: this.weightOf(sender) });
        break;
      }
      case MSG.auditVerdict: {
        if (p.auditor !== from) return reject('NOT_FROM_AUDITOR', `partition ${p.index} is audited by another peer`);
        if (!this.verdicts.has(p.index)) this.verdicts.set(p.index, m.verdict & 3);
        break;
      }
    }
    this.poke();
  }
}

/**
 * A peer's all-reduce endpoint: runs rounds and routes incoming messages to
 * the round they belong to. Messages for a round that has not started here
 * yet (a faster peer began first) wait for it, a bounded number of them.
 */
export class ButterflyNode {
  private current?: { round: number; r: Round };
  /** The round that just ended here: it still answers its auditor, which may be finishing. */
  private finished?: { round: number; r: Round };
  private readonly early: Array<{ from: string; bytes: Uint8Array; m: AllReduceMessage }> = [];
  private lastRound = -1;

  constructor(
    readonly selfId: string,
    private readonly send: SendFn,
    private readonly onReject: (from: string, code: AllReduceRejection, message: string) => void = () => {},
  ) {}

  deliver(from: string, bytes: Uint8Array): void {
    let m: AllReduceMessage;
    try {
      m = decodeMessage(bytes);
    } catch (e) {
      this.onReject(from, 'MALFORMED', (e as Error).message);
      return;
    }
    if (this.current && m.round === this.current.round) return this.current.r.receive(from, bytes, m);
    if (this.finished && m.round === this.finished.round && m.type === MSG.auditRequest) return this.finished.r.receive(from, bytes, m);
    if (m.round <= this.lastRound) return this.onReject(from, 'STALE_ROUND', `round ${m.round} is over here`);
    if (this.early.length < 65_536) this.early.push({ from, bytes, m });
  }

  /** Runs one round with this peer's local vector; every peer of the round calls this with the same spec. */
  async run(spec: RoundSpec, local: Float32Array): Promise<RoundResult> {
    if (!(local instanceof Float32Array) || local.length === 0) throw new AllReduceError('BAD_INPUT', 'the local vector must be a non-empty Float32Array');
    if (spec.round <= this.lastRound) throw new AllReduceError('STALE_ROUND', `round ${spec.round} after ${this.lastRound}`);
    const r = new Round(this.selfId, spec, local, this.send, this.onReject);
    this.current = { round: spec.round, r };
    this.lastRound = spec.round;
    const mine = this.early.filter((e) => e.m.round === spec.round);
    this.early.splice(0, this.early.length, ...this.early.filter((e) => e.m.round > spec.round));
    for (const e of mine) r.receive(e.from, e.bytes, e.m);
    try {
      return await r.run();
    } finally {
      if (this.current?.r === r) this.current = undefined;
      this.finished = { round: spec.round, r };
    }
  }
}
