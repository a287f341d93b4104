/** Fuzz: the packed trunk's manifest.json (parseManifest + checkLayout) on structure-aware mutations of a real one. */

import assert from "node:assert/strict";
import { checkLayout, parseManifest, type TrunkManifest } from "../../engine/weights/manifest.ts";
import { loadConfig } from "../../engine/model/config.ts";
import { packTrunk } from "../../pack/pack.ts";
import { assertRefusal, check, jsonMutations, mutateAll } from "./fuzz.ts";
import { tempDir, TINY } from "../helpers.ts";

/** What the engine binds from a manifest: every region's place and tensor table. */
const layout = (m: TrunkManifest) =>
  JSON.stringify([
    m.data.file,
    m.data.bytes,
    ...[...m.layer, m.finals, m.embed, m.head].map((r) => [
      r.offset,
      r.size,
      r.bytes,
      r.pieces.length,
      r.tensors.map((t) => [t.name, t.dtype, t.keep, t.shape, t.offset, t.bytes]),
    ]),
  ]); // Not compared: unknown extra keys (ignored) and `piece` (any size giving the same
// number of pieces reads and verifies the same bytes).

Deno.test("fuzz trunk manifest: refused with exit 1 and one line, or accepted with exactly the clean layout", async () => {
  await using d = await tempDir();
  const { manifest } = await packTrunk(TINY, `${d.path}/t`, { log: null });
  const cfg = await loadConfig(TINY);
  const clean = JSON.parse(JSON.stringify(manifest));
  const ref = layout(manifest);
  check("trunk manifest", jsonMutations, (ms) => {
    const text = JSON.stringify(mutateAll(clean, ms));
    let m;
    try {
      m = parseManifest(text, "manifest.json");
      checkLayout(m, cfg, "trunk");
    } catch (e) {
      return assertRefusal(e, [1]);
    }
    // Accepted: what the engine would bind is the clean layout (a changed hash string is
    // caught by the read it describes, not here).
    assert.equal(layout(m), ref);
  });
});
