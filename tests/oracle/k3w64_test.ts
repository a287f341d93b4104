/**
 * k3w64 (kernels/k3io.c), k3's checksum, against tests/oracle/k3w64.py, an independent pure
 * Python statement of the definition: every build of the library (scalar, avx2, avx512 where
 * present, native) gives its known answers. Starts python3 (the in-process properties of the
 * hash are in tests/unit/hash_test.ts).
 *
 * @module
 */
import assert from "node:assert/strict";
import { ioSymbols } from "../../engine/native/symbols.ts";
import { k3w64Hex, libraryBuilds, python } from "../helpers.ts";

Deno.test("k3w64: every build gives the Python definition's known answers", async () => {
  const vectors: { len: number; hex?: string; fill?: number; hash: string }[] = JSON.parse(
    await python("k3w64.py", ["vectors"]),
  );
  assert.ok(vectors.length >= 20);
  const all = libraryBuilds(ioSymbols);
  try {
    for (const v of vectors) {
      const bytes = v.hex !== undefined
        ? new Uint8Array(v.hex.match(/../g)?.map((h) => parseInt(h, 16)) ?? [])
        : new Uint8Array(v.len).fill(v.fill!);
      assert.equal(bytes.length, v.len);
      for (const [name, l] of all) assert.equal(k3w64Hex(l, bytes), v.hash, `${name}, ${v.len} bytes`);
    }
    // distinct answers: the vectors would catch a hash that ignores its input
    assert.equal(new Set(vectors.map((v) => v.hash)).size, vectors.length);
  } finally {
    all.forEach(([, l]) => l.close());
  }
});
