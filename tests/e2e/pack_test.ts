/**
 * k3 pack: layout, round trip with --verify, idempotence and --force, bounded staging,
 * non-contiguous sources, and refusal of damaged or foreign trunks (exit 1) and of bad
 * usage (exit 2).
 */

import assert from "node:assert/strict";
import { packTrunk } from "../../pack/pack.ts";
import { DATA_FILE, MANIFEST_FILE, readManifest } from "../../engine/weights/manifest.ts";
import { regionsOf } from "../../engine/weights/trunk_geometry.ts";
import { checkRows } from "../../engine/native/tensors.ts";
import { verifyTrunk } from "../../pack/verify.ts";
import { layerTensors } from "../../engine/model/tensors.ts";
import { loadConfig } from "../../engine/model/config.ts";
import { jsonIds, k3, python, readReference, tempDir, TINY } from "../helpers.ts";
import { shuffledCopy } from "../shuffled.ts";
import { assertRejectsLast, runIds, verifyPacked } from "../damage.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";

const quiet = { log: null };

async function ids(): Promise<string> {
  return (await readReference(`${TINY}/reference.json`)).prompt_ids.join(",");
}

Deno.test("pack: layout is aligned, layers hold layerTensors in order, routed experts excluded, shared experts in", async () => {
  await using d = await tempDir();
  const r = await packTrunk(TINY, `${d.path}/trunk`, quiet);
  const m = r.manifest;
  const cfg = await loadConfig(TINY);
  assert.equal(m.format, "k3-trunk");
  assert.equal(m.version, 5);
  assert.equal(m.layer.length, cfg.numLayers);
  assert.equal(m.source.shards.length, 3);
  let end = 0;
  for (const [L, reg] of m.layer.entries()) {
    assert.equal(reg.offset % 4096, 0);
    assert.equal(reg.size % 4096, 0);
    assert.equal(reg.offset, end, "regions are back to back");
    end = reg.offset + reg.size;
    assert.deepEqual(reg.tensors.map((t) => t.name), layerTensors(cfg, L).map((s) => s.name));
    assert.ok(reg.tensors.every((t) => !t.name.includes(".experts.")));
    if (L >= cfg.firstKDense) assert.ok(reg.tensors.some((t) => t.name.includes("shared_experts.gate_proj")));
    for (const t of reg.tensors) assert.equal(t.offset % 64, 0);
  }
  for (const reg of [m.finals, m.embed, m.head]) {
    assert.equal(reg.offset, end);
    end += reg.size;
  }
  assert.equal(m.data.bytes, end);
  assert.equal((await Deno.stat(`${d.path}/trunk/${DATA_FILE}`)).size, end);
  // Every tensor's check is the one tests/oracle/k3check.py computes from the data file.
  const all = regionsOf(m).flatMap(([, reg]) => reg.tensors.map((t) => ({ reg, t })));
  const args = all.flatMap(({ reg, t }) => {
    const { rows, rowbytes } = checkRows(t);
    return [reg.offset + t.offset, rows, rowbytes].map(String);
  });
  const want: string[] = JSON.parse(await python("k3check.py", ["file", `${d.path}/trunk/${DATA_FILE}`, ...args]));
  assert.deepEqual(all.map(({ t }) => t.check), want);
});

Deno.test("pack: a tiny staging buffer and a shuffled, scattered source give the same bytes; verify round-trips", async () => {
  await using d = await tempDir();
  await packTrunk(TINY, `${d.path}/a`, quiet);
  await packTrunk(TINY, `${d.path}/b`, { ...quiet, stageBytes: 8192 });
  await Deno.mkdir(`${d.path}/shuf`);
  await shuffledCopy(`${d.path}/shuf`);
  await packTrunk(`${d.path}/shuf`, `${d.path}/c`, quiet);
  const a = await Deno.readFile(`${d.path}/a/${DATA_FILE}`);
  assert.deepEqual(await Deno.readFile(`${d.path}/b/${DATA_FILE}`), a);
  assert.deepEqual(await Deno.readFile(`${d.path}/c/${DATA_FILE}`), a);
  const [ma, mc] = [await readManifest(`${d.path}/a`), await readManifest(`${d.path}/c`)];
  assert.deepEqual(mc.layer, ma.layer);
  // 8 KB staging splits rows between buffers: the tensor checks come out the same
  assert.deepEqual((await readManifest(`${d.path}/b`)).layer, ma.layer);
  assert.equal(mc.fingerprint, ma.fingerprint);
  assert.equal(mc.sample, ma.sample);
  for (const x of ["a", "b", "c"]) {
    assert.equal((await verifyTrunk(`${d.path}/${x}`, { modelDir: TINY, log: () => {} })).regions, 16);
  }
  // The shuffled checkpoint's trunk serves the original model (same weights).
  const ref = await readReference(`${TINY}/reference.json`);
  const out = await k3([
    "run",
    TINY,
    "--ids",
    await ids(),
    "--gen",
    "6",
    "--trunk",
    `${d.path}/c`,
    "--trunk-gb",
    "0.0006",
    "--cache-gb",
    "0.0001",
    "--json",
  ]);
  assert.equal(out.code, 0, out.stderr);
  assert.deepEqual(jsonIds(out.stdout), ref.generated_ids.slice(0, 6));
});

