/**
 * Fast bytea for embedded PGlite (0.5): its default serializer writes a bytea parameter as hex through
 * `Array.from(bytes).map(…).join('')`, and its parser reads one back byte by byte with parseInt. For a
 * `small` checkpoint (~10 MB) that is slow; for a `gpu` stage's weights (~127 MB in 3 stages) the
 * serializer throws (RangeError: Invalid array length), so no checkpoint can be stored. Node's Buffer
 * does the same hex in one native call each way. PGlite copies these defaults into every instance it
 * creates, so this must run before the coordinator opens its database.
 * (Belongs in server/src/db/database.ts as PGlite.create's `serializers`/`parsers` options.)
 */
import { types } from '@electric-sql/pglite';

export function fastPgliteBytea(): void {
  types.serializers[types.BYTEA] = (x: unknown): string => {
    if (!(x instanceof Uint8Array)) throw new Error('Invalid input for bytea type');
    return '\\x' + Buffer.from(x.buffer, x.byteOffset, x.byteLength).toString('hex');
  };
  types.parsers[types.BYTEA] = (x: string): Uint8Array => {
    const b = Buffer.from(x.slice(2), 'hex');
    return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  };
}
