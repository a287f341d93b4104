// Which pieces of a streamed layer the ring leaves coded, where each piece then goes, and how
// much of the attention span it may free early (trunk_file.ts, trunk_ring.ts).
import assert from "node:assert/strict";
import type { Region, TensorEntry } from "../../engine/weights/trunk_geometry.ts";
import { keptCoded, piecePlaces } from "../../engine/weights/trunk_geometry.ts";
import { freedEarly } from "../../engine/weights/trunk_geometry.ts";

const P = 16384;

function tensor(
  name: string,
  offset: number,
  bytes: number,
  keep: "matrix" | "vector",
  dtype: "BF16" | "F32" = "BF16",
) {
  return { name, dtype, keep, shape: [1, bytes / 2], offset, bytes, check: "" } as TensorEntry;
}

function region(tensors: TensorEntry[], size: number, stored: number[]): Region {
  return { offset: 0, size, bytes: size, hash: "", pieces: stored.map(() => ""), tensors, stored, storedPieces: [] };
}

Deno.test("trunk places: a coded piece stays coded only when every tensor in it is a matrix only the product reads", () => {
  const r = region(
    [
      tensor("layers.0.input_layernorm.weight", 0, 4096, "vector", "F32"),
      tensor("layers.0.self_attn.q_proj.weight", 4096, 3 * P - 4096, "matrix"),
      tensor("layers.0.self_attn.kv_b_proj.weight", 3 * P, P, "matrix"),
      tensor("layers.0.mlp.down_proj.weight", 4 * P, P + 8192, "matrix"),
      tensor("layers.0.mlp.up_proj.weight", 5 * P + 8192, P - 8192, "matrix", "F32"),
    ],
    6 * P,
    [12288, 12288, P, 12288, 12288, 12288],
  );
  // piece 0 holds a vector; 2 is raw; 3 is kv_b_proj (read by absorb and expand); 5 holds an
  // F32 matrix.
  assert.deepEqual([...keptCoded(r, P)], [0, 1, 0, 0, 1, 0]);
  const kept = keptCoded(r, P);
  assert.deepEqual(piecePlaces(r, P, kept), [
    0,
    P,
    P + 12288,
    2 * P + 12288,
    3 * P + 12288,
    3 * P + 2 * 12288,
    4 * P + 2 * 12288,
  ]);
  // Nothing kept: every piece at its own offset.
  assert.deepEqual(piecePlaces(r, P, new Uint8Array(6)), [0, P, 2 * P, 3 * P, 4 * P, 5 * P, 6 * P]);
});

Deno.test("trunk places: the attention span frees early only the bytes no later tensor's coded piece needs", () => {
  const kept = new Uint8Array([0, 1, 1, 0, 1]);
  // Ends inside kept pieces: shrunk to the whole pieces inside (here none, then two).
  assert.deepEqual(freedEarly([P + 100, 3 * P - 5], kept, P), [0, 0]);
  assert.deepEqual(freedEarly([P + 100, 4 * P + 7], kept, P), [2 * P, 4 * P]);
  // Ends at boundaries or in pieces that are not kept: as they are.
  assert.deepEqual(freedEarly([100, 3 * P + 5], kept, P), [100, 3 * P + 5]);
  assert.deepEqual(freedEarly([P, 3 * P], kept, P), [P, 3 * P]);
  // Nothing left: nothing freed early.
  assert.deepEqual(freedEarly([P + 1, 2 * P - 1], kept, P), [0, 0]);
});
