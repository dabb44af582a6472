import { DATASET_NAME, DataError, decodeShard, type DataManifest } from '@train-at-home/model';
import { getRetrying } from './coordinator-client';
import type { TokenSource } from './miner';

/**
 * Training tokens over HTTP, as a browser tab gets them: the dataset's
 * manifest from the coordinator's /data/ route, then each training shard,
 * checked against the manifest's hash. `onProgress` sees bytes as they come.
 */
export function httpTokenSource(baseUrl: string, onProgress?: (done: number, total: number) => void): TokenSource {
  return {
    async train(vocabSize, dataset, onBytes) {
      if (!DATASET_NAME.test(dataset)) throw new DataError(`${JSON.stringify(dataset)} is not a dataset's name`);
      const root = `${baseUrl}/data/${dataset}`;
      const res = await getRetrying(`${root}/manifest.json`);
      if (!res.ok) throw new DataError(`no dataset at ${root} (HTTP ${res.status})`);
      const text = await res.text();
      onBytes?.(text.length);
      const manifest = JSON.parse(text) as DataManifest;
      if (manifest.vocabSize !== vocabSize || !Array.isArray(manifest.train)) throw new DataError(`${root}/manifest.json does not describe a ${vocabSize}-token dataset`);
      const total = manifest.train.reduce((n, s) => n + s.tokens * 2, 0);
      const out = new Uint16Array(manifest.train.reduce((n, s) => n + s.tokens, 0));
      let done = 0;
      let at = 0;
      onProgress?.(0, total);
      for (const shard of manifest.train) {
        const r = await getRetrying(`${root}/${shard.file}`);
        if (!r.ok) throw new DataError(`shard ${shard.file}: HTTP ${r.status}`);
        const bytes = new Uint8Array(await r.arrayBuffer());
        onBytes?.(bytes.length);
        const tokens = decodeShard(bytes, shard);
        out.set(tokens, at);
        at += tokens.length;
        done += bytes.length;
        onProgress?.(done, total);
      }
      return out;
    },
  };
}
