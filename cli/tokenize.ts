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
import { parseFlags } from "./common.ts";

/** Usage text of `k3 tokenize`. */
export const USAGE = `usage: k3 tokenize --tok DIR (--text TEXT | --file PATH) [--json]

Prints the token ids of a text, comma-separated (or a JSON array with --json).
  --tok DIR      directory holding tiktoken.model and tokenizer_config.json
  --text TEXT    the text to encode
  --file PATH    read the text from a file, verbatim (must be valid UTF-8)
  --json         print a JSON array
Special tokens in the text are not recognised: they are encoded as ordinary text.

examples:
  k3 tokenize --tok tests/fixtures/tiny --text "The capital of France is"
  k3 tokenize --tok /data/kimi-k3 --file prompt.txt --json
`;

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
  const opts = parseFlags("tokenize", args, {
    tok: { type: "string" },
    text: { type: "string" },
    file: { type: "string" },
    json: { type: "boolean" },
    help: { type: "boolean", short: "h" },
  }, false).values;
  if (opts.help) {
    out.write(USAGE);
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
