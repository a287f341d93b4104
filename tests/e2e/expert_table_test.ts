/**
 * The expert table (`k3 pack --hash-experts`). With it, a flipped byte in
 * one routed expert inside a shard is caught on the read that brings it in, at every
 * budget, and by `pack --verify`; a table of another model, other weights or damaged is
 * refused; tokens with the table equal tokens without; the table can be added to an
 * existing trunk without repacking it.
 *
 * @module
 */

import assert from "node:assert/strict";
import { packTrunk } from "../../pack/pack.ts";
import { hashExperts } from "../../pack/experts.ts";
import { loadConfig } from "../../engine/model/config.ts";
import { Checkpoint } from "../../engine/weights/safetensors.ts";
import { locateExpert } from "../../engine/weights/experts.ts";
import { DATA_FILE, MANIFEST_FILE } from "../../engine/weights/manifest.ts";
import { EXPERTS_FILE, tableDigest } from "../../engine/weights/expert_table.ts";
import { jsonIds, k3, python, tempDir, TINY } from "../helpers.ts";
import { shuffledCopy } from "../shuffled.ts";
import { assertRefusedLast, assertRejectsLast, runIds, verifyPacked } from "../damage.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";

const quiet = { log: null };
const IDS = [5, 17, 300, 12, 99, 1000, 7, 640, 33, 250, 511, 2, 870, 64, 123, 456], GEN = 3;
const PROMPT = ["--ids", IDS.join(","), "--gen", String(GEN)];
const BUDGETS: [string, MemoryOptions][] = [
  ["resident (everything from the trunk, all experts cached)", {}],
  ["pinned (trunk pinned, few expert slots)", { trunkGB: 1, cacheGB: 0.0001 }],
  ["floor (every layer streamed)", { trunkGB: 0.0003, cacheGB: 0.0001 }],
];
/** A budget as `k3 run`'s flags. */
const flagsOf = (m: MemoryOptions) =>
  [["--trunk-gb", m.trunkGB], ["--cache-gb", m.cacheGB]].flatMap(([f, v]) =>
    v === undefined ? [] : [f, String(v)]
  ) as string[];

/** A copy of the tiny model (shards, config, tokenizer) to damage. */
async function copyModel(dst: string): Promise<void> {
  await Deno.mkdir(dst);
  for await (const e of Deno.readDir(TINY)) {
    if (e.isFile) await Deno.copyFile(`${TINY}/${e.name}`, `${dst}/${e.name}`);
  }
}

Deno.test("expert table: pack --hash-experts adds the table to an existing trunk (not repacked); tokens equal without it", async () => {
  await using d = await tempDir();
  const t = `${d.path}/trunk`;
  await packTrunk(TINY, t, quiet);
  const before = (await Deno.stat(`${t}/${DATA_FILE}`)).mtime!.getTime();
  const without: number[][] = [];
  for (const [what, budget] of BUDGETS) {
    const out = await k3(["run", TINY, ...PROMPT, "--json", "--trunk", t, ...flagsOf(budget)]);
    assert.equal(out.code, 0, out.stderr);
    assert.match(
      out.stderr,
      /routed experts are not verified per read: no experts\.json in .*k3 pack --hash-experts/,
      what,
    );
    assert.equal(out.stderr.match(/not verified per read/g)!.length, 1, "said once");
    without.push(jsonIds(out.stdout));
  }
  const added = await k3(["pack", TINY, t, "--hash-experts"]);
  assert.equal(added.code, 0, added.stderr);
  assert.match(added.stderr, /nothing to do/);
  assert.match(added.stderr, /hashed 96 experts/);
  assert.equal((await Deno.stat(`${t}/${DATA_FILE}`)).mtime!.getTime(), before, "trunk.bin not rewritten");
  for (const [i, [what, budget]] of BUDGETS.entries()) {
    const out = await k3(["run", TINY, ...PROMPT, "--json", "--trunk", t, ...flagsOf(budget)]);
    assert.equal(out.code, 0, out.stderr);
    assert.doesNotMatch(out.stderr, /not verified/, what);
    assert.deepEqual(jsonIds(out.stdout), without[i], `${what}: tokens with the table equal tokens without`);
  }
  const v = await k3(["pack", "--verify", t, TINY]);
  assert.equal(v.code, 0, v.stderr);
  assert.match(v.stderr, /all 96 routed experts match the expert table/);
});

