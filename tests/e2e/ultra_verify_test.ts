/**
 * At `--preset ultra` the embedding rows and lm_head chunks streamed from a packed
 * trunk are verified too (whole pieces, each against the manifest): a flip in an embedding
 * row or in an lm_head chunk stops the run (exit 1), and the verified reads give the same
 * tokens as the resident model. Hidden 96 (192-byte rows: rows straddle 4 KiB pieces) and
 * 16 KiB head chunks (K3_TEST_HEAD_CHUNK) so rows straddle chunks too.
 *
 * @module
 */

import assert from "node:assert/strict";
import { packTrunk } from "../../pack/pack.ts";
import { DATA_FILE, MANIFEST_FILE } from "../../engine/weights/manifest.ts";
import { jsonIds, k3, python, tempDir } from "../helpers.ts";

const PROMPT = ["--ids", "5,21,300,77", "--gen", "6"];
const ENV = { env: { K3_TEST_HEAD_CHUNK: "16384" } };

Deno.test("ultra: streamed embedding rows and lm_head chunks are verified; same tokens as resident", async () => {
  await using d = await tempDir();
  const model = `${d.path}/m`, t = `${d.path}/t`, flip = `${d.path}/flip`;
  await python("gen_model.py", [model, "--layers", "3", "--hidden", "96", "--seed", "5"]);
  const { manifest: m } = await packTrunk(model, t, { log: null, pieceBytes: 4096 });
  const resident = await k3(["run", model, ...PROMPT, "--json"]);
  assert.equal(resident.code, 0, resident.stderr);
  const ultra = await k3(["run", model, ...PROMPT, "--json", "--trunk", t, "--preset", "ultra"], ENV);
  assert.equal(ultra.code, 0, ultra.stderr);
  assert.match(ultra.stderr, /embed\+head .*streamed/);
  assert.deepEqual(jsonIds(ultra.stdout), jsonIds(resident.stdout));
  // the default chunking too (the whole tiny head in one chunk)
  const one = await k3(["run", model, ...PROMPT, "--json", "--trunk", t, "--preset", "ultra"]);
  assert.deepEqual(jsonIds(one.stdout), jsonIds(resident.stdout));

  const data = await Deno.readFile(`${t}/${DATA_FILE}`);
  await Deno.mkdir(flip);
  await Deno.copyFile(`${t}/${MANIFEST_FILE}`, `${flip}/${MANIFEST_FILE}`);
  const row = 96 * 2;
  const cases: [string, number, RegExp][] = [
    // prompt token 21's row straddles pieces 0 and 1 (bytes 4032..4224): flip its last
    // byte; token 300's row is inside piece 14
    ["embedding row across pieces", m.embed.offset + 22 * row - 1, /embed \(streamed\): checksum mismatch in piece 1 /],
    ["embedding row", m.embed.offset + 300 * row + 7, /embed \(streamed\): checksum mismatch in piece 14 /],
    // a head row in the middle of chunk 5 (16 KiB chunks), and one straddling chunks 1 and 2
    ["lm_head chunk", m.head.offset + 5 * 16384 + 5000, /head \(streamed\): checksum mismatch in piece 21 /],
    ["lm_head row across chunks", m.head.offset + 2 * 16384 + 3, /head \(streamed\): checksum mismatch in piece 8 /],
  ];
  for (const [what, at, why] of cases) {
    const bad = data.slice();
    bad[at] ^= 0x08;
    await Deno.writeFile(`${flip}/${DATA_FILE}`, bad);
    const out = await k3(["run", model, ...PROMPT, "--trunk", flip, "--preset", "ultra"], ENV);
    assert.equal(out.code, 1, `${what}: ${out.stderr}`);
    assert.equal(out.stdout.trim(), "", what);
    const last = out.stderr.trim().split("\n").at(-1)!;
    assert.match(last, /^k3: /, what);
    assert.match(last, why, `${what}: ${last}`);
  }
});
