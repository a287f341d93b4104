/**
 * Checkpoint headers and configs that used to slip through
 * (a zero-size tensor hiding an overlap, a config leaving language-model tensors unused,
 * sizes out of any sane range), and messages that quoted user data with raw newlines.
 *
 * @module
 */

import assert from "node:assert/strict";
import { parseConfig } from "../../engine/model/config.ts";
import { K3Error } from "../../engine/errors.ts";
import { assertRefused, editHeader, runDamaged, shards, shardWith } from "../damage.ts";
import { TINY } from "../helpers.ts";

const tinyConfig = async () => JSON.parse(await Deno.readTextFile(`${TINY}/config.json`));

Deno.test("safetensors: a zero-size tensor between two overlapping tensors does not hide the overlap", async () => {
  const out = await runDamaged(async (dir) => {
    const file = (await shards(dir))[0];
    await editHeader(file, (h) => {
      const names = Object.keys(h).filter((n) => n !== "__metadata__").sort((a, b) =>
        h[a].data_offsets[0] - h[b].data_offsets[0]
      );
      const [a, b] = [h[names[0]], h[names[1]]];
      const len = b.data_offsets[1] - b.data_offsets[0];
      const mid = a.data_offsets[0] + 2;
      // Insertion order puts the empty tensor before b at the same offset.
      const rest = Object.fromEntries(Object.entries(h).filter(([n]) => n !== names[1]));
      for (const n of Object.keys(h)) delete h[n];
      Object.assign(h, rest);
      h["language_model.zz_empty"] = { dtype: "F32", shape: [0], data_offsets: [mid, mid] };
      h[names[1]] = { ...b, data_offsets: [mid, mid + len] };
    });
  });
  assertRefused(out, 1, /overlaps/);
});

Deno.test("config: a config that leaves language-model tensors unused is refused (exit 2) naming one", async () => {
  const noShared = await runDamaged(async (dir) => {
    const cfg = await tinyConfig();
    cfg.text_config.num_shared_experts = 0;
    await Deno.writeTextFile(`${dir}/config.json`, JSON.stringify(cfg));
  });
  assertRefused(
    noShared,
    2,
    /does not use \(first: "language_model\.model\.layers\.\d+\.block_sparse_moe\.shared_experts\./,
  );
  // A stray language-model tensor the config does not describe: the same refusal.
  const stray = await runDamaged(async (dir) => {
    const { file, name } = await shardWith(dir, /layers\.3\.input_layernorm\.weight$/);
    await editHeader(file, (h) => {
      h["language_model.model.layers.3.extra_norm.weight"] = h[name];
      delete h[name];
      h[name] = { ...h["language_model.model.layers.3.extra_norm.weight"] };
      h["language_model.model.layers.3.extra_norm.weight"] = { dtype: "F32", shape: [0], data_offsets: [0, 0] };
    });
  });
  assertRefused(stray, 2, /extra_norm/);
  // Vision tensors stay ignored.
  const vision = await runDamaged(async (dir) => {
    const file = (await shards(dir))[0];
    await editHeader(
      file,
      (h) => void (h["vision_tower.patch_embed.weight"] = { dtype: "F32", shape: [0], data_offsets: [0, 0] }),
    );
  });
  assert.equal(vision.code, 0, vision.stderr);
});

Deno.test("config: every size has a sane range, checked before anything is sized by it", async () => {
  const base = await tinyConfig();
  // deno-lint-ignore no-explicit-any
  const cases: [string, (c: any) => void, RegExp][] = [
    [
      "layers 2^31",
      (c) => void (c.text_config.num_hidden_layers = 2 ** 31),
      /num_hidden_layers: expected an integer in 1\.\.4096/,
    ],
    ["hidden 1e300", (c) => void (c.text_config.hidden_size = 1e300), /hidden_size: expected an integer/],
    ["vocab 2^40", (c) => void (c.text_config.vocab_size = 2 ** 40), /vocab_size/],
    ["experts 2^31", (c) => void (c.text_config.num_experts = 2 ** 31), /num_experts/],
    ["eos outside the vocabulary", (c) => void (c.eos_token_id = 1 << 20), /eos_token_id .* outside the vocabulary/],
    ["layer list of a million", (c) => {
      (c.text_config.linear_attn_config as Record<string, unknown>).kda_layers = new Array(1e6).fill(1);
    }, /kda_layers: expected an array of at most/],
    ["eps 10", (c) => void (c.text_config.rms_norm_eps = 10), /rms_norm_eps/],
  ];
  for (const [what, edit, why] of cases) {
    const c = structuredClone(base);
    edit(c);
    // The range check's own message: refused by the check, before anything was sized.
    assert.throws(() => parseConfig(c), (e: unknown) => {
      assert.ok(e instanceof K3Error, `${what}: ${e}`);
      assert.equal(e.exitCode, 2, what);
      assert.match(e.message, why, what);
      return true;
    });
  }
  const out = await runDamaged(async (dir) => {
    const c = structuredClone(base);
    c.text_config.num_hidden_layers = 2 ** 31;
    await Deno.writeTextFile(`${dir}/config.json`, JSON.stringify(c));
  });
  assertRefused(out, 2, /num_hidden_layers/);
});

Deno.test("messages: every message is one line: JSON errors, a BOM, and a tensor name with a newline", async () => {
  for (const text of ['{\n"a":\n}', "\uFEFF{}", '{ // comment\n"a": 1 }']) {
    const out = await runDamaged(async (dir) => await Deno.writeTextFile(`${dir}/config.json`, text));
    assertRefused(out, 2, /config\.json/);
  }
  const forged = await runDamaged(async (dir) => {
    const { file, name } = await shardWith(dir, /layers\.2\.self_attn\.q_proj\.weight$/);
    await editHeader(file, (h) => {
      h["x\nk3: all good\n"] = { ...h[name], data_offsets: [h[name].data_offsets[0], h[name].data_offsets[1] + 1] };
    });
  });
  assertRefused(forged, 1, /x\\nk3: all good\\n/);
});