Deno.test("k3 pack CLI: packs, verifies, leaves an identical trunk alone, refuses a different one without --force", async () => {
  await using d = await tempDir();
  const t = `${d.path}/trunk`;
  let out = await k3(["pack", TINY, t]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, /pack: .*MB\/s/);
  out = await k3(["pack", "--verify", t, TINY]);
  assert.equal(out.code, 0, out.stderr);
  assert.equal(out.stdout.trim(), "ok");
  out = await k3(["pack", TINY, t]);
  assert.equal(out.code, 0);
  assert.match(out.stderr, /nothing to do/);
  // A different model into the same directory.
  await python("gen_model.py", [`${d.path}/other`, "--preset", "tiny", "--layers", "5", "--seed", "3"]);
  out = await k3(["pack", `${d.path}/other`, t]);
  assert.equal(out.code, 1);
  assert.match(out.stderr, /different model.*--force/);
  out = await k3(["pack", `${d.path}/other`, t, "--force"]);
  assert.equal(out.code, 0, out.stderr);
  assert.equal((await readManifest(t)).layers, 5);
  // No temporary files left behind.
  assert.deepEqual([...Deno.readDirSync(t)].map((e) => e.name).sort(), [MANIFEST_FILE, DATA_FILE].sort());
});

Deno.test("k3 pack CLI: usage errors exit 2", async () => {
  for (
    const args of [["pack"], ["pack", TINY], ["pack", "--verify"], ["pack", "a", "b", "c"], [
      "pack",
      "--bogus",
      "a",
      "b",
    ], ["pack", "--verify", "--force", "x"]]
  ) {
    const out = await k3(args);
    assert.equal(out.code, 2, `${args.join(" ")}: ${out.stderr}`);
  }
});

