// The split codec (kernels/k3io.h): round trips on every kernel build, the in-place decode
// the reads rely on, adversarial pieces, and corrupt pieces refused.
import assert from "node:assert/strict";
import { libraryBuilds, noise } from "../helpers.ts";
import { normalBf16 } from "../../engine/weights/codec.ts";

const symbols = {
  k3_alloc: { parameters: ["u64"], result: "pointer" },
  k3_free: { parameters: ["pointer"], result: "void" },
  k3io_split_encode: { parameters: ["pointer", "u64", "pointer", "u64", "i32"], result: "i64" },
  k3io_split_decode: { parameters: ["pointer", "u64", "pointer", "u64"], result: "i64" },
  k3io_split_check: { parameters: ["pointer", "u64", "u64"], result: "i64" },
  k3io_split_range: { parameters: ["pointer", "u64", "u64", "u64", "u64", "pointer"], result: "i64" },
  k3_matmul_checked: {
    parameters: ["pointer", "i32", "pointer", "pointer", "i32", "i32", "i32", "i32", "i32", "pointer"],
    result: "void",
  },
} as const;
const builds = libraryBuilds(symbols);
const [, scalar] = builds[0];
const BLOCK_BYTES = 4096; // 2048 words: the smallest piece

/** A native buffer holding `bytes`, with room for `cap` (freed by the caller). */
function native(lib: typeof scalar, cap: number, bytes?: Uint8Array) {
  const ptr = lib.symbols.k3_alloc(BigInt(cap))!;
  const u8 = new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(ptr, cap));
  if (bytes) u8.set(bytes);
  return { ptr, u8, free: () => lib.symbols.k3_free(ptr) };
}

/** Codes `piece` at `width` with the scalar build; the stored bytes (empty: best raw). */
function encode(piece: Uint8Array, width = 0): Uint8Array {
  const src = native(scalar, piece.length, piece), dst = native(scalar, 2 * piece.length + 2 * BLOCK_BYTES);
  try {
    const n = Number(
      scalar.symbols.k3io_split_encode(src.ptr, BigInt(piece.length), dst.ptr, BigInt(dst.u8.length), width),
    );
    assert(n >= 0, `encode failed: ${n}`);
    assert(n % 4096 === 0, "stored bytes are a multiple of 4096");
    return dst.u8.slice(0, n);
  } finally {
    src.free();
    dst.free();
  }
}

/** Decodes with `lib` from a separate buffer, or in place (stored at the end of the slot);
 * the slot starts `skew` bytes into its (4096-aligned) allocation. */
function decode(
  lib: typeof scalar,
  stored: Uint8Array,
  len: number,
  inPlace: boolean,
  skew = 0,
): Uint8Array | undefined {
  const buf = native(lib, skew + Math.max(len, stored.length) + (inPlace ? 0 : stored.length));
  const slot = { ptr: Deno.UnsafePointer.offset(buf.ptr, skew)!, u8: buf.u8.subarray(skew) };
  try {
    const at = inPlace ? len - stored.length : len;
    slot.u8.set(stored, at);
    const src = Deno.UnsafePointer.offset(slot.ptr, at)!;
    const n = Number(lib.symbols.k3io_split_decode(src, BigInt(stored.length), slot.ptr, BigInt(len)));
    return n === len ? slot.u8.slice(0, len) : undefined;
  } finally {
    buf.free();
  }
}

const equal = (a: Uint8Array | undefined, b: Uint8Array) =>
  a !== undefined && a.length === b.length && a.every((x, i) => x === b[i]);

/** bf16 words of normal weights, as bytes. */
function weights(bytes: number, seed: number, std = 0.02): Uint8Array {
  const u16 = new Uint16Array(bytes / 2);
  normalBf16(u16, std, seed);
  return new Uint8Array(u16.buffer);
}

/** A piece whose high bytes are `hi(i)` and low bytes noise. */
function withHigh(bytes: number, hi: (i: number) => number, seed = 3): Uint8Array {
  const p = noise(bytes, seed);
  for (let i = 0; i < bytes / 2; i++) p[2 * i + 1] = hi(i) & 255;
  return p;
}

