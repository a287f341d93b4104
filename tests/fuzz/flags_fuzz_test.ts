/** Fuzz: command-line flags of run/batch (parseFlags, generationOptions, memoryOptions, promptSource). */

import assert from "node:assert/strict";
import fc from "fast-check";
import {
  GENERATION_FLAGS,
  generationOptions,
  MEMORY_FLAGS,
  memoryOptions,
  parseFlags,
  promptSource,
} from "../../cli/run_options.ts";
import { assertRefusal, check } from "./fuzz.ts";

const NAMES = [...Object.keys(GENERATION_FLAGS), ...Object.keys(MEMORY_FLAGS), "prompt", "ids", "prompt-file", "bogus"];
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
  const options = {
    ...GENERATION_FLAGS,
    ...MEMORY_FLAGS,
    prompt: { type: "string" as const },
    ids: { type: "string" as const },
    "prompt-file": { type: "string" as const },
  };
  check("flags", fc.array(arg, { maxLength: 6 }), (parts) => {
    const args = parts.flat();
    try {
      const { values, tokens } = parseFlags("run", args, options);
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
