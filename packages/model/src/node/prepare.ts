import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex } from '@noble/hashes/utils';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Tokenizer, type TokenizerJSON } from '../tokenizer/bpe';
import { trainBpe } from '../tokenizer/train';
import { fromHuggingFaceTokenizer } from '../export/hf-tokenizer';
import { CORPUS_NAME, PREPARATION_VERSION, datasetName, type DataManifest, type ShardInfo } from '../data/manifest';

export { PREPARATION_VERSION, datasetName };
import { readBrown, readSotu, type Document } from './corpus';
import { InputError, inputFiles, readInputs } from './inputs';

/** Bump when the preparation's output would change for the same inputs. */

export interface PrepareOptions {
  /** Folder that receives `<name>/manifest.json`, `tokenizer.json` and shards. */
  outDir: string;
  vocabSize: number;
  /** At least this many bytes of the most recent State of the Union text are held out. */
  heldOutBytes?: number;
  /** Tokens per shard file (Uint16, so 2 bytes each). */
  shardTokens?: number;
  log?: (line: string) => void;
}

export interface PrepareResult {
  dir: string;
  manifest: DataManifest;
  /** False when a matching, complete preparation was already on disk. */
  built: boolean;
}

/**
 * Builds (or finds cached) the training data: held-out split, tokenizer and
 * token shards. Deterministic: the same corpora give byte-identical files.
 */
export function prepareData(options: PrepareOptions): PrepareResult {
  const heldOutBytes = options.heldOutBytes ?? 1_000_000;
  const sotu = readSotu();
  const brown = readBrown();
  // Held out: the most recent speeches, until heldOutBytes.
  const { heldOut } = holdOutLast(sotu, heldOutBytes);
  const train = [...sotu.slice(0, sotu.length - heldOut.length), ...brown];
  return buildDataset({
    dir: join(options.outDir, datasetName(options.vocabSize)),
    name: datasetName(options.vocabSize),
    train,
    heldOut,
    hashed: [...sotu, ...brown],
    settings: { vocabSize: options.vocabSize, heldOutBytes, shardTokens: options.shardTokens ?? 1 << 20 },
    vocabSize: options.vocabSize,
    log: options.log ?? (() => {}),
  });
}

export interface CorpusOptions {
  /** Files, folders or globs of .txt, .jsonl and .parquet (inputs.ts). */
  inputs: string[];
  /** The text field of a .jsonl line and the text column of a .parquet file. */
  field?: string;
  /** The dataset's name: its folder is `<name>-v<version>-bpe<vocab>` (datasetName). */
  name: string;
  outDir: string;
  /** The vocabulary of the tokenizer trained on the training split; unused with `tokenizer`. */
  vocabSize?: number;
  /**
   * A tokenizer to use instead of training one: this project's (as prepare-data writes it) or a Hugging Face
   * tokenizer.json of a byte-level BPE (GPT-2's kind), its merges cut to `vocabSize` when that is given.
   */
  tokenizer?: string;
  /** At least this many bytes of the last documents (in the inputs' order) are held out; default a tenth of the corpus. */
  heldOutBytes?: number;
  shardTokens?: number;
  log?: (line: string) => void;
}

/**
 * An operator's own corpus (`npm run prepare-data -- --input …`), prepared as the shipped one is: every input read
 * and checked before anything is written (an unreadable file, an empty field, a corpus too small to hold out a split
 * from are refused by name: InputError), then the same held-out split, tokenizer, shards and manifest, written to a
 * temporary folder renamed into place (never half-written). Held out: the last documents in the inputs' order.
 */
