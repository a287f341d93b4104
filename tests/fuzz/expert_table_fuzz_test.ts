/** Fuzz: the expert table experts.json (parseExpertTable + checkExpertTable) on structure-aware mutations of a real one. */

import assert from "node:assert/strict";
import { checkExpertTable, parseExpertTable } from "../../engine/weights/expert_table.ts";
import { configFingerprint, loadConfig } from "../../engine/model/config.ts";
import { packTrunk } from "../../pack/pack.ts";
import { hashExperts } from "../../pack/experts.ts";
import { assertRefusal, check, jsonMutations, mutateAll } from "./fuzz.ts";
import { tempDir, TINY } from "../helpers.ts";

Deno.test("fuzz expert table: refused with exit 1 and one line, or accepted with the clean table's shape and identity", async () => {
  await using d = await tempDir();
  await packTrunk(TINY, `${d.path}/t`, { log: null });
  const clean = await hashExperts(TINY, `${d.path}/t`, () => {});
  const cfg = await loadConfig(TINY);
  const fp = await configFingerprint(cfg);
  const shape = (t: typeof clean) =>
    JSON.stringify([t.fingerprint, t.sample, t.layers, t.experts, t.first, t.digests.map((s) => s.length)]);
  const ref = shape(clean);
  check("expert table", jsonMutations, (ms) => {
    const text = JSON.stringify(mutateAll(clean, ms));
    let t;
    try {
      t = parseExpertTable(text, "experts.json");
      checkExpertTable(t, cfg, fp, clean.sample, "experts.json");
    } catch (e) {
      return assertRefusal(e, [1]);
    }
    // Accepted: the same model, sizes and one 16-hex digest per expert (a changed digest
    // is caught by the read it describes, not here).
    assert.equal(shape(t), ref);
    for (const [L, s] of t.digests.entries()) assert.match(s, L < t.first ? /^$/ : /^[0-9a-f]+$/);
  });
});
