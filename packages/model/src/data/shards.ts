import { sha256 } from '@noble/hashes/sha256';
import { bytesToHex } from '@noble/hashes/utils';
import type { ShardInfo } from './manifest';

export class DataError extends Error {
  override name = 'DataError';
}

/** Checks a shard's bytes against its manifest entry and returns its token ids. */
export function decodeShard(bytes: Uint8Array, info: ShardInfo): Uint16Array {
  if (bytes.length !== info.tokens * 2) {
    throw new DataError(`shard ${info.file}: ${bytes.length} bytes, expected ${info.tokens * 2}`);
  }
  const digest = bytesToHex(sha256(bytes));
  if (digest !== info.sha256) throw new DataError(`shard ${info.file}: hash ${digest} does not match the manifest`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const tokens = new Uint16Array(info.tokens);
  for (let i = 0; i < tokens.length; i++) tokens[i] = view.getUint16(i * 2, true);
  return tokens;
}
