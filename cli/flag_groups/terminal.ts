/**
 * The terminal flags (`--quiet`, `--verbose`, `--color`) of the commands that print while
 * they generate (run, chat); progress.ts's outputMode reads them.
 *
 * @module
 */

import type { FlagGroup } from "../flags.ts";

/** The terminal group. */
export const TERMINAL_GROUP: FlagGroup = {
  name: "terminal",
  title: "terminal",
  flags: {
    quiet: { type: "boolean", short: "q", help: "stderr: errors only (no plan, progress, table or summary)" },
    verbose: {
      type: "boolean",
      help: "stderr: also the per-step table (printed by default only when stderr\nis not a terminal, i.e. in logs)",
    },
    color: {
      type: "string",
      value: "WHEN",
      help: "auto (default: on a terminal, unless NO_COLOR is set), always, never",
    },
  },
};
