import { BYTE_TOKENS, EOT, TokenizerError, type TokenizerJSON } from '../tokenizer/bpe';

/**
 * GPT-2's map of the 256 byte values to printable characters (openai/gpt-2 encoder.py, `bytes_to_unicode`): the
 * form in which byte-level BPE vocabularies name their tokens, so that every token is a printable string.
 */
export function byteToUnicode(): string[] {
  const keep: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) keep.push(b);
  for (let b = 0xa1; b <= 0xac; b++) keep.push(b);
  for (let b = 0xae; b <= 0xff; b++) keep.push(b);
  const out: string[] = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) out[b] = String.fromCodePoint(keep.includes(b) ? b : 256 + extra++);
  return out;
}

/**
 * This project's byte-level BPE as a Hugging Face tokenizers file (tokenizer.json): a BPE model whose ids are
 * ours (bytes 0…255, merge i at 256 + i, `<|eot|>` last), the ByteLevel pre-tokenizer with GPT-2's split
 * pattern (the one pretokenize.ts applies) and the ByteLevel decoder. Read by `tokenizers` (Python, Rust) and by
 * transformers.js, it encodes text to the ids the run trained on.
 */
export function huggingFaceTokenizer(json: TokenizerJSON): Record<string, unknown> {
  const chars = byteToUnicode();
  const names: string[] = [];
  for (let b = 0; b < BYTE_TOKENS; b++) names.push(chars[b]!);
  const merges: string[] = [];
  for (const [a, b] of json.merges) {
    merges.push(`${names[a]!} ${names[b]!}`);
    names.push(names[a]! + names[b]!);
  }
  const vocab: Record<string, number> = {};
  names.forEach((n, id) => {
    // A vocabulary maps each string to one id: two merges that spell the same bytes cannot both be written.
    if (n in vocab) throw new TokenizerError(`tokens ${vocab[n]} and ${id} spell the same bytes: not expressible as a tokenizer.json vocabulary`);
    vocab[n] = id;
  });
  vocab[EOT] = json.eotId;
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [{ id: json.eotId, content: EOT, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges,
    },
  };
}

/**
 * A Hugging Face tokenizer.json of a byte-level BPE (GPT-2's kind: the ByteLevel pre-tokenizer, a BPE model with
 * no word prefixes or suffixes) as this project's tokenizer, to train a run on (`prepare-data --tokenizer`). Ids
 * are renumbered to ours (bytes 0…255, merge i at 256 + i in the file's merge order, `<|eot|>` last), so the run's
 * own tokenizer.json, written at export, is what its model's ids mean. With `vocabSize`, only the first
 * vocabSize − 257 merges are kept: a BPE cut at a merge rank is a BPE, and a preset fixes the vocabulary.
 * Anything else (another model type, a merge of tokens not built yet, two merges spelling the same bytes) is
 * refused by name.
 */
export function fromHuggingFaceTokenizer(file: unknown, vocabSize?: number): TokenizerJSON {
  const hf = file as { model?: { type?: string; merges?: unknown[]; continuing_subword_prefix?: string | null; end_of_word_suffix?: string | null }; pre_tokenizer?: { type?: string } | null };
  if (hf?.model?.type !== 'BPE' || !Array.isArray(hf.model.merges)) throw new TokenizerError('not a BPE tokenizer.json (model.type must be BPE, with merges)');
  if (hf.pre_tokenizer?.type !== 'ByteLevel') throw new TokenizerError(`not a byte-level BPE: its pre-tokenizer is ${hf.pre_tokenizer?.type ?? 'none'}, not ByteLevel`);
  if (hf.model.continuing_subword_prefix || hf.model.end_of_word_suffix) throw new TokenizerError('word prefixes and suffixes are not byte-level BPE');
  const chars = byteToUnicode();
  const ids = new Map<string, number>(chars.map((c, b) => [c, b]));
  const merges: Array<[number, number]> = [];
  const limit = vocabSize === undefined ? Infinity : vocabSize - BYTE_TOKENS - 1;
  if (limit < 0) throw new TokenizerError(`a vocabulary of ${vocabSize} cannot hold the 256 byte tokens and ${EOT}`);
  for (const [i, m] of hf.model.merges.entries()) {
    if (merges.length >= limit) break;
    const pair = typeof m === 'string' ? m.split(' ') : m;
    if (!Array.isArray(pair) || pair.length !== 2 || typeof pair[0] !== 'string' || typeof pair[1] !== 'string') throw new TokenizerError(`merge ${i} is not a pair of tokens`);
    const [a, b] = [ids.get(pair[0]), ids.get(pair[1])];
    if (a === undefined || b === undefined) throw new TokenizerError(`merge ${i} (${pair.join(' ')}) joins a token no earlier merge built`);
    const joined = pair[0] + pair[1];
    if (ids.has(joined)) throw new TokenizerError(`merge ${i} spells the same bytes as token ${ids.get(joined)}`);
    ids.set(joined, BYTE_TOKENS + merges.length);
    merges.push([a, b]);
  }
  if (merges.length < limit && vocabSize !== undefined) throw new TokenizerError(`the file has ${merges.length} merges; a vocabulary of ${vocabSize} needs ${limit}`);
  const size = BYTE_TOKENS + merges.length + 1;
  return { format: 'train-at-home/byte-bpe', version: 1, vocabSize: size, merges, eotId: size - 1 };
}
