import { describe, expect, it } from 'vitest';
import { Tokenizer } from './bpe';
import { trainBpe } from './train';
import { Utf8Stream } from './utf8';

const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);

/** Feeds `bytes` to a stream cut at every position in `cuts`; returns what it printed, piece by piece. */
function feed(bytes: Uint8Array, cuts: number[]): string[] {
  const stream = new Utf8Stream();
  const out: string[] = [];
  let from = 0;
  for (const cut of [...cuts, bytes.length]) {
    out.push(stream.push(bytes.subarray(from, cut)));
    from = cut;
  }
  out.push(stream.end());
  return out;
}

describe('Utf8Stream: a character split across pieces', () => {
  it('holds back a 2-, 3- and 4-byte character cut after each of its bytes, and prints it whole once finished', () => {
    for (const ch of ['é', '中', '😀']) {
      const bytes = utf8(`a${ch}b`);
      for (let cut = 2; cut < bytes.length - 1; cut++) {
        const pieces = feed(bytes, [cut]);
        expect(pieces).toEqual(['a', `${ch}b`, '']);
        expect(pieces.join('')).not.toContain('\uFFFD');
      }
    }
  });

  it('holds a character cut into one byte per piece until its last byte', () => {
    const bytes = utf8('😀');
    const stream = new Utf8Stream();
    expect([stream.push(bytes.subarray(0, 1)), stream.push(bytes.subarray(1, 2)), stream.push(bytes.subarray(2, 3))]).toEqual(['', '', '']);
    expect(stream.pending).toBe(3);
    expect(stream.push(bytes.subarray(3))).toBe('😀');
    expect(stream.pending).toBe(0);
  });

  it('drops a character still unfinished when the stream ends, rather than printing U+FFFD', () => {
    const bytes = utf8('ok 中');
    expect(feed(bytes.subarray(0, bytes.length - 1), []).join('')).toBe('ok ');
    expect(feed(bytes.subarray(0, bytes.length - 2), []).join('')).toBe('ok ');
  });

  it('still shows bytes no continuation can make valid as U+FFFD, and keeps a real U+FFFD in the text', () => {
    // A lead byte followed by ASCII, a stray continuation byte, and 0xFF: the text did contain them.
    expect(feed(Uint8Array.from([0xc3, 0x41, 0x80, 0x42, 0xff]), [1]).join('')).toBe('\uFFFDA\uFFFDB\uFFFD');
    expect(feed(utf8('x\uFFFDy'), [2]).join('')).toBe('x\uFFFDy');
  });
});

describe('Tokenizer: decoding tokens that cut characters', () => {
  const tokenizer = new Tokenizer(trainBpe(['naïve café — 😀 中文 the the the'], 300));
  // Byte tokens (ids 0-255) cut every multi-byte character, as a sampled continuation may.
  const byteIds = (s: string): number[] => [...utf8(s)];

  it('decoder(): token by token, a split character comes out whole with the token that completes it', () => {
    const decoder = tokenizer.decoder();
    const pieces = byteIds('é😀').map((id) => decoder.push(id));
    expect(pieces).toEqual(['', 'é', '', '', '', '😀']);
    expect(decoder.end()).toBe('');
  });

  it('decode(): a sequence cut mid-character at its end loses that character, not prints U+FFFD', () => {
    const ids = byteIds('café 中');
    expect(tokenizer.decode(ids)).toBe('café 中');
    expect(tokenizer.decode(ids.slice(0, -1))).toBe('café ');
    expect(tokenizer.decode(ids.slice(0, -2))).toBe('café ');
  });

  it('decode() still round-trips whole text', () => {
    for (const text of ['naïve café — 😀 中文', 'the the', '']) expect(tokenizer.decode(tokenizer.encode(text))).toBe(text);
  });
});