Deno.test("expert table: a flipped byte in one expert inside a shard is caught at every budget and by pack --verify", async () => {
  await using d = await tempDir();
  const t = `${d.path}/trunk`, model = `${d.path}/model`;
  await packTrunk(TINY, t, quiet);
  await hashExperts(TINY, t, () => {});
  await copyModel(model);
  const cfg = await loadConfig(TINY);
  const ckpt = await Checkpoint.open(TINY);
  const cases: { L: number; E: number; file: string; at: number }[] = [];
  try {
    // layer 3 expert 2 in w2's packed nibbles (mid-tensor), layer 10 expert 5 in a scale
    for (const [L, E, tensor] of [[3, 2, 4], [10, 5, 1]]) {
      const loc = locateExpert(cfg, ckpt, L, E);
      const ti = loc.tensors[tensor];
      cases.push({ L, E, file: ti.file, at: ti.offset + Math.floor(ti.bytes / 2) });
    }
  } finally {
    ckpt.close();
  }
  for (const c of cases) {
    const name = c.file.slice(c.file.lastIndexOf("/") + 1);
    const clean = await Deno.readFile(`${TINY}/${name}`);
    const bad = clean.slice();
    bad[c.at] ^= 0x10;
    await Deno.writeFile(`${model}/${name}`, bad);
    const why = new RegExp(`layer ${c.L} expert ${c.E} \\(shard ${name.replace(/\./g, "\\.")}\\): checksum mismatch`);
    for (const [what, budget] of BUDGETS) {
      const out = await k3(["run", model, ...PROMPT, "--trunk", t, ...flagsOf(budget)]);
      assertRefusedLast(out, 1, why);
      assert.ok(out.stderr.includes(EXPERTS_FILE), what);
    }
    await assertRejectsLast(verifyPacked(t, model), 1, why);
    await Deno.writeFile(`${model}/${name}`, clean);
  }
  // Without the table the same damage is not detected (what the table is for): exit 0.
  await Deno.remove(`${t}/${EXPERTS_FILE}`);
  const name = cases[0].file.slice(cases[0].file.lastIndexOf("/") + 1);
  const bad = await Deno.readFile(`${TINY}/${name}`);
  bad[cases[0].at] ^= 0x10;
  await Deno.writeFile(`${model}/${name}`, bad);
  assert.equal((await runIds(model, IDS, GEN, { trunkDir: t, ...BUDGETS[2][1] })).length, GEN);
});

Deno.test("expert table: a table digest is k3w64 of the expert's six tensor checks (tests/oracle/k3check.py)", async () => {
  await using d = await tempDir();
  const t = `${d.path}/trunk`;
  await packTrunk(TINY, t, quiet);
  const table = await hashExperts(TINY, t, () => {});
  const cfg = await loadConfig(TINY);
  const ckpt = await Checkpoint.open(TINY);
  try {
    for (const [L, E] of [[cfg.firstKDense, 0], [7, 5], [cfg.numLayers - 1, cfg.moe.numExperts - 1]]) {
      const loc = locateExpert(cfg, ckpt, L, E);
      assert.ok(loc.tensors.every((x) => x.file === loc.file));
      const args = loc.tensors.flatMap((x) => [x.offset, x.shape[0], x.bytes / x.shape[0]].map(String));
      const want = JSON.parse(await python("k3check.py", ["digest", loc.file, ...args]));
      assert.equal(tableDigest(table, L, E), want, `layer ${L} expert ${E}`);
    }
  } finally {
    ckpt.close();
  }
});

