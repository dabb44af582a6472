import { pretokenize, utf8Bytes } from './pretokenize';
import { Utf8Stream } from './utf8';

/** Token ids 0..255 are raw bytes; 256 + i is merge i; the last id is end-of-text. */
export const BYTE_TOKENS = 256;
export const EOT = '<|eot|>';

/** The serialized form: what `prepare-data` writes and the browser fetches. */
export interface TokenizerJSON {
  format: 'train-at-home/byte-bpe';
  version: 1;
  vocabSize: number;
  /** merges[i] = [left, right] token ids that merge into token 256 + i. */
  merges: Array<[number, number]>;
  eotId: number;
}

export class TokenizerError extends Error {
  override name = 'TokenizerError';
}

const pairKey = (a: number, b: number): number => a * 65536 + b;

/**
 * Byte-level BPE: encodes any UTF-8 text losslessly (unknown text falls back to
 * bytes), decodes any id sequence. Pure TypeScript; the same object runs in the
 * browser, a Node miner and the server.
 */
export class Tokenizer {
  readonly vocabSize: number;
  readonly eotId: number;
  private readonly rank = new Map<number, number>();
  private readonly tokenBytes: Uint8Array[] = [];
  private readonly cache = new Map<string, readonly number[]>();
  private static readonly CACHE_LIMIT = 200_000;

  constructor(readonly json: TokenizerJSON) {
    if (json.format !== 'train-at-home/byte-bpe' || json.version !== 1) {
      throw new TokenizerError(`unknown tokenizer format ${String(json.format)} v${String(json.version)}`);
    }
    if (json.vocabSize !== BYTE_TOKENS + json.merges.length + 1 || json.eotId !== json.vocabSize - 1) {
      throw new TokenizerError(
        `inconsistent tokenizer: vocabSize ${json.vocabSize}, ${json.merges.length} merges, eotId ${json.eotId}`,
      );
    }
    if (json.vocabSize > 65535) throw new TokenizerError('vocabSize must fit in Uint16 token shards');
    this.vocabSize = json.vocabSize;
    this.eotId = json.eotId;
    for (let b = 0; b < BYTE_TOKENS; b++) this.tokenBytes.push(Uint8Array.of(b));
    json.merges.forEach(([a, b], i) => {
      const id = BYTE_TOKENS + i;
      if (!(a < id && b < id && a >= 0 && b >= 0)) throw new TokenizerError(`merge ${i} refers to a later token`);
      this.rank.set(pairKey(a, b), i);
      const left = this.tokenBytes[a]!;
      const right = this.tokenBytes[b]!;
      const bytes = new Uint8Array(left.length + right.length);
      bytes.set(left);
      bytes.set(right, left.length);
      this.tokenBytes.push(bytes);
    });
    this.tokenBytes.push(utf8Bytes(EOT));
  }

  /** Encodes text to token ids (no end-of-text marker; callers add it between documents). */
  encode(text: string): number[] {
    const out: number[] = [];
    for (const piece of pretokenize(text)) {
      let ids = this.cache.get(piece);
      if (!ids) {
        ids = this.encodePiece(piece);
        if (this.cache.size < Tokenizer.CACHE_LIMIT) this.cache.set(piece, ids);
      }
      for (const id of ids) out.push(id);
    }
    return out;
  }

  /** Applies merges to one pre-token, lowest merge rank first (as they were learned). */
  private encodePiece(piece: string): number[] {
    const symbols = Array.from(utf8Bytes(piece));
    for (;;) {
      let bestRank = Infinity;
      for (let i = 0; i + 1 < symbols.length; i++) {
        const r = this.rank.get(pairKey(symbols[i]!, symbols[i + 1]!));
        if (r !== undefined && r < bestRank) bestRank = r;
      }
      if (bestRank === Infinity) return symbols;
      const [a, b] = this.json.merges[bestRank]!;
      const merged = BYTE_TOKENS + bestRank;
      const next: number[] = [];
      for (let i = 0; i < symbols.length; i++) {
        if (i + 1 < symbols.length && symbols[i] === a && symbols[i + 1] === b) {
          next.push(merged);
          i++;
        } else next.push(symbols[i]!);
      }
      symbols.length = 0;
      symbols.push(...next);
    }
  }

  /**
   * Decodes ids to text. A character the ids leave unfinished at the end (the
   * last token cut it) is dropped rather than shown as U+FFFD; bytes no
   * continuation could make valid become U+FFFD (see Utf8Stream).
   */
  decode(ids: ArrayLike<number>): string {
    const parts: Uint8Array[] = [];
    let length = 0;
    for (let i = 0; i < ids.length; i++) {
      const bytes = this.bytesOf(ids[i]!);
      parts.push(bytes);
      length += bytes.length;
    }
    const all = new Uint8Array(length);
    let offset = 0;
    for (const p of parts) {
      all.set(p, offset);
      offset += p.length;
    }
    const stream = new Utf8Stream();
    return stream.push(all) + stream.end();
  }

  /**
   * Decodes token by token, as text is generated: `push(id)` returns the text
   * that token completes, holding back the start of a character the next
   * token finishes (decoding each token alone would print U+FFFD there).
   */
  decoder(): { push(id: number): string; end(): string } {
    const stream = new Utf8Stream();
    return { push: (id) => stream.push(this.bytesOf(id)), end: () => stream.end() };
  }

  private bytesOf(id: number): Uint8Array {
    const bytes = this.tokenBytes[id];
    if (!bytes) throw new TokenizerError(`token id ${id} is outside the vocabulary (${this.vocabSize})`);
    return bytes;
  }
}
