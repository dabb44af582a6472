import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { DataManifest, ShardInfo } from '../data/manifest';
import { Tokenizer, type TokenizerJSON } from '../tokenizer/bpe';
import { DataError, decodeShard } from '../data/shards';

/** A prepared dataset read from disk: the tokenizer and all token ids of both splits. */
export interface LoadedDataset {
  manifest: DataManifest;
  tokenizer: Tokenizer;
  train: Uint16Array;
  heldOut: Uint16Array;
}

export function loadDataset(dir: string): LoadedDataset {
  let manifest: DataManifest;
  try {
    manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8')) as DataManifest;
  } catch (e) {
    throw new DataError(`no prepared dataset in ${dir} (run \`npm run prepare-data\`): ${(e as Error).message}`);
  }
  const tokenizer = new Tokenizer(JSON.parse(readFileSync(join(dir, manifest.tokenizer.file), 'utf8')) as TokenizerJSON);
  const read = (shards: ShardInfo[]): Uint16Array => {
    const parts = shards.map((s) => decodeShard(new Uint8Array(readFileSync(join(dir, s.file))), s));
    const out = new Uint16Array(parts.reduce((n, p) => n + p.length, 0));
    let offset = 0;
    for (const p of parts) {
      out.set(p, offset);
      offset += p.length;
    }
    return out;
  };
  return { manifest, tokenizer, train: read(manifest.train), heldOut: read(manifest.heldOut) };
}
