/**
 * What the bench/ scripts share: their command-line flags (`--help` prints the script's
 * usage, exit 0; a mistake is one line naming it with the usage, exit 2, never a stack
 * trace) and the median they report.
 *
 * @module
 */

import { parseArgs, type ParseArgsConfig } from "node:util";

/** Parses `Deno.args` for a bench script whose usage line is `usage`. */
export function benchArgs<T extends NonNullable<ParseArgsConfig["options"]>>(
  usage: string,
  options: T,
  allowPositionals = false,
) {
  const all = { ...options, help: { type: "boolean", short: "h" } } as const;
  try {
    const parsed = parseArgs({ args: Deno.args, options: all, allowPositionals, strict: true });
    if ((parsed.values as { help?: boolean }).help) {
      console.log(usage);
      Deno.exit(0);
    }
    return parsed;
  } catch (e) {
    console.error(`${(e as Error).message.split("\n")[0].replace(/\. To specify a positional.*$/, "")}\n${usage}`);
    Deno.exit(2);
  }
}

/** The median of `xs` (the mean of the two middle values of an even count). */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}
