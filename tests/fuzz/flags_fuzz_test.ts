/** Fuzz: command-line flags of run/batch (parseFlags, generationOptions, memoryOptions, promptSource). */

import assert from "node:assert/strict";
import fc from "fast-check";
import { PROMPT_GROUP, promptSource } from "../../cli/run_options.ts";
import { commandFlags } from "../../cli/flags.ts";
import { GENERATION_GROUP, generationOptions } from "../../cli/flag_groups/generation.ts";
import { MODEL_GROUP } from "../../cli/flag_groups/model.ts";
import { MEMORY_GROUP, memoryOptions } from "../../cli/flag_groups/memory.ts";
import { assertRefusal, check } from "./fuzz.ts";

/** The prompt, generation, model and memory groups of `k3 run`. */
const FLAGS = commandFlags({
  name: "run",
  head: "usage: k3 run",
  groups: [PROMPT_GROUP, GENERATION_GROUP, MODEL_GROUP, MEMORY_GROUP],
  tail: "",
});
const NAMES = [...Object.keys(FLAGS.flags), "bogus"];
const VALUES = fc.oneof(
  fc.constantFrom(
    "0",
    "1",
    "-1",
    "8",
    "4097",
    "1e3",
    "0.5",
    "-0",
    "",
    " ",
    "nan",
    "Infinity",
    "9".repeat(30),
    "1,2",
    "x",
  ),
  fc.string({ maxLength: 6 }),
);
const arg = fc.oneof(
  fc.tuple(fc.constantFrom(...NAMES), VALUES).map(([n, v]) => [`--${n}`, v]),
  fc.constantFrom(...NAMES).map((n) => [`--${n}`]),
  fc.constantFrom(["-"], ["--"], ["-x"], ["positional"]),
);

Deno.test("fuzz flags: refused with exit 2 and one line, or parsed into options in range", () => {
  check("flags", fc.array(arg, { maxLength: 6 }), (parts) => {
    const args = parts.flat();
    try {
      const { values, tokens } = FLAGS.parse(args);
      const g = generationOptions(values);
      const m = memoryOptions(tokens);
      promptSource(values);
      assert.ok(Number.isInteger(g.gen) && g.gen >= 1 && g.gen <= 4096);
      for (const v of [m.trunkGB, m.cacheGB]) if (v !== undefined) assert.ok(Number.isFinite(v) && v >= 0);
    } catch (e) {
      assertRefusal(e, [2]);
    }
  });
});