export async function prepareCorpus(options: CorpusOptions): Promise<PrepareResult> {
  const log = options.log ?? (() => {});
  if (!CORPUS_NAME.test(options.name)) throw new InputError('BAD_NAME', `a corpus name is lower-case letters, digits and dashes, at most 40 (not ${JSON.stringify(options.name)})`);
  const files = inputFiles(options.inputs);
  log(`data: reading ${files.length} input file${files.length === 1 ? '' : 's'}`);
  const docs = await readInputs(files, { field: options.field ?? 'text', progress: tenths('read', files.length, log) });
  let tokenizer: TokenizerJSON | undefined;
  if (options.tokenizer) {
    try {
      const file = JSON.parse(readFileSync(options.tokenizer, 'utf8')) as TokenizerJSON | { model?: unknown };
      // This project's own format, or a Hugging Face byte-level BPE (cut to `vocabSize` merges when one is given).
      tokenizer = 'model' in file ? fromHuggingFaceTokenizer(file, options.vocabSize) : (file as TokenizerJSON);
      new Tokenizer(tokenizer);
    } catch (e) {
      throw new InputError('BAD_TOKENIZER', `${options.tokenizer}: ${(e as Error).message}`);
    }
  }
  const vocabSize = tokenizer?.vocabSize ?? options.vocabSize ?? 4096;
  const total = docs.reduce((n, d) => n + Buffer.byteLength(d.text), 0);
  const heldOutBytes = options.heldOutBytes ?? Math.ceil(total / 10);
  const { heldOut, heldBytes } = holdOutLast(docs, heldOutBytes);
  const train = docs.slice(0, docs.length - heldOut.length);
  const trainBytes = total - heldBytes;
  if (train.length === 0 || trainBytes < heldBytes) {
    throw new InputError('TOO_SMALL', `${docs.length} document${docs.length === 1 ? '' : 's'} of ${total} bytes: holding out ${heldOutBytes} bytes (whole documents, the last ones) would leave ${trainBytes} bytes to train on, less than the held-out split`);
  }
  const name = datasetName(vocabSize, options.name);
  return buildDataset({
    dir: join(options.outDir, name),
    name,
    train,
    heldOut,
    hashed: docs,
    settings: { vocabSize, heldOutBytes, shardTokens: options.shardTokens ?? 1 << 20, field: options.field ?? 'text', tokenizer: tokenizer ? bytesToHex(sha256(JSON.stringify(tokenizer))) : null },
    vocabSize,
    tokenizer,
    log,
  });
}

/** The last documents, in order, until they hold at least `bytes` (whole documents): the held-out split. */
function holdOutLast(docs: Document[], bytes: number): { heldOut: Document[]; heldBytes: number } {
  let heldBytes = 0;
  let first = docs.length;
  while (first > 0 && heldBytes < bytes) heldBytes += Buffer.byteLength(docs[--first]!.text);
  return { heldOut: docs.slice(first), heldBytes };
}

/** A progress callback that logs a line per tenth done. */
function tenths(what: string, total: number, log: (line: string) => void): (done: number) => void {
  let shown = 0;
  return (done) => {
    const tenth = Math.floor((10 * done) / Math.max(1, total));
    if (tenth > shown) {
      shown = tenth;
      log(`data: ${what} ${tenth * 10}% (${done} of ${total})`);
    }
  };
}

interface DatasetInput {
  dir: string;
  name: string;
  train: Document[];
  heldOut: Document[];
  /** What the cache key covers, with `settings`. */
  hashed: Document[];
  settings: object;
  vocabSize: number;
  tokenizer?: TokenizerJSON;
  log: (line: string) => void;
}

