/**
 * `k3 tokenize --tok DIR (--text TEXT | --file PATH | --chat REQUEST.json) [--json]`:
 * prints the ids of a text, or of an OpenAI chat request's prompt as the released encoder
 * renders it (cli/chat_render.ts).
 *
 * The text is user data, so added tokens such as `<|open|>` are encoded as plain bytes.
 *
 * @module
 */

import { EXIT, usageError } from "../engine/errors.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { decodeUtf8Strict } from "../engine/text/utf8.ts";
import { readInput } from "../engine/native/files.ts";
import { type CommandFlags, commandFlags, type Flag } from "./flags.ts";
import { renderChatBody } from "./chat_render.ts";
import { ApiError } from "./openai_error.ts";
import { parseJson } from "../engine/text/json_numbers.ts";

/** `--tok DIR`, as tokenize and detokenize take it. */
export const TOKENIZER_DIR_FLAG: Flag = {
  type: "string",
  value: "DIR",
  help: "directory holding tiktoken.model and tokenizer_config.json",
};

/** `k3 tokenize`'s flags and help. */
export const TOKENIZE_FLAGS: CommandFlags = commandFlags({
  name: "tokenize",
  head: `usage: k3 tokenize --tok DIR (--text TEXT | --file PATH | --chat REQUEST.json) [--json]

Prints the token ids of a text, comma-separated (or a JSON array with --json).
Special tokens in the text are not recognised: they are encoded as ordinary text.
With --chat, the ids of an OpenAI chat request's prompt (messages, tools, tool_choice,
response_format, reasoning_effort, chat_template_kwargs, add_generation_prompt) as
k3 serve renders it, the released encoder's rendering.`,
  groups: [{
    name: "tokenize",
    title: "",
    column: 17,
    flags: {
      tok: TOKENIZER_DIR_FLAG,
      text: { type: "string", value: "TEXT", help: "the text to encode" },
      file: {
        type: "string",
        value: "PATH",
        file: "input",
        help: "read the text from a file, verbatim (must be valid UTF-8)",
      },
      chat: {
        type: "string",
        value: "PATH",
        file: "input",
        help: "an OpenAI chat request (JSON; - for stdin): its prompt's ids",
      },
      json: { type: "boolean", help: "print a JSON array" },
    },
  }],
  tail: `examples:
  k3 tokenize --tok tests/fixtures/tiny --text "The capital of France is"
  k3 tokenize --tok /data/kimi-k3 --file prompt.txt --json
  k3 tokenize --tok /data/kimi-k3 --chat request.json`,
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
  const opts = {
    tok: flags.str("tok"),
    text: flags.str("text"),
    file: flags.str("file"),
    chat: flags.str("chat"),
    json: flags.bool("json"),
  };
  if (flags.bool("help")) {
    out.write(TOKENIZE_FLAGS.usage());
    return Promise.resolve(0);
  }
  if (opts.tok === undefined) throw usageError("tokenize: --tok DIR is required");
  if ([opts.text, opts.file, opts.chat].filter((x) => x !== undefined).length !== 1) {
    throw usageError("tokenize: give exactly one of --text, --file and --chat");
  }
  const read = (path: string, what: string) =>
    decodeUtf8Strict(
      readInput(path, { what, maxBytes: 1 << 30, allowStdin: true, exitCode: EXIT.usage }),
      path === "-" ? "stdin" : path,
    );
  const tok = Tokenizer.load(opts.tok);
  let ids: number[];
  if (opts.chat !== undefined) ids = chatIds(tok, read(opts.chat, "--chat"), opts.chat);
  else {
    const text = opts.file !== undefined ? read(opts.file, "--file") : opts.text!;
    ids = tok.encode(text, { allowSpecial: false });
  }
  out.write((opts.json ? JSON.stringify(ids) : ids.join(",")) + "\n");
  return Promise.resolve(0);
}

/** The prompt ids of a chat request file; a bad request is a usage error (exit 2) naming it. */
function chatIds(tok: Tokenizer, text: string, path: string): number[] {
  let body: unknown;
  try {
    body = parseJson(text);
  } catch (e) {
    throw usageError(`--chat ${path}: not JSON (${(e as Error).message})`);
  }
  try {
    return renderChatBody(tok, body).ids;
  } catch (e) {
    if (e instanceof ApiError) throw usageError(`--chat ${path}: ${e.message}`);
    throw e;
  }
}