Deno.test("codec: weight-like pieces code smaller, at the width that stores least, and decode in place on every build", () => {
  // One and three blocks: the 4096-byte rounding of the stored form eats the saving, so auto
  // keeps them raw; a forced width still round-trips.
  for (const bytes of [BLOCK_BYTES, 3 * BLOCK_BYTES]) {
    const piece = weights(bytes, bytes);
    assert(encode(piece).length === 0, `${bytes}: raw`);
    const stored = encode(piece, 3);
    for (const [name, lib] of builds) assert(equal(decode(lib, stored, bytes, false), piece), `${name} ${bytes}`);
  }
  for (const bytes of [7 * BLOCK_BYTES, 1 << 20]) {
    const piece = weights(bytes, bytes);
    const stored = encode(piece);
    assert(stored.length > 0 && stored.length < bytes, `${bytes}: coded (${stored.length} bytes)`);
    const sizes = [1, 2, 3, 4, 5, 6, 7].map((w) => encode(piece, w).length);
    assert(stored.length === Math.min(...sizes), `${bytes}: the smallest width (${sizes})`);
    for (const [name, lib] of builds) {
      assert(equal(decode(lib, stored, bytes, true), piece), `${name} ${bytes}: in place`);
      assert(equal(decode(lib, stored, bytes, false), piece), `${name} ${bytes}: separate buffers`);
      // A slot off the 64-byte lines the AVX-512 decode streams whole blocks to: stored there.
      for (const skew of [2, 4094]) {
        assert(equal(decode(lib, stored, bytes, true, skew), piece), `${name} ${bytes}: in place, skew ${skew}`);
        assert(equal(decode(lib, stored, bytes, false, skew), piece), `${name} ${bytes}: skew ${skew}`);
      }
    }
  }
});

Deno.test("codec: noise, all 256 high-byte values and all escapes round-trip at every width; auto keeps them raw", () => {
  const bytes = 2 * BLOCK_BYTES;
  const pieces: [string, Uint8Array][] = [
    ["noise", noise(bytes, 7)],
    ["every high byte in turn", withHigh(bytes, (i) => i)],
    ["every high byte, shuffled", withHigh(bytes, (i) => (i * 167 + 13) % 256)],
    ["one high byte, then all escapes", withHigh(bytes, (i) => (i % 2 ? 0x3c : 0x80 + (i % 100)))],
  ];
  for (const [what, piece] of pieces) {
    assert(encode(piece).length === 0, `${what}: auto stores it raw`);
    for (let w = 1; w <= 7; w++) {
      const stored = encode(piece, w);
      for (const [name, lib] of builds) {
        assert(equal(decode(lib, stored, bytes, false), piece), `${what}: ${name} width ${w}`);
      }
    }
  }
  // A piece of one high byte and escapes only at the end: in place holds to the last block.
  const tail = withHigh(4 * BLOCK_BYTES, (i) => (i < 4 * 2048 - 300 ? 0x3c : i));
  const stored = encode(tail);
  assert(stored.length > 0);
  for (const [name, lib] of builds) {
    assert(equal(decode(lib, stored, tail.length, true), tail), `${name}: escapes at the end`);
  }
});

Deno.test("codec: sizes that are not whole blocks are refused", () => {
  const src = native(scalar, 2 * BLOCK_BYTES), dst = native(scalar, 4 * BLOCK_BYTES);
  try {
    for (const len of [0, 2, 4094, BLOCK_BYTES + 2, BLOCK_BYTES + 2048]) {
      assert(
        Number(scalar.symbols.k3io_split_encode(src.ptr, BigInt(len), dst.ptr, BigInt(4 * BLOCK_BYTES), 0)) < 0,
        `${len}`,
      );
    }
  } finally {
    src.free();
    dst.free();
  }
});