/** The split, the tokenizer (trained on the training split unless given), the shards and the manifest, written whole or not at all. */
function buildDataset(input: DatasetInput): PrepareResult {
  const { dir, train, heldOut, log } = input;
  const shardTokens = (input.settings as { shardTokens: number }).shardTokens;
  const inputsHash = hashDocuments(input.hashed, input.settings);
  const manifestPath = join(dir, 'manifest.json');
  if (existsSync(manifestPath)) {
    const cached = JSON.parse(readFileSync(manifestPath, 'utf8')) as DataManifest;
    if (cached.inputsHash === inputsHash && filesIntact(dir, cached)) {
      log(`data: ${dir} is up to date (inputs ${inputsHash.slice(0, 12)})`);
      return { dir, manifest: cached, built: false };
    }
  }
  log(`data: ${train.length} training documents, ${heldOut.length} held out (${heldOut[0]!.source} onwards)`);

  const started = Date.now();
  const tokenizerJson =
    input.tokenizer ??
    trainBpe(
      train.map((d) => d.text),
      input.vocabSize,
    );
  log(input.tokenizer ? `data: tokenizer given, vocab ${tokenizerJson.vocabSize}` : `data: trained BPE tokenizer, vocab ${tokenizerJson.vocabSize}, in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  const tokenizer = new Tokenizer(tokenizerJson);

  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  try {
    const tokenizerBytes = Buffer.from(JSON.stringify(tokenizerJson));
    writeFileSync(join(tmp, 'tokenizer.json'), tokenizerBytes);
    const trainShards = writeShards(tmp, 'train', encodeDocuments(tokenizer, train, tenths('encoded training documents', train.length, log)), shardTokens);
    const heldOutShards = writeShards(tmp, 'heldout', encodeDocuments(tokenizer, heldOut), shardTokens);

    const manifest: DataManifest = {
      name: input.name,
      preparationVersion: PREPARATION_VERSION,
      inputsHash,
      vocabSize: tokenizerJson.vocabSize,
      eotId: tokenizerJson.eotId,
      tokenizer: { file: 'tokenizer.json', sha256: bytesToHex(sha256(tokenizerBytes)) },
      trainDocuments: train.length,
      heldOutDocuments: heldOut.map((d) => d.source),
      train: trainShards,
      heldOut: heldOutShards,
      trainTokens: trainShards.reduce((n, s) => n + s.tokens, 0),
      heldOutTokens: heldOutShards.reduce((n, s) => n + s.tokens, 0),
      bytesPerToken: 2,
    };
    writeFileSync(join(tmp, 'manifest.json'), JSON.stringify(manifest, null, 2) + '\n');
    rmSync(dir, { recursive: true, force: true });
    renameSync(tmp, dir); // readers never see a half-written dataset
    log(`data: wrote ${manifest.trainTokens} training and ${manifest.heldOutTokens} held-out tokens to ${dir}`);
    return { dir, manifest, built: true };
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

function encodeDocuments(tokenizer: Tokenizer, docs: Document[], progress?: (done: number) => void): Uint16Array {
  const parts = docs.map((d, i) => (progress?.(i + 1), tokenizer.encode(d.text)));
  const total = parts.reduce((n, p) => n + p.length + 1, 0);
  const out = new Uint16Array(total);
  let offset = 0;
  for (const p of parts) {
    out.set(p, offset);
    offset += p.length;
    out[offset++] = tokenizer.eotId; // documents are separated by end-of-text
  }
  return out;
}

function writeShards(dir: string, split: string, tokens: Uint16Array, shardTokens: number): ShardInfo[] {
  const shards: ShardInfo[] = [];
  for (let start = 0, i = 0; start < tokens.length; start += shardTokens, i++) {
    const slice = tokens.subarray(start, Math.min(tokens.length, start + shardTokens));
    const bytes = littleEndianBytes(slice);
    const file = `${split}-${String(i).padStart(3, '0')}.bin`;
    writeFileSync(join(dir, file), bytes);
    shards.push({ file, tokens: slice.length, sha256: bytesToHex(sha256(bytes)) });
  }
  return shards;
}

/** Shards are little-endian Uint16 on every platform. */
function littleEndianBytes(tokens: Uint16Array): Uint8Array {
  const bytes = new Uint8Array(tokens.length * 2);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < tokens.length; i++) view.setUint16(i * 2, tokens[i]!, true);
  return bytes;
}

function hashDocuments(docs: Document[], settings: object): string {
  const h = sha256.create();
  h.update(new TextEncoder().encode(JSON.stringify({ PREPARATION_VERSION, settings })));
  for (const d of docs) {
    h.update(new TextEncoder().encode(d.source + '\0'));
    h.update(new TextEncoder().encode(d.text + '\0'));
  }
  return bytesToHex(h.digest());
}

function filesIntact(dir: string, manifest: DataManifest): boolean {
  return [manifest.tokenizer, ...manifest.train, ...manifest.heldOut].every((f) => existsSync(join(dir, f.file)));
}
