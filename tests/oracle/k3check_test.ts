/**
 * The matrix check (kernels/k3.h, contract 5) against tests/oracle/k3check.py, an
 * independent pure Python statement of the definition: every build of the library (scalar,
 * avx2, avx512 where present, native) gives its known answers. Starts python3 (the
 * in-process properties of the check are in tests/unit/matrix_check_test.ts).
 *
 * @module
 */
import assert from "node:assert/strict";
import { symbols } from "../../engine/native/symbols.ts";
import { libraryBuilds, matrixCheckHex, python } from "../helpers.ts";

Deno.test("matrix check: every build gives the Python definition's known answers", async () => {
  const vectors: { rows: number; rowbytes: number; hex: string; r0: number; r1: number; check: string }[] = JSON
    .parse(await python("k3check.py", ["vectors"]));
  assert.ok(vectors.length >= 20);
  const all = libraryBuilds(symbols);
  try {
    for (const [name, l] of all) {
      for (const v of vectors) {
        const bytes = new Uint8Array(v.hex.match(/../g)!.map((h) => parseInt(h, 16)));
        assert.equal(matrixCheckHex(l, bytes, v.rowbytes, v.r0, v.r1), v.check, `${name} ${v.rows}x${v.rowbytes}`);
      }
    }
  } finally {
    for (const [, l] of all) l.close();
  }
});
