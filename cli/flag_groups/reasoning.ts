/**
 * The reasoning flag (`--reasoning-budget`) of `k3 serve` and `k3 batch`: the default
 * reasoning budget of chat requests that give no `max_reasoning_tokens`; `k3 chat` reads
 * its own `--reasoning-budget` with the same reader.
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import type { FlagGroup } from "../flags.ts";

/** The reasoning group. */
export const REASONING_GROUP: FlagGroup = {
  name: "reasoning",
  title: "reasoning",
  flags: {
    "reasoning-budget": {
      type: "string",
      value: "N",
      help: `close a reply's think channel after N tokens (forced markup, then the
response) when the request gives no max_reasoning_tokens; default: none
(a forced call or a response format: half of max_tokens at most)`,
    },
  },
};

/** --reasoning-budget: a whole number of tokens, or undefined; anything else is a usage error. */
export function reasoningBudgetOption(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(Number(value))) {
    throw usageError(`--reasoning-budget: expected a whole number of tokens, got ${JSON.stringify(value)}`);
  }
  return Number(value);
}
