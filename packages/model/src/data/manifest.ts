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

/** The folder of a prepared dataset, under ./data on disk and /data/ over HTTP: the shipped corpora's, or another's by name. */
export function datasetName(vocabSize: number, corpus = 'sotu-brown'): string {
  return `${corpus}-v${PREPARATION_VERSION}-bpe${vocabSize}`;
}

/** What a dataset's folder may be named (`datasetName`): served under /data/ only then. */
export const DATASET_NAME = /^[a-z0-9][a-z0-9-]{0,47}-v[0-9]+-bpe[0-9]+$/;
/** A corpus's name as an operator gives it (`prepare-data --name`). */
export const CORPUS_NAME = /^[a-z0-9][a-z0-9-]{0,39}$/;

/** The dataset a run trains on: the one it names (an operator's own corpus, `--data`), else the shipped corpora's. */
export function runDataset(run: { dataset?: string; vocabSize: number }): string {
  return run.dataset ?? datasetName(run.vocabSize);
}
