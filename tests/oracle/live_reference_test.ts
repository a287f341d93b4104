/**
 * The engine against the live float64 NumPy reference on freshly generated models of shapes
 * that differ from the committed tiny model's (tests/oracle/gen_model.py, then
 * tests/oracle/reference.py), so the suite is not tuned to one checkpoint. Starts python3
 * (the committed tiny model's checks are in tests/e2e/engine_test.ts).
 */

import assert from "node:assert/strict";
import { checkAgainstReference, python, tempDir } from "../helpers.ts";

/** Shapes the live reference checks, chosen to differ from the tiny fixture. */
const SHAPES: { name: string; args: string[] }[] = [
  {
    name: "seed 7, block 2, 3 KDA heads, top-3, f32 weights, 1 shard",
    args: [
      "--seed",
      "7",
      "--block",
      "2",
      "--kda-heads",
      "3",
      "--topk",
      "3",
      "--float-dtype",
      "f32",
      "--shards",
      "1",
      "--layers",
      "9",
    ],
  },
  {
    name: "seed 11, block 4, 3 MLA heads, top-1, f16 weights, quant config at root",
    args: [
      "--seed",
      "11",
      "--block",
      "4",
      "--mla-heads",
      "3",
      "--topk",
      "1",
      "--float-dtype",
      "f16",
      "--quant-at-root",
      "--layers",
      "10",
      "--shards",
      "4",
    ],
  },
  {
    name: "seed 23, block 5, 16 experts top-4, one shared expert, hidden 96",
    args: [
      "--seed",
      "23",
      "--block",
      "5",
      "--experts",
      "16",
      "--topk",
      "4",
      "--shared",
      "1",
      "--hidden",
      "96",
      "--layers",
      "11",
      "--full-attn",
      "2,6,11",
    ],
  },
  {
    name: "seed 5, 5 layers all MLA but one, block 1",
    args: ["--seed", "5", "--block", "1", "--layers", "5", "--full-attn", "1,2,4,5"],
  },
];

for (const shape of SHAPES) {
  Deno.test(`live reference: ${shape.name}`, async () => {
    await using dir = await tempDir();
    await python("gen_model.py", [dir.path, "--preset", "tiny", ...shape.args]);
    const prompt = "5,17,300,42,7,99,512,1,250,33";
    await python("reference.py", [
      dir.path,
      "--ids",
      prompt,
      "--gen",
      "8",
      "--out",
      `${dir.path}/ref.json`,
      "--logits",
      `${dir.path}/ref.f32`,
    ]);
    const maxDiff = await checkAgainstReference(dir.path, `${dir.path}/ref.json`, `${dir.path}/ref.f32`, 4);
    console.log(`${shape.name}: max |logit - reference| = ${maxDiff.toExponential(3)}`);
    assert.ok(maxDiff < 1e-3);
  });
}
