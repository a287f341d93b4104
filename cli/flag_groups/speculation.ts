/**
 * The speculation flag (`--draft`) of `k3 run`, `k3 batch` and `k3 serve`.
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import { DRAFT_MODES, type DraftMode } from "../../engine/generate/draft.ts";
import type { FlagGroup } from "../flags.ts";

/** The speculation group. */
export const SPECULATION_GROUP: FlagGroup = {
  name: "speculation",
  title: "speculation (never changes a token)",
  flags: {
    draft: {
      type: "string",
      value: "MODE",
      help: `lookup (n-gram prompt lookup), suffix (the longest earlier match of
the text so far, and of recent finished sequences) or off; default:
suffix, as many draft tokens per pass as the measured acceptance and
pass cost say pay (none where drafting does not pay)`,
    },
  },
};

/** --draft: one of the draft modes (default suffix); anything else is a usage error. */
export function draftOption(value: string | undefined): DraftMode {
  if (value === undefined) return "suffix";
  if (!(DRAFT_MODES as readonly string[]).includes(value)) {
    throw usageError(`--draft: expected one of ${DRAFT_MODES.join(", ")}, got ${JSON.stringify(value)}`);
  }
  return value as DraftMode;
}
