import { describe, expect, it } from 'vitest';
import { Tokenizer, TokenizerError } from './bpe';
import { trainBpe } from './train';

const corpus = [
  'The state of the Union is strong. The state of our economy is stronger.',
  'Fellow-Citizens of the Senate and House of Representatives: the Union, the Union!',
];

describe('byte-level BPE', () => {
  const json = trainBpe(corpus, 300);
  const tokenizer = new Tokenizer(json);

  it('learns the requested number of merges, most frequent pair first', () => {
    expect(json.vocabSize).toBe(300);
    expect(json.merges).toHaveLength(300 - 256 - 1);
    // "the" and " Union" occur often enough to become single tokens.
    expect(tokenizer.encode(' the')).toHaveLength(1);
  });

  it('is deterministic whatever the order of its input', () => {
    expect(trainBpe([...corpus].reverse(), 300)).toEqual(json);
  });

  it('round-trips any text, including text it never saw', () => {
    for (const text of ['', 'The Union', 'naïve café — 😀 中文 \n\t  spaces', 'x'.repeat(1000), '\u0000\uffff']) {
      expect(tokenizer.decode(tokenizer.encode(text))).toBe(text);
    }
  });

  it('rejects ids outside the vocabulary and inconsistent tokenizer files', () => {
    expect(() => tokenizer.decode([300])).toThrow(TokenizerError);
    expect(() => tokenizer.decode([-1])).toThrow(TokenizerError);
    expect(() => new Tokenizer({ ...json, vocabSize: 301 })).toThrow(TokenizerError);
    expect(() => new Tokenizer({ ...json, merges: [[400, 1], ...json.merges.slice(1)] })).toThrow(TokenizerError);
    expect(() => new Tokenizer({ ...json, version: 2 as 1 })).toThrow(TokenizerError);
  });
});
