/**
 * UTF-8 text from bytes that arrive in pieces: a byte-level BPE token may end
 * in the middle of a character (é is two bytes, 中 three, 😀 four, and a token
 * can hold any of them), so decoding each piece alone prints U+FFFD (�) for a
 * character that the next token completes. This holds back an unfinished
 * sequence at the end of what it has been given until the bytes that finish it
 * arrive; what is still unfinished at `end()` is dropped, never shown as �.
 * Bytes that no continuation can make valid (a stray continuation byte, a lead
 * byte followed by a non-continuation) still decode to U+FFFD, as TextDecoder
 * does: the text did contain them.
 */
export class Utf8Stream {
  private held: Uint8Array = new Uint8Array(0);
  private readonly decoder = new TextDecoder('utf-8');

  /** The text completed by `bytes`: everything given so far except an unfinished character at the end. */
  push(bytes: Uint8Array): string {
    const all = this.held.length === 0 ? bytes : concat(this.held, bytes);
    const cut = completeLength(all);
    this.held = all.slice(cut);
    return this.decoder.decode(all.subarray(0, cut));
  }

  /** Bytes held back now (the start of a character not finished yet). */
  get pending(): number {
    return this.held.length;
  }

  /** The stream is over: an unfinished character at its end is dropped. Returns '' (nothing complete was held). */
  end(): string {
    this.held = new Uint8Array(0);
    return '';
  }
}

/** How many bytes a sequence starting with `lead` has (1 for ASCII and for bytes that cannot start one). */
function sequenceLength(lead: number): number {
  if (lead >= 0xf5) return 1; // never valid in UTF-8
  if (lead >= 0xf0) return 4;
  if (lead >= 0xe0) return 3;
  if (lead >= 0xc2) return 2;
  return 1; // ASCII, a continuation byte, or the invalid leads C0 and C1
}

/** The length of `b` without an unfinished sequence at its end (a lead byte whose continuation bytes have not all come). */
function completeLength(b: Uint8Array): number {
  for (let back = 1; back <= Math.min(4, b.length); back++) {
    const byte = b[b.length - back]!;
    if ((byte & 0xc0) === 0x80) continue; // a continuation byte: its lead is further back
    return sequenceLength(byte) > back ? b.length - back : b.length;
  }
  return b.length; // only continuation bytes at the end: invalid whatever follows
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}
