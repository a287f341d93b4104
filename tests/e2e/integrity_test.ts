/**
 * A packed trunk is never trusted. Every field of the manifest is
 * checked against the config and the region sizes (by the run and by `pack --verify`), and
 * every byte of every read piece, streamed or pinned, is verified against its checksum.
 *
 * @module
 */

import assert from "node:assert/strict";
import { packTrunk } from "../../pack/pack.ts";
import { DATA_FILE, MANIFEST_FILE, type TrunkManifest } from "../../engine/weights/manifest.ts";
import { tempDir, TINY } from "../helpers.ts";
import { assertRejectsLast, runIds, verifyPacked } from "../damage.ts";

const quiet = { log: null };
/** Budget that streams every layer of the tiny model through the ring (0 pinned):
 * `--trunk-gb 0.0003 --cache-gb 0.0001`. */
const STREAM_ALL = { trunkGB: 0.0003, cacheGB: 0.0001 };

Deno.test("trunk manifest: a tampered one is refused by the run and by pack --verify (shape, offset, keep, bytes, region)", async () => {
  await using d = await tempDir();
  const t = `${d.path}/trunk`;
  await packTrunk(TINY, t, quiet);
  const clean: TrunkManifest = JSON.parse(await Deno.readTextFile(`${t}/${MANIFEST_FILE}`));
  const tampers: [string, (m: TrunkManifest) => void][] = [
    ["layer 0 tensor 6 first dim x32", (m) => void (m.layer[0].tensors[6].shape[0] *= 32)],
    ["shape and bytes x32 together", (m) => {
      const e = m.layer[0].tensors[6];
      e.shape[0] *= 32;
      e.bytes *= 32;
    }],
    ["offset moved by 64", (m) => void (m.layer[2].tensors[8].offset += 64)],
    ["negative offset", (m) => void (m.layer[1].tensors[3].offset = -4096)],
    ["misaligned offset", (m) => void (m.layer[1].tensors[3].offset += 2)],
    ["bad keep", (m) => void (m.layer[3].tensors[2].keep = "u8" as "matrix")],
    ["negative bytes", (m) => void (m.layer[3].tensors[2].bytes = -16)],
    ["region moved", (m) => void (m.layer[4].offset += 4096)],
    ["region size shrunk", (m) => void (m.layer[4].size -= 4096)],
    ["two tensors swapped", (m) => {
      const ts = m.layer[5].tensors;
      [ts[7], ts[8]] = [ts[8], ts[7]];
    }],
    ["a vector kept as BF16", (m) => void (m.finals.tensors[0].dtype = "BF16")],
    ["a piece hash missing", (m) => void m.layer[6].pieces.pop()],
  ];
  for (const [what, tamper] of tampers) {
    const dir = `${d.path}/t`;
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await Deno.mkdir(dir);
    await Deno.copyFile(`${t}/${DATA_FILE}`, `${dir}/${DATA_FILE}`);
    const m = structuredClone(clean);
    tamper(m);
    await Deno.writeTextFile(`${dir}/${MANIFEST_FILE}`, JSON.stringify(m));
    const why = /not a usable k3 trunk manifest|does not match the model/;
    await assertRejectsLast(runIds(TINY, [5, 17, 300], 2, { trunkDir: dir }), 1, why);
    await assertRejectsLast(verifyPacked(dir, TINY), 1, why);
    // Without the model, the structure alone (what the shapes imply) refuses all but the
    // swap, which is well-formed; the model check above catches that one.
    if (what !== "two tensors swapped") await assertRejectsLast(verifyPacked(dir), 1, why);
  }
});

