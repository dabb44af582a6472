import { describe, expect, it } from 'vitest';
import { keyFileText, parseTabKey, TabKeyError } from './key';

const SEED = '0f'.repeat(32);

describe("a tab's saved key", () => {
  it('reads back from its key file, from the key alone, with or without 0x, in any case', () => {
    expect(parseTabKey(keyFileText(`0x${SEED}`, '5Fake', 'https://run.example'))).toBe(SEED);
    expect(parseTabKey(`0x${SEED}`)).toBe(SEED);
    expect(parseTabKey(`  ${SEED.toUpperCase()}\n`)).toBe(SEED);
  });

  it('refuses by name a paste with no key, a key a digit short or long, or two different keys', () => {
    for (const text of ['', '0x1234', `0x${SEED.slice(1)}`, `0x${SEED}0`, `0x${SEED} 0x${'1'.repeat(64)}`]) {
      expect(() => parseTabKey(text), text).toThrow(TabKeyError);
    }
    // The same key twice (a key file pasted with the key beside it) is one key.
    expect(parseTabKey(`0x${SEED} ${SEED}`)).toBe(SEED);
  });
});
