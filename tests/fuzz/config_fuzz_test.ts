/** Fuzz: config.json (engine/model/config.ts parseConfig) on structure-aware mutations of the real file. */

import assert from "node:assert/strict";
import { parseConfig } from "../../engine/model/config.ts";
import { assertRefusal, check, jsonMutations, mutateAll } from "./fuzz.ts";
import { TINY } from "../helpers.ts";

Deno.test("fuzz config.json: refused with exit 2 and one line, or accepted with every size in range", () => {
  const clean = JSON.parse(Deno.readTextFileSync(`${TINY}/config.json`));
  const ref = parseConfig(clean);
  check("config", jsonMutations, (ms) => {
    const mutated = mutateAll(clean, ms);
    let cfg;
    try {
      cfg = parseConfig(mutated);
    } catch (e) {
      return assertRefusal(e, [2]);
    }
    assert.equal(cfg.layerKinds.length, cfg.numLayers);
    assert.ok(cfg.numLayers >= 1 && cfg.numLayers <= 4096);
    for (const v of [cfg.hiddenSize, cfg.vocabSize, cfg.moe.numExperts, cfg.moe.latent, cfg.mla.qLoraRank]) {
      assert.ok(Number.isSafeInteger(v) && v >= 1 && v <= 1 << 22, `size ${v}`);
    }
    assert.ok(cfg.moe.topK <= cfg.moe.numExperts && cfg.bosId < cfg.vocabSize && cfg.eosId < cfg.vocabSize);
    if (JSON.stringify(mutated) === JSON.stringify(clean)) assert.deepEqual(cfg, ref);
  });
});