Deno.test("expert table: a foreign, other-weights, stale-version or damaged expert table is refused (run and pack --verify)", async () => {
  await using d = await tempDir();
  const t = `${d.path}/trunk`;
  await packTrunk(TINY, t, quiet);
  const clean = await hashExperts(TINY, t, () => {});
  const cases: [string, (tb: Record<string, unknown>) => unknown, RegExp][] = [
    ["another model", (tb) => void (tb.fingerprint = "0".repeat(32)), /made for a different model/],
    ["other weights", (tb) => void (tb.sample = "0123456789abcdef"), /made from different weights/],
    ["a later version", (tb) => void (tb.version = 3), /version 3, this k3 reads version 2/],
    ["version 1 (k3w64 of each tensor's bytes)", (tb) => void (tb.version = 1), /version 1, this k3 reads version 2/],
    ["another checksum", (tb) => void (tb.checksum = "k3h64"), /checksum: expected "k3w64", got "k3h64"/],
    [
      "a digest cut short",
      (tb) => void ((tb.digests as string[])[4] = (tb.digests as string[])[4].slice(1)),
      /digests\[4\]: expected 8 digests of 16 hex digits/,
    ],
    ["fewer layers", (tb) => void (tb.layers = 12), /digests: expected an array of 12 items|describes/],
  ];
  for (const [what, change, why] of cases) {
    const tb = structuredClone(clean) as unknown as Record<string, unknown>;
    change(tb);
    await Deno.writeTextFile(`${t}/${EXPERTS_FILE}`, JSON.stringify(tb));
    await assertRejectsLast(runIds(TINY, [5], 1, { trunkDir: t }), 1, why);
    await assertRejectsLast(verifyPacked(t, TINY), 1, why);
    void what;
  }
  await Deno.writeTextFile(`${t}/${EXPERTS_FILE}`, JSON.stringify(clean).slice(0, 300));
  await assertRejectsLast(runIds(TINY, [5], 1, { trunkDir: t }), 1, /not a usable k3 expert table: invalid JSON/);
  await assertRejectsLast(verifyPacked(t), 1, /not a usable k3 expert table/);
  // a table for a trunk of another model: pack --hash-experts refuses to write it
  await Deno.remove(`${t}/${MANIFEST_FILE}`);
  const out = await k3(["pack", TINY, t, "--hash-experts"]);
  assert.notEqual(out.code, 0);
});

Deno.test("expert table: experts whose tensors are scattered over shards (per-tensor reads) are verified too", async () => {
  await using d = await tempDir();
  const model = `${d.path}/model`, t = `${d.path}/trunk`;
  await Deno.mkdir(model);
  await shuffledCopy(model);
  for (const f of ["tiktoken.model", "tokenizer_config.json"]) await Deno.copyFile(`${TINY}/${f}`, `${model}/${f}`);
  await packTrunk(model, t, quiet);
  await hashExperts(model, t, () => {});
  const cfg = await loadConfig(model);
  const ckpt = await Checkpoint.open(model);
  let c: { file: string; at: number };
  try {
    const loc = locateExpert(cfg, ckpt, 6, 3);
    assert.equal(loc.contiguous, false, "the shuffled copy scatters an expert's tensors");
    const ti = loc.tensors[2];
    c = { file: ti.file, at: ti.offset + Math.floor(ti.bytes / 3) };
  } finally {
    ckpt.close();
  }
  const ref = await runIds(TINY, IDS, GEN);
  const ok = await runIds(model, IDS, GEN, { trunkDir: t, ...BUDGETS[2][1] });
  assert.deepEqual(ok, ref, "verified per-tensor reads give the same tokens");
  const clean = await Deno.readFile(c.file);
  const bad = clean.slice();
  bad[c.at] ^= 0x01;
  await Deno.writeFile(c.file, bad);
  const name = c.file.slice(c.file.lastIndexOf("/") + 1);
  const why = new RegExp(`layer 6 expert 3 \\(shard [^)]*${name.replace(/\./g, "\\.")}[^)]*\\): checksum mismatch`);
  for (const [, budget] of BUDGETS) {
    await assertRejectsLast(runIds(model, IDS, GEN, { trunkDir: t, ...budget }), 1, why);
  }
  await assertRejectsLast(verifyPacked(t, model), 1, why);
});
