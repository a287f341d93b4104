// A split-coded trunk (k3 pack --codec split) runs to the same tokens and logits as the raw
// one at every budget; a flipped byte in a coded piece is refused like any other; pack
// --verify checks both forms; a version-4 trunk still opens.
import assert from "node:assert/strict";
import { packTrunk } from "../../pack/pack.ts";
import { DATA_FILE, MANIFEST_FILE, readManifest } from "../../engine/weights/manifest.ts";
import { pieceSpans } from "../../engine/weights/trunk_geometry.ts";
import { keptCoded } from "../../engine/weights/trunk_geometry.ts";
import { jsonIds, k3, packedFloor, tempDir, TINY } from "../helpers.ts";

const PIECE = 64 << 10; // several pieces a layer, so one layer holds coded and raw pieces
const quiet = { log: null };

/** A 2-token run on `trunk` at the floor budget `floor` (a corrupt trunk's: it must stop). */
function floorRun(trunk: string, floor: { trunkGB: number; cacheGB: number }) {
  return k3([
    "run",
    TINY,
    "--ids",
    "5,17,300",
    "--gen",
    "2",
    "--trunk",
    trunk,
    "--trunk-gb",
    String(floor.trunkGB),
    "--cache-gb",
    String(floor.cacheGB),
  ]);
}

/** Ids and logits of a 6-token run on `trunk` with the budget flags `budget`. */
async function tokens(dir: string, trunk: string, budget: string[], tag: string, env?: Record<string, string>) {
  const logits = `${dir}/${tag}.f32`;
  const report = `${dir}/${tag}.json`;
  const out = await k3([
    "run",
    TINY,
    "--ids",
    "5,17,300",
    "--gen",
    "6",
    "--json",
    "--trunk",
    trunk,
    "--dump-logits",
    logits,
    "--out",
    report,
    ...budget,
  ], { env });
  assert.equal(out.code, 0, out.stderr);
  const leftCoded: number = JSON.parse(await Deno.readTextFile(report)).trunk_bytes_left_coded;
  return { ids: jsonIds(out.stdout), logits: await Deno.readFile(logits), stderr: out.stderr, leftCoded };
}

Deno.test("codec: the split-coded trunk gives the raw trunk's tokens and logits, resident, pinned, at the floor and with ultra", async () => {
  await using d = await tempDir();
  const raw = `${d.path}/raw`, split = `${d.path}/split`;
  const { floor } = await packedFloor(TINY, raw, PIECE);
  await packTrunk(TINY, split, { ...quiet, pieceBytes: PIECE, codec: "split" });
  const m = await readManifest(split);
  assert.equal(m.codec, "split");
  const spans = m.layer.flatMap((r) => pieceSpans(r, m.piece));
  const coded = spans.filter((s) => s.stored < s.len).length;
  assert.ok(coded > 0 && coded < spans.length, `some pieces coded, some raw (${coded} of ${spans.length})`);
  assert.ok(m.data.bytes < (await readManifest(raw)).data.bytes, "the coded trunk is smaller");
  const budgets: [string, string[]][] = [
    ["resident", []],
    ["half pinned", ["--trunk-gb", String(floor.trunkGB * 6), "--cache-gb", String(floor.cacheGB * 4)]],
    ["floor", ["--trunk-gb", String(floor.trunkGB), "--cache-gb", String(floor.cacheGB)]],
    ["ultra", ["--preset", "ultra"]],
  ];
  for (const [name, budget] of budgets) {
    const a = await tokens(d.path, raw, budget, `raw-${name}`);
    const b = await tokens(d.path, split, budget, `split-${name}`);
    assert.deepEqual(b.ids, a.ids, `${name}: tokens`);
    assert.ok(a.logits.length > 0 && a.logits.every((x, i) => x === b.logits[i]), `${name}: logits bit for bit`);
  }
});

