/**
 * The memory budget flags (`--trunk`, `--trunk-gb`, `--cache-gb`, `--preset`): given again,
 * a later one overrides an earlier one, so they are read in command-line order.
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";
import { PRESETS } from "../../engine/model/presets.ts";
import type { FlagGroup } from "../flags.ts";
import { numFlag } from "../common.ts";

/** The memory group; every flag is last-wins. */
export const MEMORY_GROUP: FlagGroup = {
  name: "memory",
  title: "memory (a later flag overrides an earlier one)",
  flags: {
    trunk: {
      type: "string",
      lastWins: true,
      value: "DIR",
      help: "packed trunk from `k3 pack` (streamed layer by layer)",
    },
    "trunk-gb": {
      type: "string",
      lastWins: true,
      value: "X",
      help: "GB of trunk layers to keep pinned (fractions allowed)",
    },
    "cache-gb": {
      type: "string",
      lastWins: true,
      value: "X",
      help: "GB of routed-expert cache (at least top-k + 1 experts)",
    },
    preset: {
      type: "string",
      lastWins: true,
      value: "NAME",
      help: `${PRESETS.map((p) => p.name).join(", ")} (see k3 presets)`,
    },
  },
};

/** Reads the memory flags in order from parseArgs tokens. */
export function memoryOptions(tokens: { kind: string; name?: string; value?: string }[]): MemoryOptions {
  const mem: MemoryOptions = {};
  for (const t of tokens) {
    if (t.kind !== "option" || t.value === undefined) continue;
    switch (t.name) {
      case "trunk":
        mem.trunkDir = t.value;
        break;
      case "trunk-gb":
        mem.trunkGB = numFlag("trunk-gb", t.value, 0, 1e6);
        break;
      case "cache-gb":
        mem.cacheGB = numFlag("cache-gb", t.value, 0, 1e6);
        break;
      case "preset": {
        const p = PRESETS.find((x) => x.name === t.value);
        if (!p) {
          throw usageError(
            `--preset: unknown preset ${JSON.stringify(t.value)} (one of ${PRESETS.map((x) => x.name).join(", ")})`,
          );
        }
        mem.preset = p.name;
        if (p.name === "auto") {
          mem.trunkGB = undefined;
          mem.cacheGB = undefined;
        } else {
          mem.trunkGB = p.trunkGB;
          mem.cacheGB = p.cacheGB;
        }
        mem.streamEmbed = p.streamEmbed;
        break;
      }
    }
  }
  return mem;
}
