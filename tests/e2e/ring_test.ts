// The trunk ring reads the next layers into the space a layer's attention tensors leave once
// the pass is past them (StreamedTrunk: attentionDone / free), and that never changes a bit.
import assert from "node:assert/strict";
import { attentionSpan } from "../../engine/weights/trunk_geometry.ts";
import type { TensorEntry } from "../../engine/weights/trunk_geometry.ts";
import { floorFlags, jsonIds, k3, packedFloor, tempDir, TINY } from "../helpers.ts";

const entry = (name: string, offset: number, bytes: number): TensorEntry =>
  ({ name, offset, bytes, dtype: "BF16", shape: [bytes / 2], keep: "matrix" }) as TensorEntry;

Deno.test("attentionSpan: the run of self_attn tensors, up to where the next tensor starts", () => {
  const t = [
    entry("layers.1.input_layernorm.weight", 0, 4096),
    entry("layers.1.self_attn.q_proj.weight", 4096, 8192),
    entry("layers.1.self_attn.o_proj.weight", 12288, 4000),
    entry("layers.1.mlp.gate_proj.weight", 20480, 4096),
  ];
  assert.deepEqual(attentionSpan(t), [4096, 20480]);
  assert.deepEqual(attentionSpan(t.slice(0, 3)), [4096, 16288], "attention last: up to its end");
  // Something else inside the run: nothing is released early.
  const mixed = [...t, entry("layers.1.self_attn.g_proj.weight", 24576, 4096)];
  assert.deepEqual(attentionSpan(mixed), [0, 0]);
  assert.deepEqual(attentionSpan([t[0], t[3]]), [0, 0], "no attention tensors");
});

Deno.test("at the floor budget the ring reads ahead into released attention space; tokens equal resident", async () => {
  await using d = await tempDir();
  // 4 KiB pieces: the tiny model's layers are a few pieces each, as a real layer is ~80.
  const { floor } = await packedFloor(TINY, `${d.path}/trunk`, 4096);
  const args = ["run", TINY, "--ids", "5,6,7,8", "--gen", "6", "--json"];
  const resident = await k3(args);
  assert.equal(resident.code, 0, resident.stderr);
  const report = `${d.path}/floor.json`;
  const floored = await k3([
    ...args,
    ...floorFlags(floor),
    "--out",
    report,
  ]);
  assert.equal(floored.code, 0, floored.stderr);
  assert.deepEqual(jsonIds(floored.stdout), jsonIds(resident.stdout));
  const r = JSON.parse(await Deno.readTextFile(report));
  assert.ok(r.trunk_bytes_read_early > 0, `early reads happened (${r.trunk_bytes_read_early} bytes)`);
});
