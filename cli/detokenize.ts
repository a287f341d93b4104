/**
 * `k3 detokenize --tok DIR --ids 1,2,3`: prints the text of token ids.
 *
 * @module
 */

import { usageError } from "../engine/errors.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { parseFlags, parseIds } from "./common.ts";
import { type Output, stdout } from "./tokenize.ts";

/** Usage text of `k3 detokenize`. */
export const USAGE = `usage: k3 detokenize --tok DIR --ids 1,2,3

Prints the text of comma-separated token ids (bytes that are not valid UTF-8 print as U+FFFD).
  --tok DIR      directory holding tiktoken.model and tokenizer_config.json
  --ids LIST     comma-separated token ids

example:
  k3 detokenize --tok tests/fixtures/tiny --ids 313,323,330,379,299
`;

/** Runs `k3 detokenize`; returns the exit code, throws K3Error on failure. */
export async function main(args: string[], out: Output = stdout): Promise<number> {
  const opts = parseFlags("detokenize", args, {
    tok: { type: "string" },
    ids: { type: "string" },
    help: { type: "boolean", short: "h" },
  }, false).values;
  if (opts.help) {
    out.write(USAGE);
    return 0;
  }
  if (opts.tok === undefined) throw usageError("detokenize: --tok DIR is required");
  if (opts.ids === undefined) throw usageError("detokenize: --ids LIST is required");
  const tokenizer = Tokenizer.load(opts.tok);
  const ids = parseIds("ids", opts.ids, tokenizer.vocabSize);
  out.write(tokenizer.decode(ids) + "\n");
  return await Promise.resolve(0);
}
