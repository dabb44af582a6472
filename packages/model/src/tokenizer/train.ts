import { BYTE_TOKENS, type TokenizerJSON } from './bpe';
import { pretokenize, utf8Bytes } from './pretokenize';

/**
 * Trains a byte-level BPE tokenizer: counts pre-tokens, then repeatedly merges
 * the most frequent adjacent pair. Deterministic: ties go to the smallest
 * (left, right) pair, and nothing depends on Map iteration order.
 *
 * Cost is dominated by counting; each merge only touches the words that hold
 * the merged pair (an index from pair to words, and a max-heap with lazy
 * deletion for the counts).
 */
export function trainBpe(texts: Iterable<string>, vocabSize: number): TokenizerJSON {
  const mergeCount = vocabSize - BYTE_TOKENS - 1;
  if (mergeCount < 0) throw new RangeError(`vocabSize must be at least ${BYTE_TOKENS + 1}`);

  const wordFreq = new Map<string, number>();
  for (const text of texts) {
    for (const piece of pretokenize(text)) wordFreq.set(piece, (wordFreq.get(piece) ?? 0) + 1);
  }
  // Sorted so that word indices, and so every tie-break, are independent of input order.
  const entries = [...wordFreq.entries()].sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0));
  const words: number[][] = entries.map(([w]) => Array.from(utf8Bytes(w)));
  const freqs: number[] = entries.map(([, f]) => f);

  const key = (a: number, b: number): number => a * 65536 + b;
  const pairCount = new Map<number, number>();
  const pairWords = new Map<number, Set<number>>();
  const addPairs = (wi: number, sign: 1 | -1): void => {
    const w = words[wi]!;
    const f = freqs[wi]! * sign;
    for (let i = 0; i + 1 < w.length; i++) {
      const k = key(w[i]!, w[i + 1]!);
      pairCount.set(k, (pairCount.get(k) ?? 0) + f);
      if (sign > 0) {
        let set = pairWords.get(k);
        if (!set) pairWords.set(k, (set = new Set()));
        set.add(wi);
      }
    }
  };
  words.forEach((_, wi) => addPairs(wi, 1));

  const heap = new PairHeap();
  for (const [k, c] of pairCount) heap.push(c, k);

  const merges: Array<[number, number]> = [];
  while (merges.length < mergeCount && heap.size > 0) {
    const top = heap.pop()!;
    const current = pairCount.get(top.key) ?? 0;
    if (current !== top.count) {
      // Stale entry: the count changed since it was pushed.
      if (current > 0) heap.push(current, top.key);
      continue;
    }
    if (current <= 0) break;
    const a = Math.floor(top.key / 65536);
    const b = top.key % 65536;
    const newId = BYTE_TOKENS + merges.length;
    merges.push([a, b]);
    const holders = [...(pairWords.get(top.key) ?? [])].sort((x, y) => x - y);
    pairWords.delete(top.key);
    const touched = new Set<number>();
    for (const wi of holders) {
      const w = words[wi]!;
      let has = false;
      for (let i = 0; i + 1 < w.length; i++) if (w[i] === a && w[i + 1] === b) has = true;
      if (!has) continue;
      addPairs(wi, -1);
      const next: number[] = [];
      for (let i = 0; i < w.length; i++) {
        if (i + 1 < w.length && w[i] === a && w[i + 1] === b) {
          next.push(newId);
          i++;
        } else next.push(w[i]!);
      }
      words[wi] = next;
      addPairs(wi, 1);
      for (let i = 0; i + 1 < next.length; i++) touched.add(key(next[i]!, next[i + 1]!));
    }
    pairCount.delete(top.key);
    for (const k of touched) {
      const c = pairCount.get(k) ?? 0;
      if (c > 0) heap.push(c, k);
    }
  }
  return { format: 'train-at-home/byte-bpe', version: 1, vocabSize: BYTE_TOKENS + merges.length + 1, merges, eotId: BYTE_TOKENS + merges.length };
}

/** Max-heap on count, ties broken by the smaller pair key. */
class PairHeap {
  private counts: number[] = [];
  private keys: number[] = [];
  get size(): number {
    return this.counts.length;
  }
  private before(i: number, j: number): boolean {
    const ci = this.counts[i]!;
    const cj = this.counts[j]!;
    return ci > cj || (ci === cj && this.keys[i]! < this.keys[j]!);
  }
  private swap(i: number, j: number): void {
    [this.counts[i], this.counts[j]] = [this.counts[j]!, this.counts[i]!];
    [this.keys[i], this.keys[j]] = [this.keys[j]!, this.keys[i]!];
  }
  push(count: number, key: number): void {
    this.counts.push(count);
    this.keys.push(key);
    let i = this.counts.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!this.before(i, parent)) break;
      this.swap(i, parent);
      i = parent;
    }
  }
  pop(): { count: number; key: number } | undefined {
    if (this.counts.length === 0) return undefined;
    const out = { count: this.counts[0]!, key: this.keys[0]! };
    const lastCount = this.counts.pop()!;
    const lastKey = this.keys.pop()!;
    if (this.counts.length > 0) {
      this.counts[0] = lastCount;
      this.keys[0] = lastKey;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let best = i;
        if (l < this.counts.length && this.before(l, best)) best = l;
        if (r < this.counts.length && this.before(r, best)) best = r;
        if (best === i) break;
        this.swap(i, best);
        i = best;
      }
    }
    return out;
  }
}
