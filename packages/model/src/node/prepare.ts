import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex } from '@noble/hashes/utils';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Tokenizer, type TokenizerJSON } from '../tokenizer/bpe';
import { trainBpe } from '../tokenizer/train';
import { PREPARATION_VERSION, datasetName, type DataManifest, type ShardInfo } from '../data/manifest';

export { PREPARATION_VERSION, datasetName };
import { readBrown, readSotu, type Document } from './corpus';

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
  const shardTokens = options.shardTokens ?? 1 << 20;
  const log = options.log ?? (() => {});
  const dir = join(options.outDir, datasetName(options.vocabSize));

  const sotu = readSotu();
  const brown = readBrown();
  const inputsHash = hashDocuments([...sotu, ...brown], { vocabSize: options.vocabSize, heldOutBytes, shardTokens });

  const manifestPath = join(dir, 'manifest.json');
  if (existsSync(manifestPath)) {
    const cached = JSON.parse(readFileSync(manifestPath, 'utf8')) as DataManifest;
    if (cached.inputsHash === inputsHash && filesIntact(dir, cached)) {
      log(`data: ${dir} is up to date (inputs ${inputsHash.slice(0, 12)})`);
      return { dir, manifest: cached, built: false };
    }
  }

  // Held out: the most recent speeches, newest first, until heldOutBytes.
  const heldOut: Document[] = [];
  let heldBytes = 0;
  for (let i = sotu.length - 1; i >= 0 && heldBytes < heldOutBytes; i--) {
    heldOut.unshift(sotu[i]!);
    heldBytes += Buffer.byteLength(sotu[i]!.text);
  }
  const train = [...sotu.slice(0, sotu.length - heldOut.length), ...brown];
  log(`data: ${train.length} training documents, ${heldOut.length} held out (${heldOut[0]!.source} onwards)`);

  const started = Date.now();
  const tokenizerJson = trainBpe(
    train.map((d) => d.text),
    options.vocabSize,
  );
  log(`data: trained BPE tokenizer, vocab ${tokenizerJson.vocabSize}, in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  const tokenizer = new Tokenizer(tokenizerJson);

  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  const tokenizerBytes = Buffer.from(JSON.stringify(tokenizerJson));
  writeFileSync(join(tmp, 'tokenizer.json'), tokenizerBytes);
  const trainShards = writeShards(tmp, 'train', encodeDocuments(tokenizer, train), shardTokens);
  const heldOutShards = writeShards(tmp, 'heldout', encodeDocuments(tokenizer, heldOut), shardTokens);

  const manifest: DataManifest = {
    name: datasetName(options.vocabSize),
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
}

function encodeDocuments(tokenizer: Tokenizer, docs: Document[]): Uint16Array {
  const parts = docs.map((d) => tokenizer.encode(d.text));
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