Deno.test("trunk pieces: a bit flip anywhere in a layer stops the run (exit 1): streamed, the tensor is named; pinned, the piece", async () => {
  await using d = await tempDir();
  const t = `${d.path}/trunk`;
  // 4 KiB pieces, so a layer has 34-61 pieces and the flip's piece is named exactly.
  const { manifest: m } = await packTrunk(TINY, t, { ...quiet, pieceBytes: 4096 });
  assert.equal(m.piece, 4096);
  const data = await Deno.readFile(`${t}/${DATA_FILE}`);
  const flip = `${d.path}/flip`;
  await Deno.mkdir(flip);
  await Deno.copyFile(`${t}/${MANIFEST_FILE}`, `${flip}/${MANIFEST_FILE}`);
  const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  // Mid-region flips (neither in the first nor in the last 4 KiB, the old cheap check) and
  // one in each kind of tensor a streamed layer is checked by: a matrix (by its product: one
  // token at a time, T = 1, or a 3-token prefill, one pass after the tiles), MLA's kv_b_proj
  // (read by absorb and expand: checked before them) and a vector (when the layer is handed
  // out).
  const cases: [number, number][] = [[1, 0.5], [6, 0.3], [10, 0.7], [12, 0.55]].map(([L, frac]) => {
    const r = m.layer[L];
    return [L, 4096 + Math.floor((r.size - 8192) * frac)];
  });
  for (const L of [1, 3]) {
    const r = m.layer[L];
    for (const want of [/kv_b_proj/, /layernorm/, /o_proj/]) {
      const e = r.tensors.find((x) => want.test(x.name));
      if (e) cases.push([L, e.offset + Math.floor(e.bytes / 3)]);
    }
  }
  assert.ok(cases.length >= 9, "the tiny model has kv_b_proj, layernorm and o_proj tensors");
  for (const [i, [L, at]] of cases.entries()) {
    const r = m.layer[L];
    // a flip in the padding between two tensors feeds no kernel: move it into the next one
    const e = r.tensors.find((x) => at < x.offset + x.bytes)!;
    const pos = Math.max(at, e.offset);
    const bad = data.slice();
    bad[r.offset + pos] ^= 0x04;
    await Deno.writeFile(`${flip}/${DATA_FILE}`, bad);
    const ids = i % 2 ? [5] : [5, 17, 300];
    await assertRejectsLast(
      runIds(TINY, ids, 2, { trunkDir: flip, ...STREAM_ALL }),
      1,
      new RegExp(`layer ${L} \\(streamed\\): tensor ${esc(e.name)}: checksum mismatch \\(manifest [0-9a-f]{16}, data `),
    );
    // Pinned (everything resident from the trunk): the pieces are checked on the pin read.
    if (i < 4) {
      const pinned = runIds(TINY, [5, 17, 300], 2, { trunkDir: flip });
      await assertRejectsLast(
        pinned,
        1,
        new RegExp(`layer ${L}: checksum mismatch in piece ${Math.floor(pos / 4096)} `),
      );
    }
  }
  // A flip in the embedding and in the head region (read and verified when resident).
  for (const r of [m.embed, m.head, m.finals]) {
    const bad = data.slice();
    bad[r.offset + Math.floor(r.bytes / 2)] ^= 0x80;
    await Deno.writeFile(`${flip}/${DATA_FILE}`, bad);
    await assertRejectsLast(
      runIds(TINY, [5, 17, 300], 2, { trunkDir: flip, ...STREAM_ALL }),
      1,
      /checksum mismatch in piece/,
    );
  }
  // The clean trunk at the same budget runs and gives the reference ids.
  await Deno.copyFile(`${t}/${DATA_FILE}`, `${flip}/${DATA_FILE}`);
  assert.equal((await runIds(TINY, [5, 17, 300], 2, { trunkDir: flip, ...STREAM_ALL })).length, 2);
});

Deno.test("trunk versions: a version 1 trunk (no piece checksums), 2 (k3h64) or 3 (no tensor checks) is refused with the advice to re-pack", async () => {
  await using d = await tempDir();
  const t = `${d.path}/trunk`;
  await packTrunk(TINY, t, quiet);
  const clean = JSON.parse(await Deno.readTextFile(`${t}/${MANIFEST_FILE}`));
  assert.equal(clean.version, 5);
  assert.equal(clean.checksum, "k3w64");
  for (const version of [1, 2, 3]) {
    const m = structuredClone(clean);
    m.version = version;
    if (version === 1) { for (const r of m.layer) delete r.pieces; }
    else if (version === 2) m.checksum = "k3h64";
    else for (const r of m.layer) for (const x of r.tensors) delete x.check;
    await Deno.writeTextFile(`${t}/${MANIFEST_FILE}`, JSON.stringify(m));
    await assertRejectsLast(
      runIds(TINY, [5], 1, { trunkDir: t }),
      1,
      new RegExp(`version ${version}, .*k3w64.*re-pack it with k3 pack --force`),
    );
    await assertRejectsLast(verifyPacked(t), 1, new RegExp(`version ${version}`));
  }
  // the checksum name is checked too
  const m = structuredClone(clean);
  m.checksum = "k3h64";
  await Deno.writeTextFile(`${t}/${MANIFEST_FILE}`, JSON.stringify(m));
  await assertRejectsLast(verifyPacked(t), 1, /checksum: expected "k3w64", got "k3h64"/);
});
