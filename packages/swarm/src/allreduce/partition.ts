import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex, utf8ToBytes } from '@noble/hashes/utils';

/** One slice [start, end) of the flat vector and the two peers that reduce it. */
export interface Partition {
  index: number;
  start: number;
  end: number;
  /** Two distinct owners (redundancy 2): both reduce it, every receiver compares them. */
  owners: [string, string];
  /** Asked to recompute the partition when its owners disagree (absent with fewer than 3 peers). */
  auditor?: string;
}

export interface PartitionMapOptions {
  /** Every peer of the round; order does not matter (the map sorts them). */
  peers: string[];
  /** Length of the flat vector. */
  length: number;
  /** Published by the coordinator for the round, so every peer computes the same map. */
  seed: number;
  /** Measured bandwidth per peer (any unit): a partition's size follows its owners' mean. Equal sizes without it. */
  bandwidth?: Record<string, number>;
  /**
   * Partitions start on multiples of this many values (the last one ends at
   * the vector's end), so a slice's encoded blocks are the whole vector's
   * blocks and an owner can check them against a commitment (commitment.ts).
   * Default 1.
   */
  align?: number;
}

export class PartitionError extends Error {
  override name = 'PartitionError';
  constructor(
    readonly code: 'TOO_FEW_PEERS' | 'DUPLICATE_PEER' | 'BAD_LENGTH',
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

/**
 * The round's partition map, a pure function of (peers, length, seed,
 * bandwidth): the peers are put in a seeded order π; partition i is owned by
 * π[i] and π[i+1] (cyclically) and audited by π[i+2]. So with n peers there
 * are n partitions, every peer owns exactly two, and every element of the
 * vector lies in exactly one partition with exactly two owners.
 */
export function partitionMap(o: PartitionMapOptions): Partition[] {
  const peers = [...o.peers].sort();
  if (new Set(peers).size !== peers.length) throw new PartitionError('DUPLICATE_PEER', 'a peer is listed twice');
  if (peers.length < 2) throw new PartitionError('TOO_FEW_PEERS', `${peers.length} peer(s); an all-reduce needs at least 2`);
  const align = o.align ?? 1;
  const units = Math.ceil(o.length / align);
  if (!Number.isInteger(o.length) || !Number.isInteger(align) || align < 1 || units < peers.length) {
    throw new PartitionError('BAD_LENGTH', `cannot cut ${o.length} values into ${peers.length} partitions${align > 1 ? ` of whole ${align}-value blocks` : ''}`);
  }
  const key = (id: string): string => bytesToHex(sha256(utf8ToBytes(`${o.seed}:${id}`)));
  const order = peers.map((id) => ({ id, k: key(id) })).sort((a, b) => (a.k < b.k ? -1 : a.k > b.k ? 1 : 0)).map((x) => x.id);
  const n = order.length;
  const share = order.map((_, i) => {
    const a = o.bandwidth?.[order[i]!] ?? 1;
    const b = o.bandwidth?.[order[(i + 1) % n]!] ?? 1;
    return Math.max(1e-9, (a + b) / 2);
  });
  const total = share.reduce((s, x) => s + x, 0);
  // Sizes (in blocks of `align`) proportional to share, each at least 1, summing exactly to the block count.
  const sizes = share.map((s) => Math.max(1, Math.floor((units * s) / total)));
  let excess = sizes.reduce((s, x) => s + x, 0) - units;
  for (let i = n - 1; excess !== 0; i = (i + n - 1) % n) {
    if (excess > 0 && sizes[i]! > 1) {
      sizes[i]!--;
      excess--;
    } else if (excess < 0) {
      sizes[i]!++;
      excess++;
    }
  }
  const partitions: Partition[] = [];
  let start = 0;
  for (let i = 0; i < n; i++) {
    const end = i === n - 1 ? o.length : start + sizes[i]! * align;
    partitions.push({
      index: i,
      start,
      end,
      owners: [order[i]!, order[(i + 1) % n]!],
      ...(n >= 3 ? { auditor: order[(i + 2) % n]! } : {}),
    });
    start = end;
  }
  return partitions;
}