Deno.test("a damaged or foreign trunk is refused with exit 1: flipped byte, truncated data, other model's manifest, other weights, no manifest", async () => {
  await using d = await tempDir();
  const t = `${d.path}/trunk`;
  await packTrunk(TINY, t, quiet);
  const m = await readManifest(t);
  const data = await Deno.readFile(`${t}/${DATA_FILE}`);
  // What `k3 run TINY --ids 5,17,300 --gen 2 --trunk <trunk> [budget]` does, in-process.
  const run = (trunk: string, budget: MemoryOptions = {}) =>
    runIds(TINY, [5, 17, 300], 2, { trunkDir: trunk, ...budget });
  /** `--trunk-gb 0.0006 --cache-gb 0.0001`: layer 7 on is streamed. */
  const STREAMED = { trunkGB: 0.0006, cacheGB: 0.0001 };

  // A flipped byte in the middle of layer 5: caught when pinned (piece checksums) and by --verify.
  const flip = `${d.path}/flip`;
  await Deno.mkdir(flip);
  await Deno.copyFile(`${t}/${MANIFEST_FILE}`, `${flip}/${MANIFEST_FILE}`);
  const bad = data.slice();
  bad[m.layer[5].offset + 3000] ^= 0x10;
  await Deno.writeFile(`${flip}/${DATA_FILE}`, bad);
  await assertRejectsLast(run(flip), 1, /layer 5: checksum mismatch/);
  await assertRejectsLast(verifyPacked(flip), 1, /layer 5: checksum mismatch/);
  // A flipped byte in a streamed layer's first page (its first vector): caught when the
  // layer is handed out.
  const bad2 = data.slice();
  bad2[m.layer[7].offset + 100] ^= 0x01;
  await Deno.writeFile(`${flip}/${DATA_FILE}`, bad2);
  await assertRejectsLast(
    run(flip, STREAMED),
    1,
    /layer 7 \(streamed\): tensor layers\.7\.[a-z_.]+: checksum mismatch/,
  );
  // A manifest whose tensor check does not fit its (sound) bytes: --verify and a streamed
  // run name the tensor.
  await Deno.writeFile(`${flip}/${DATA_FILE}`, data);
  const forged = structuredClone(m);
  const victim = forged.layer[9].tensors.find((x) => x.keep === "matrix")!;
  victim.check = victim.check.replace(/^./, (c) => (c === "0" ? "1" : "0"));
  await Deno.writeTextFile(`${flip}/${MANIFEST_FILE}`, JSON.stringify(forged));
  await assertRejectsLast(
    verifyPacked(flip),
    1,
    new RegExp(`layer 9: tensor ${victim.name.replaceAll(".", "\\.")}: checksum mismatch`),
  );
  await assertRejectsLast(
    run(flip, STREAMED),
    1,
    new RegExp(`layer 9 \\(streamed\\): tensor ${victim.name.replaceAll(".", "\\.")}: checksum`),
  );
  await Deno.copyFile(`${t}/${MANIFEST_FILE}`, `${flip}/${MANIFEST_FILE}`);

  // Truncated data file.
  const trunc = `${d.path}/trunc`;
  await Deno.mkdir(trunc);
  await Deno.copyFile(`${t}/${MANIFEST_FILE}`, `${trunc}/${MANIFEST_FILE}`);
  await Deno.writeFile(`${trunc}/${DATA_FILE}`, data.subarray(0, data.length - 8192));
  await assertRejectsLast(run(trunc, STREAMED), 1, /truncated/);
  await assertRejectsLast(verifyPacked(trunc), 1, /truncated/);

  // A manifest (and data) from another model: another shape, and the same shape with other weights.
  for (
    const [name, args, why] of [["shape", ["--layers", "5"], /different model/], [
      "weights",
      ["--seed", "9"],
      /different weights/,
    ]] as const
  ) {
    const other = `${d.path}/model-${name}`;
    await python("gen_model.py", [other, "--preset", "tiny", ...args]);
    await packTrunk(other, `${other}-trunk`, quiet);
    await assertRejectsLast(run(`${other}-trunk`), 1, why);
    await assertRejectsLast(verifyPacked(`${other}-trunk`, TINY), 1, /./);
  }

  // An interrupted pack (data under its temporary name, no manifest) is not a trunk.
  const partial = `${d.path}/partial`;
  await Deno.mkdir(partial);
  await Deno.writeFile(`${partial}/${DATA_FILE}.partial`, data);
  await assertRejectsLast(run(partial), 1, /not a packed trunk/);
  // ... and a corrupt manifest is refused with a clear message.
  await Deno.writeTextFile(`${partial}/${MANIFEST_FILE}`, '{"format":"k3-trunk","version":99}');
  await assertRejectsLast(run(partial), 1, /version 99/);
});

Deno.test("pack: a disk too small is refused before the first byte, and no empty trunk directory is left", async () => {
  await using tmp = await tempDir();
  const mount = await new Deno.Command("mount", { args: ["-t", "tmpfs", "-o", "size=256k", "tmpfs", tmp.path] })
    .output();
  if (mount.code !== 0) {
    console.error("pack_test: tmpfs mount failed (not root?); the free-space refusal is not checked here");
    return;
  }
  try {
    const trunk = `${tmp.path}/trunk`;
    const out = await k3(["pack", TINY, trunk]);
    assert.equal(out.code, 1, out.stderr);
    assert.match(
      out.stderr,
      /^k3: pack: the trunk needs [\d.]+ GB in \S+\/trunk, its disk has 0\.000 GB free; free space or choose another directory \(nothing was written\)$/m,
    );
    assert.throws(() => Deno.statSync(trunk), Deno.errors.NotFound);
  } finally {
    await new Deno.Command("umount", { args: [tmp.path] }).output();
  }
});
