/**
 * The sampling flags (`--temperature`, `--top-p`, `--top-k`, `--min-p`, `--seed`) of run,
 * batch and chat, read through request.ts's one resolveSampling.
 *
 * @module
 */

import type { SamplingParams } from "../../engine/generate/sampling.ts";
import type { FlagGroup } from "../flags.ts";
import { intFlag, numFlag } from "../common.ts";
import { DEFAULTS, resolveSampling } from "../request.ts";

/** The sampling group; `dflt` says what applies without the flags (it differs by command),
 * `seedDefault` the seed without --seed. */
export function samplingGroup(dflt: string, seedDefault = "0"): FlagGroup {
  return {
    name: "sampling",
    title: `sampling (${dflt}; engine/generate/sampling.ts documents the arithmetic)`,
    flags: {
      temperature: {
        type: "string",
        value: "T",
        help: "0 = greedy (exactly the argmax); otherwise divides the logits (0..100)",
      },
      "top-p": {
        type: "string",
        value: "P",
        help: "keep the most likely tokens up to probability mass P (0 < P <= 1)",
      },
      "top-k": { type: "string", value: "K", help: "keep the K most likely tokens (0 = off)" },
      "min-p": { type: "string", value: "P", help: "drop tokens less likely than P times the most likely (0 = off)" },
      seed: {
        type: "string",
        value: "N",
        help: `seed of the generator (xoshiro128**, one per sequence; default ${seedDefault})`,
      },
    },
  };
}

/** Sampling parameters from the flags over `base` (run's row of DEFAULTS unless given). */
export function samplingOptions(
  values: Record<string, unknown>,
  base: SamplingParams = DEFAULTS.run.sampling,
): SamplingParams {
  const num = (name: string, min: number, max: number) =>
    values[name] === undefined ? undefined : numFlag(name, values[name] as string, min, max);
  const int = (name: string, max: number) =>
    values[name] === undefined ? undefined : intFlag(name, values[name] as string, 0, 0, max);
  return resolveSampling(
    {
      temperature: num("temperature", 0, 100),
      topP: num("top-p", 0, 1),
      topK: int("top-k", 1e9),
      minP: num("min-p", 0, 1),
      seed: int("seed", Number.MAX_SAFE_INTEGER),
    },
    base,
    "sampling flags",
  );
}
