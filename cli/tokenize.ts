/**
 * `k3 tokenize --tok DIR (--text TEXT | --file PATH) [--json]`: prints the ids of a text.
 *
 * The text is user data, so added tokens such as `<|open|>` are encoded as plain bytes.
 *
 * @module
 */

import { EXIT, usageError } from "../engine/errors.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { decodeUtf8Strict } from "../engine/text/utf8.ts";
import { readInput } from "../engine/native/files.ts";
import { type CommandFlags, commandFlags } from "./flags.ts";

/** `k3 tokenize`'s flags and help. */
export const TOKENIZE_FLAGS: CommandFlags = commandFlags({
  name: "tokenize",
  head: `usage: k3 tokenize --tok DIR (--text TEXT | --file PATH) [--json]

Prints the token ids of a text, comma-separated (or a JSON array with --json).
Special tokens in the text are not recognised: they are encoded as ordinary text.`,
  groups: [{
    name: "tokenize",
    title: "",
    column: 17,
    flags: {
      tok: { type: "string", value: "DIR", help: "directory holding tiktoken.model and tokenizer_config.json" },
      text: { type: "string", value: "TEXT", help: "the text to encode" },
      file: {
        type: "string",
        value: "PATH",
        file: "input",
        help: "read the text from a file, verbatim (must be valid UTF-8)",
      },
      json: { type: "boolean", help: "print a JSON array" },
    },
  }],
  tail: `examples:
  k3 tokenize --tok tests/fixtures/tiny --text "The capital of France is"
  k3 tokenize --tok /data/kimi-k3 --file prompt.txt --json`,
});

/** Where a command writes its output; stdout unless a test passes its own. */
export interface Output {
  /** Writes text. */
  write(text: string): void;
}

/** Standard output, written fully (writeSync may write only part of a buffer). */
export const stdout: Output = {
  write(text: string) {
    const bytes = new TextEncoder().encode(text);
    for (let off = 0; off < bytes.length;) off += Deno.stdout.writeSync(bytes.subarray(off));
  },
};

/** Runs `k3 tokenize`; returns the exit code, throws K3Error on failure. */
export function main(args: string[], out: Output = stdout): Promise<number> {
  const flags = TOKENIZE_FLAGS.parse(args, false);
  const opts = { tok: flags.str("tok"), text: flags.str("text"), file: flags.str("file"), json: flags.bool("json") };
  if (flags.bool("help")) {
    out.write(TOKENIZE_FLAGS.usage());
    return Promise.resolve(0);
  }
  if (opts.tok === undefined) throw usageError("tokenize: --tok DIR is required");
  if ((opts.text === undefined) === (opts.file === undefined)) {
    throw usageError("tokenize: give exactly one of --text and --file");
  }
  let text = opts.text;
  if (opts.file !== undefined) {
    const bytes = readInput(opts.file, { what: "--file", maxBytes: 1 << 30, allowStdin: true, exitCode: EXIT.usage });
    text = decodeUtf8Strict(bytes, opts.file === "-" ? "stdin" : opts.file);
  }
  const ids = Tokenizer.load(opts.tok).encode(text!, { allowSpecial: false });
  out.write((opts.json ? JSON.stringify(ids) : ids.join(",")) + "\n");
  return Promise.resolve(0);
}
