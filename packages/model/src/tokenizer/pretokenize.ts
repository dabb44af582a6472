/**
 * Splits text into pre-tokens before byte-pair merging (the GPT-2 rule):
 * contractions, a word with its leading space, a number, a run of
 * punctuation, or whitespace. Merges never cross a pre-token boundary, so the
 * tokenizer learns words and word pieces, not "word + next word".
 */
export const PRETOKEN_PATTERN =
  /'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

export function* pretokenize(text: string): Generator<string> {
  for (const match of text.matchAll(PRETOKEN_PATTERN)) yield match[0];
}

const utf8 = new TextEncoder();
export function utf8Bytes(text: string): Uint8Array {
  return utf8.encode(text);
}
