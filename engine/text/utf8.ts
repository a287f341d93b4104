/**
 * UTF-8 helpers for the tokenizer: strict validation that names the offset of the first
 * bad byte, and "byte strings" (one char per byte) for the vocabulary trainer.
 *
 * @module
 */

import { EXIT, K3Error } from "../errors.ts";

const strictDecoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const encoder = new TextEncoder();

/**
 * Offset of the first byte that makes `bytes` invalid UTF-8, or -1 when it is valid.
 * A truncated sequence at the end reports the offset of its lead byte; surrogates
 * (ED A0..BF) and overlong forms are invalid, as in the WHATWG decoder.
 */
export function firstInvalidUtf8(bytes: Uint8Array): number {
  const n = bytes.length;
  let i = 0;
  while (i < n) {
    const b = bytes[i];
    if (b < 0x80) {
      i++;
      continue;
    }
    let need: number;
    let lo = 0x80, hi = 0xbf; // allowed range of the second byte
    if (b >= 0xc2 && b <= 0xdf) need = 1;
    else if (b >= 0xe0 && b <= 0xef) {
      need = 2;
      if (b === 0xe0) lo = 0xa0; // overlong
      if (b === 0xed) hi = 0x9f; // surrogates
    } else if (b >= 0xf0 && b <= 0xf4) {
      need = 3;
      if (b === 0xf0) lo = 0x90; // overlong
      if (b === 0xf4) hi = 0x8f; // above U+10FFFF
    } else return i;
    if (i + 1 >= n) return i;
    const b1 = bytes[i + 1];
    if (b1 < lo || b1 > hi) return i + 1;
    for (let k = 2; k <= need; k++) {
      if (i + k >= n) return i;
      const c = bytes[i + k];
      if (c < 0x80 || c > 0xbf) return i + k;
    }
    i += need + 1;
  }
  return -1;
}

/**
 * Decodes UTF-8 strictly; on bad input throws K3Error (exit 2) naming `what` and the
 * offset of the first bad byte. A leading BOM is kept as U+FEFF: input is read verbatim.
 */
export function decodeUtf8Strict(bytes: Uint8Array, what: string): string {
  try {
    return strictDecoder.decode(bytes);
  } catch {
    const at = firstInvalidUtf8(bytes);
    // Name the sequence the bad byte breaks: from its lead byte, not the byte after it.
    let lead = at - 1;
    while (lead > 0 && at - lead < 4 && (bytes[lead] & 0xc0) === 0x80) lead--;
    const b = lead >= 0 ? bytes[lead] : 0;
    const need = b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : b >= 0xc0 ? 1 : 0;
    if (at - lead > need) lead = at; // no open sequence before the bad byte
    const hex = (i: number) => `0x${bytes[i].toString(16).padStart(2, "0")}`;
    const where = lead < at
      ? `a sequence from offset ${lead} (${hex(lead)}) broken by ${hex(at)} at offset ${at}`
      : `bad byte ${hex(at)} at offset ${at}`;
    const binary = bytes.subarray(0, 4096).includes(0)
      ? " (a binary file? a prompt is UTF-8 text; ids go in --ids)"
      : "";
    throw new K3Error(`${what} is not valid UTF-8: ${where}${binary}`, EXIT.usage);
  }
}

/**
 * The UTF-8 bytes of `s` as a byte string (one char per byte, code units 0..255): a
 * cheap Map key for byte sequences, used by the vocabulary trainer.
 */
export function utf8ByteString(s: string): string {
  const bytes = encoder.encode(s);
  let out = "";
  // fromCharCode.apply in chunks: fast, and bounded by the engine's argument limit.
  for (let i = 0; i < bytes.length; i += 8192) {
    out += String.fromCharCode.apply(null, bytes.subarray(i, i + 8192) as unknown as number[]);
  }
  return out;
}
