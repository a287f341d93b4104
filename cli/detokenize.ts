/**
 * `k3 detokenize --tok DIR --ids 1,2,3`: prints the text of token ids.
 *
 * @module
 */

import { usageError } from "../engine/errors.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { parseIds } from "./common.ts";
import { type CommandFlags, commandFlags } from "./flags.ts";
import { type Output, stdout, TOKENIZER_DIR_FLAG } from "./tokenize.ts";

/** `k3 detokenize`'s flags and help. */
export const DETOKENIZE_FLAGS: CommandFlags = commandFlags({
  name: "detokenize",
  head: `usage: k3 detokenize --tok DIR --ids 1,2,3

Prints the text of comma-separated token ids (bytes that are not valid UTF-8 print as U+FFFD).`,
  groups: [{
    name: "detokenize",
    title: "",
    column: 17,
    flags: {
      tok: TOKENIZER_DIR_FLAG,
      ids: { type: "string", value: "LIST", help: "comma-separated token ids" },
    },
  }],
  tail: `example:
  k3 detokenize --tok tests/fixtures/tiny --ids 313,323,330,379,299`,
});

/** Runs `k3 detokenize`; returns the exit code, throws K3Error on failure. */
export async function main(args: string[], out: Output = stdout): Promise<number> {
  const flags = DETOKENIZE_FLAGS.parse(args, false);
  const opts = { tok: flags.str("tok"), ids: flags.str("ids") };
  if (flags.bool("help")) {
    out.write(DETOKENIZE_FLAGS.usage());
    return 0;
  }
  if (opts.tok === undefined) throw usageError("detokenize: --tok DIR is required");
  if (opts.ids === undefined) throw usageError("detokenize: --ids LIST is required");
  const tokenizer = Tokenizer.load(opts.tok);
  const ids = parseIds("ids", opts.ids, tokenizer.vocabSize);
  out.write(tokenizer.decode(ids) + "\n");
  return await Promise.resolve(0);
}
