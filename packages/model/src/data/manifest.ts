/** One token shard: little-endian Uint16 token ids, no header (fetch by byte range: 2 × token index). */
export interface ShardInfo {
  file: string;
  tokens: number;
  sha256: string;
}

/** What `prepare-data` writes beside the shards; the browser fetches it first. */
export interface DataManifest {
  name: string;
  preparationVersion: number;
  /** Hash of the corpora and the preparation settings: the cache key. */
  inputsHash: string;
  vocabSize: number;
  eotId: number;
  tokenizer: { file: string; sha256: string };
  trainDocuments: number;
  heldOutDocuments: string[];
  train: ShardInfo[];
  heldOut: ShardInfo[];
  trainTokens: number;
  heldOutTokens: number;
  bytesPerToken: 2;
}

/** Bump when preparation changes what it writes: the dataset's folder name changes with it. */
export const PREPARATION_VERSION = 1;

/** The folder of a prepared dataset, under ./data on disk and /data/ over HTTP. */
export function datasetName(vocabSize: number): string {
  return `sotu-brown-v${PREPARATION_VERSION}-bpe${vocabSize}`;
}
