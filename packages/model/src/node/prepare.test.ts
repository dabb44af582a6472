import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { decodeShard } from '../data/shards';
import { Tokenizer } from '../tokenizer/bpe';
import { detagBrown } from './corpus';
import { prepareData } from './prepare';
import { loadDataset } from './shards';

const dirs = [mkdtempSync(join(tmpdir(), 'tah-prep-a-')), mkdtempSync(join(tmpdir(), 'tah-prep-b-'))];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe('data preparation', () => {
  it('is deterministic: two runs give the same tokenizer and shard hashes', () => {
    const [a, b] = dirs.map((outDir) => prepareData({ outDir, vocabSize: 320 }));
    expect(a!.built && b!.built).toBe(true);
    expect(a!.manifest.tokenizer.sha256).toBe(b!.manifest.tokenizer.sha256);
    expect(a!.manifest.train.map((s) => s.sha256)).toEqual(b!.manifest.train.map((s) => s.sha256));
    expect(a!.manifest.heldOut.map((s) => s.sha256)).toEqual(b!.manifest.heldOut.map((s) => s.sha256));
    expect(a!.manifest).toEqual(b!.manifest);
  });

  it('is cached: a second run does nothing', () => {
    const again = prepareData({ outDir: dirs[0]!, vocabSize: 320 });
    expect(again.built).toBe(false);
  });

  it('holds out the most recent addresses, about 1 MB, and never trains on them', () => {
    const { manifest, dir } = prepareData({ outDir: dirs[0]!, vocabSize: 320 });
    expect(manifest.heldOutDocuments[manifest.heldOutDocuments.length - 1]).toMatch(/^sotu\/2021_/);
    const data = loadDataset(dir);
    const heldOutText = data.tokenizer.decode(data.heldOut);
    expect(heldOutText.length).toBeGreaterThan(1_000_000);
    expect(heldOutText.length).toBeLessThan(1_200_000);
    // A distinctive held-out sentence does not occur in the training tokens.
    const probe = data.tokenizer.encode(heldOutText.slice(5000, 5200));
    const train = data.train;
    let found = false;
    outer: for (let i = 0; i + probe.length <= train.length; i++) {
      for (let j = 0; j < probe.length; j++) if (train[i + j] !== probe[j]) continue outer;
      found = true;
      break;
    }
    expect(found).toBe(false);
  });

  it('writes shards that check against the manifest and decode to text', () => {
    const { manifest, dir } = prepareData({ outDir: dirs[0]!, vocabSize: 320 });
    const tokenizer = new Tokenizer(JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')));
    const shard = manifest.train[0]!;
    const bytes = new Uint8Array(readFileSync(join(dir, shard.file)));
    const tokens = decodeShard(bytes, shard);
    expect(tokenizer.decode(tokens.subarray(0, 40))).toMatch(/Fellow-Citizens/);
    bytes[10] = bytes[10]! ^ 1;
    expect(() => decodeShard(bytes, shard)).toThrow(/hash/);
    expect(() => decodeShard(bytes.subarray(2), shard)).toThrow(/bytes/);
  });

  it('removes Brown part-of-speech tags and tokenizer spacing', () => {
    const tagged = "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, and/cc it's/pps+bez 1/2/cd done/vbn ./.\n";
    expect(detagBrown(tagged)).toBe('The jury said "no evidence", and it\'s 1/2 done.');
  });
});