Deno.test("codec: a flipped byte anywhere the decode uses is refused or changes the decoded piece; a short or mislabelled piece is refused", () => {
  const bytes = 8 * BLOCK_BYTES;
  const piece = weights(bytes, 11);
  const stored = encode(piece);
  const first = new DataView(stored.buffer).getUint32(12, true), w = stored[4];
  const indexEnd = 256 + 4 * (bytes / BLOCK_BYTES);
  assert(first > indexEnd, "the padding before the first block is there to flip");
  // Header fields, padding, the block index, codes, low bytes and escapes (the dictionary's
  // used entries are covered by the decoded bytes changing).
  const at = [
    0,
    4,
    8,
    12,
    16 + (1 << w) - 1,
    200,
    256,
    256 + 4 * 3 + 1,
    indexEnd - 4,
    indexEnd,
    first - 1,
    first,
    first + 300,
    first + 2048 * w / 8 + 5,
    stored.length - 1,
  ];
  for (const i of at) {
    for (const bit of [0x01, 0x80]) {
      const bad = stored.slice();
      bad[i] ^= bit;
      for (const [name, lib] of builds) {
        const got = decode(lib, bad, bytes, true);
        assert(!equal(got, piece), `${name}: byte ${i} ^ ${bit} went unnoticed`);
      }
    }
  }
  for (const [name, lib] of builds) {
    assert(decode(lib, stored.subarray(0, stored.length - 4096), bytes, false) === undefined, `${name}: short`);
    assert(decode(lib, stored, bytes - BLOCK_BYTES, false) === undefined, `${name}: wrong length`);
  }
});

Deno.test("codec verdict: codes only when a streamed trunk byte is faster coded, the slower of its read and its product", async () => {
  const { codecVerdict } = await import("../../engine/weights/codec.ts");
  // A disk slower than both products: the token is the read, 0.7 of it coded.
  let v = codecVerdict({ disk: 3e9, plain: 24e9, split: 14e9, ratio: 0.7 });
  assert(v.pays && Math.abs(v.predicted - 0.7) < 1e-12);
  // A disk between them: the coded product bounds the coded token (3 / 3.5 of the raw one).
  v = codecVerdict({ disk: 12e9, plain: 24e9, split: 14e9, ratio: 0.7 });
  assert(v.pays && Math.abs(v.predicted - 12 / 14) < 1e-12);
  // A disk faster than the coded product saves nothing; faster than both, coding only loses.
  assert(!codecVerdict({ disk: 14e9, plain: 24e9, split: 14e9, ratio: 0.5 }).pays);
  v = codecVerdict({ disk: 40e9, plain: 24e9, split: 14e9, ratio: 0.7 });
  assert(!v.pays && v.predicted > 1);
});

/** Stored bytes in a native buffer for the range and check calls (freed by the caller). */
function storedIn(lib: typeof scalar, stored: Uint8Array) {
  return native(lib, stored.length, stored);
}

