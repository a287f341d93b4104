/**
 * The generation flags of `k3 run` and `k3 batch` (`--gen`, `--incremental`,
 * `--full-recompute`, `--stop-id`, `--stop`), read together with the model group.
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import type { FlagGroup } from "../flags.ts";
import { intFlag } from "../common.ts";
import { DEFAULTS, MAX_TOKENS, stopStrings } from "../request.ts";
import { type ModelFlags, modelFlags } from "./model.ts";

/** The generation group. */
export const GENERATION_GROUP: FlagGroup = {
  name: "generation",
  title: "generation",
  flags: {
    gen: { type: "string", short: "n", value: "N", help: "tokens to generate (default 8, 1..4096)" },
    incremental: { type: "boolean", help: "carry KDA/conv state and the MLA cache between steps (the default)" },
    "full-recompute": {
      type: "boolean",
      help: "recompute the whole sequence every step instead (same tokens, slower)",
    },
    "stop-id": {
      type: "string",
      multiple: true,
      value: "ID",
      help: "stop after this id (repeatable; none by default)",
    },
    stop: {
      type: "string",
      multiple: true,
      value: "TEXT",
      help: "stop when the generated text contains TEXT, which is not emitted\n" +
        "(repeatable; matched across token boundaries; needs a tokenizer)",
    },
  },
};

/** Parsed generation options (with the model group's). */
export interface GenerationOptions extends ModelFlags {
  /** Tokens to generate at most. */
  gen: number;
  /** Carry state between steps (false: --full-recompute). */
  incremental: boolean;
  /** --stop-id values, checked against the vocabulary later. */
  stopIds: string[];
  /** Stop strings. */
  stops: string[];
}

/** Reads the generation and model groups (`minGen` 0: a prompt-only run is allowed). */
export function generationOptions(values: Record<string, unknown>, minGen = 1): GenerationOptions {
  if (values.incremental && values["full-recompute"]) {
    throw usageError("--incremental and --full-recompute conflict: choose one");
  }
  return {
    gen: intFlag("gen", values.gen as string | undefined, DEFAULTS.run.maxTokens, minGen, MAX_TOKENS),
    incremental: !values["full-recompute"],
    stopIds: (values["stop-id"] as string[] | undefined) ?? [],
    stops: stopStrings(values.stop as string[] | undefined),
    ...modelFlags(values),
  };
}