Deno.test("codec: pieces left coded for the product (16 KB pieces, inside the tiny model's matrices) give the raw trunk's tokens and logits streamed, and so does decoding them on the I/O threads", async () => {
  await using d = await tempDir();
  const SMALL = 16 << 10; // 4 blocks: coded smaller, and small enough to lie inside one matrix
  const raw = `${d.path}/raw`, split = `${d.path}/split`;
  const { floor } = await packedFloor(TINY, raw, SMALL);
  await packTrunk(TINY, split, { ...quiet, pieceBytes: SMALL, codec: "split" });
  const m = await readManifest(split);
  const kept = m.layer.reduce((a, r) => a + keptCoded(r, m.piece).reduce((x, y) => x + y, 0), 0);
  const pieces = m.layer.reduce((a, r) => a + pieceSpans(r, m.piece).length, 0);
  assert.ok(kept > 0 && kept < pieces, `some pieces left coded, some not (${kept} of ${pieces})`);
  const budgets: [string, string[]][] = [
    ["half pinned", ["--trunk-gb", String(floor.trunkGB * 6), "--cache-gb", String(floor.cacheGB * 4)]],
    ["floor", ["--trunk-gb", String(floor.trunkGB), "--cache-gb", String(floor.cacheGB)]],
  ];
  for (const [name, budget] of budgets) {
    const a = await tokens(d.path, raw, budget, `raw-${name}`);
    const b = await tokens(d.path, split, budget, `split-${name}`);
    const c = await tokens(d.path, split, budget, `split-io-${name}`, { K3_TRUNK_DECODE: "io" });
    assert.ok(b.leftCoded > 0, `${name}: the product decoded pieces left coded (${b.leftCoded} bytes)`);
    assert.equal(c.leftCoded, 0, `${name}: K3_TRUNK_DECODE=io decodes every piece as it lands`);
    for (const [how, x] of [["product", b], ["I/O threads", c]] as const) {
      assert.deepEqual(x.ids, a.ids, `${name}, decoded by the ${how}: tokens`);
      assert.ok(
        a.logits.length > 0 && a.logits.every((v, i) => v === x.logits[i]),
        `${name}, ${how}: logits bit for bit`,
      );
    }
  }
  // A flipped low byte in a piece left coded is refused by the product's check.
  const layer = m.layer.findIndex((r) => keptCoded(r, m.piece).some((x) => x === 1));
  const j = keptCoded(m.layer[layer], m.piece).indexOf(1);
  const s = pieceSpans(m.layer[layer], m.piece)[j];
  const data = await Deno.readFile(`${split}/${DATA_FILE}`);
  data[s.file + s.stored - 600] ^= 0x10;
  const flip = `${d.path}/flip`;
  await Deno.mkdir(flip);
  await Deno.copyFile(`${split}/${MANIFEST_FILE}`, `${flip}/${MANIFEST_FILE}`);
  await Deno.writeFile(`${flip}/${DATA_FILE}`, data);
  const out = await floorRun(flip, floor);
  assert.equal(out.code, 1, out.stderr);
  assert.match(out.stderr, new RegExp(`layer ${layer} \\(streamed\\): tensor .*checksum mismatch`));
  assert.doesNotMatch(out.stderr, /^\s+at /m, "no stack trace");
});