Deno.test("codec: any run of words decodes from the stored form on every build; a piece kept coded is checked", () => {
  const bytes = 6 * BLOCK_BYTES;
  const pieces: [string, Uint8Array, number][] = [
    ["weights", weights(bytes, 5), 0],
    ["all escapes", withHigh(bytes, (i) => (i % 2 ? 0x3c : 0x80 + (i % 100))), 2],
    ["every high byte", withHigh(bytes, (i) => i), 7],
  ];
  const words = bytes / 2;
  const runs = [[0, words], [0, 1], [2047, 2], [2048, 2048], [100, 5000], [words - 3, 3], [4095, 4099]];
  for (const [what, piece, width] of pieces) {
    const stored = encode(piece, width);
    assert(stored.length > 0, `${what}: coded`);
    const u16 = new Uint16Array(piece.buffer, piece.byteOffset, words);
    for (const [name, lib] of builds) {
      const s = storedIn(lib, stored), out = native(lib, bytes);
      try {
        assert.equal(Number(lib.symbols.k3io_split_check(s.ptr, BigInt(stored.length), BigInt(bytes))), bytes);
        for (const [w0, n] of runs) {
          const r = Number(
            lib.symbols.k3io_split_range(s.ptr, BigInt(stored.length), BigInt(bytes), BigInt(w0), BigInt(n), out.ptr),
          );
          assert.equal(r, 0, `${what} ${name}: [${w0}, +${n})`);
          const got = new Uint16Array(out.u8.buffer, out.u8.byteOffset, n);
          assert(got.every((x, i) => x === u16[w0 + i]), `${what} ${name}: words [${w0}, +${n})`);
        }
        assert(
          Number(
            lib.symbols.k3io_split_range(s.ptr, BigInt(stored.length), BigInt(bytes), BigInt(words - 1), 2n, out.ptr),
          ) < 0,
          "past the end",
        );
      } finally {
        s.free();
        out.free();
      }
    }
  }
  // What a kept piece trusts (header, zeros, index) is checked at the read; what it does not
  // (which codes escape) fails the range that decodes it.
  const piece = weights(8 * BLOCK_BYTES, 11), stored = encode(piece);
  const first = new DataView(stored.buffer).getUint32(12, true);
  const s = storedIn(scalar, stored), out = native(scalar, piece.length);
  try {
    const all = (lib: typeof scalar) =>
      Number(
        lib.symbols.k3io_split_range(
          s.ptr,
          BigInt(stored.length),
          BigInt(piece.length),
          0n,
          BigInt(piece.length / 2),
          out.ptr,
        ),
      );
    for (const i of [0, 4, 8, 12, 200, 256, 257, 256 + 4 * 7, 256 + 4 * 7 + 3, first - 1]) {
      for (const bit of [0x01, 0x80]) {
        s.u8.set(stored);
        s.u8[i] ^= bit;
        // The check refuses it, or (an index entry moved within what blocks may span) the
        // block before it no longer ends where the index says the next one starts.
        const checked = Number(scalar.symbols.k3io_split_check(s.ptr, BigInt(stored.length), BigInt(piece.length)));
        assert(checked < 0 || all(scalar) < 0, `byte ${i} ^ ${bit} went unnoticed`);
        if (i < 256 || i >= 256 + 4 * 8) assert(checked < 0, `check: byte ${i} ^ ${bit}`);
      }
    }
    s.u8.set(stored);
    assert(
      Number(scalar.symbols.k3io_split_check(s.ptr, BigInt(stored.length - 4096), BigInt(piece.length))) < 0,
      "short",
    );
    // A code turned into an escape (or back) moves the block's end off the next block's start.
    const w = stored[4], codesAt = first + 64 * w;
    let refused = 0;
    for (let j = 0; j < w; j++) {
      s.u8.set(stored);
      s.u8[codesAt + j] ^= 0xff;
      const r = Number(
        scalar.symbols.k3io_split_range(s.ptr, BigInt(stored.length), BigInt(piece.length), 0n, 2048n, out.ptr),
      );
      const got = new Uint16Array(out.u8.buffer, out.u8.byteOffset, 2048);
      const same = got.every((x, i) => x === new Uint16Array(piece.buffer, 0, 2048)[i]);
      assert(!same, `code byte ${j} flipped went unnoticed`);
      if (r < 0) refused++;
    }
    assert(refused > 0, "a changed escape count is refused");
  } finally {
    s.free();
    out.free();
  }
});