Deno.test("codec: a flipped byte in a coded piece is refused pinned, streamed and by pack --verify (both forms)", async () => {
  await using d = await tempDir();
  const t = `${d.path}/split`;
  const { floor } = await packedFloor(TINY, `${d.path}/raw`, PIECE);
  await packTrunk(TINY, t, { ...quiet, pieceBytes: PIECE, codec: "split" });
  const m = await readManifest(t);
  const data = await Deno.readFile(`${t}/${DATA_FILE}`);
  const L = 7;
  const s = pieceSpans(m.layer[L], m.piece).find((x) => x.stored < x.len)!;
  assert.ok(s, `layer ${L} has a coded piece`);
  const flip = `${d.path}/flip`;
  await Deno.mkdir(flip);
  await Deno.copyFile(`${t}/${MANIFEST_FILE}`, `${flip}/${MANIFEST_FILE}`);
  // In the padding after the header, in a block's low bytes, and in its last byte (an escape
  // or a low byte): each must stop the run, pinned or streamed.
  for (const at of [1000, s.stored - 20000, s.stored - 1]) {
    const bad = data.slice();
    bad[s.file + at] ^= 0x04;
    await Deno.writeFile(`${flip}/${DATA_FILE}`, bad);
    let out = await k3(["run", TINY, "--ids", "5,17,300", "--gen", "2", "--trunk", flip]);
    assert.equal(out.code, 1, `pinned, byte ${at}: ${out.stderr}`);
    assert.match(out.stderr, new RegExp(`layer ${L}: checksum mismatch in piece`));
    out = await floorRun(flip, floor);
    assert.equal(out.code, 1, `streamed, byte ${at}: ${out.stderr}`);
    assert.match(out.stderr, new RegExp(`layer ${L} \\(streamed\\)`));
    assert.doesNotMatch(out.stderr, /^\s+at /m, "no stack trace");
    out = await k3(["pack", "--verify", flip]);
    assert.equal(out.code, 1);
    assert.match(out.stderr, new RegExp(`layer ${L}: checksum mismatch in piece \\d+ \\(stored form`));
  }
  const out = await k3(["pack", "--verify", t, TINY]);
  assert.equal(out.code, 0, out.stderr);
});

Deno.test("codec: a version-4 trunk (every piece raw, no stored table) still opens and gives the same tokens", async () => {
  await using d = await tempDir();
  const t = `${d.path}/raw`;
  const { floor } = await packedFloor(TINY, t, PIECE);
  const v4 = `${d.path}/v4`;
  await Deno.mkdir(v4);
  await Deno.copyFile(`${t}/${DATA_FILE}`, `${v4}/${DATA_FILE}`);
  const j = JSON.parse(await Deno.readTextFile(`${t}/${MANIFEST_FILE}`));
  j.version = 4;
  delete j.codec;
  for (const r of [...j.layer, j.finals, j.embed, j.head]) {
    delete r.stored;
    delete r.storedPieces;
  }
  await Deno.writeTextFile(`${v4}/${MANIFEST_FILE}`, JSON.stringify(j));
  const budget = ["--trunk-gb", String(floor.trunkGB), "--cache-gb", String(floor.cacheGB)];
  const a = await tokens(d.path, t, budget, "v5");
  const b = await tokens(d.path, v4, budget, "v4");
  assert.deepEqual(b.ids, a.ids);
  const out = await k3(["pack", "--verify", v4]);
  assert.equal(out.code, 0, out.stderr);
  // Version 3 is still refused with the advice to re-pack.
  j.version = 3;
  await Deno.writeTextFile(`${v4}/${MANIFEST_FILE}`, JSON.stringify(j));
  const old = await k3(["run", TINY, "--ids", "5", "--gen", "1", "--trunk", v4]);
  assert.equal(old.code, 1);
  assert.match(old.stderr, /version 3, this k3 reads versions 4 and 5.*re-pack/);
});

Deno.test("codec: k3 pack --codec takes auto, raw or split (a usage error otherwise)", async () => {
  await using d = await tempDir();
  let out = await k3(["pack", TINY, `${d.path}/t`, "--codec", "zip"]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /--codec "zip": expected auto, raw or split/);
  out = await k3(["pack", TINY, `${d.path}/t`, "--codec", "auto"]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, /codec auto: decode [\d.]+ GB\/s on \d+ threads, disk .*: (split|raw)/);
  const m = await readManifest(`${d.path}/t`);
  assert.ok(m.codec === "split" || m.codec === "raw");
});