Deno.test("codec: the bf16 product from split-coded pieces gives the plain product's bits and check on every build", () => {
  const PIECE = 4 * BLOCK_BYTES; // small pieces, so a matrix spans several, coded and not
  // Shapes where a window is one row block, several, or not a whole number of them.
  for (
    const [rows, cols, word0] of [[37, 96, 0], [9, 3000, 1000], [70, 512, 2048 * 3 + 7], [40, 3584, 5], [300, 100, 9]]
  ) {
    const words = word0 + rows * cols;
    const npieces = Math.ceil(words / (PIECE / 2));
    const all = weights(npieces * PIECE, rows + cols);
    const mat = all.subarray(2 * word0, 2 * (word0 + rows * cols));
    for (const [name, lib] of builds) {
      const plain = native(lib, mat.length, mat);
      const ring = native(lib, npieces * PIECE);
      const desc = native(lib, 16 + 24 * npieces);
      const dv = new DataView(desc.u8.buffer, desc.u8.byteOffset, desc.u8.length);
      dv.setBigUint64(0, BigInt(npieces), true);
      dv.setBigUint64(8, BigInt(word0), true);
      const kept: number[] = [];
      for (let i = 0; i < npieces; i++) {
        const slot = all.subarray(i * PIECE, (i + 1) * PIECE);
        const stored = i % 3 === 1 ? new Uint8Array(0) : encode(slot, 3); // every third piece decoded in place
        if (stored.length > 0) ring.u8.set(stored, i * PIECE);
        else ring.u8.set(slot, i * PIECE);
        if (stored.length > 0) kept.push(i);
        const base = Deno.UnsafePointer.value(Deno.UnsafePointer.offset(ring.ptr, i * PIECE)!);
        dv.setBigUint64(16 + 24 * i, BigInt(base), true);
        dv.setBigUint64(24 + 24 * i, BigInt(PIECE), true);
        dv.setBigUint64(32 + 24 * i, BigInt(stored.length), true);
      }
      assert(kept.length > 0, "some pieces stay coded");
      try {
        for (const ntok of [1, 5]) {
          const x = native(lib, 4 * ntok * cols);
          new Float32Array(x.u8.buffer, x.u8.byteOffset, ntok * cols).forEach((_, i, a) => a[i] = Math.sin(i * 0.37));
          const ya = native(lib, 4 * ntok * rows), yb = native(lib, 4 * ntok * rows);
          const sa = new BigUint64Array(1), sb = new BigUint64Array(1);
          /** Rows [r0, r1) of the matrix at w (wtype 1 plain, 2 split) times x into y, its check into sum. */
          const product = (w: typeof x, wtype: number, y: typeof x, r0: number, r1: number, sum: BigUint64Array) => {
            sum[0] = 0n;
            lib.symbols.k3_matmul_checked(
              w.ptr,
              wtype,
              x.ptr,
              y.ptr,
              ntok,
              rows,
              cols,
              r0,
              r1,
              Deno.UnsafePointer.of(sum),
            );
          };
          try {
            for (const [r0, r1] of [[0, rows], [1, rows - 2], [rows - 1, rows]]) {
              product(plain, 1, ya, r0, r1, sa);
              product(desc, 2, yb, r0, r1, sb);
              const a = new Uint32Array(ya.u8.buffer, ya.u8.byteOffset, ntok * rows);
              const b = new Uint32Array(yb.u8.buffer, yb.u8.byteOffset, ntok * rows);
              for (let t = 0; t < ntok; t++) {
                for (let r = r0; r < r1; r++) {
                  assert.equal(b[t * rows + r], a[t * rows + r], `${name} ${rows}x${cols} ntok ${ntok} row ${r}`);
                }
              }
              assert.equal(sb[0], sa[0], `${name} ${rows}x${cols} ntok ${ntok} [${r0}, ${r1}): check`);
            }
            // A flipped low byte in a coded piece changes the check.
            const i = kept[0], at = i * PIECE + encode(all.subarray(i * PIECE, (i + 1) * PIECE), 3).length - 1000;
            ring.u8[at] ^= 1;
            product(desc, 2, yb, 0, rows, sb);
            ring.u8[at] ^= 1;
            product(plain, 1, ya, 0, rows, sa);
            // The byte is in the piece's last block, which decodes to its last BLOCK_BYTES.
            const touches = (i + 1) * PIECE > 2 * word0 && (i + 1) * PIECE - BLOCK_BYTES < 2 * (word0 + rows * cols);
            if (touches) assert.notEqual(sb[0], sa[0], `${name}: a flipped coded byte went unnoticed`);
          } finally {
            x.free();
            ya.free();
            yb.free();
          }
        }
      } finally {
        plain.free();
        ring.free();
        desc.free();
      }
    }
  }
});
