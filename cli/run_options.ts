/**
 * The prompt of `k3 run` and `k3 batch`: its flags, its limits, the tokenizer that reads
 * it and the ids it becomes.
 *
 * @module
 */

import { EXIT, usageError } from "../engine/errors.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { decodeUtf8Strict } from "../engine/text/utf8.ts";
import { parseIds } from "./common.ts";
import type { FlagGroup } from "./flags.ts";
import { notRegular, readInput } from "../engine/native/files.ts";

/** The largest prompt file read (a window of ids is far less). */
export const MAX_PROMPT_FILE = 64 << 20;

/**
 * The refusal of a prompt longer than `limit` ids, the model's window (model/config.ts
 * modelWindow): one line, the same for run and batch. Within the window, what the memory
 * plan holds is checked when the model opens (weights/plan.ts fitContext).
 */
export function promptLimitText(ids: number, limit: number): string {
  return `the prompt has ${ids} ids, at most ${limit} (the model's window, max_position_embeddings)`;
}

/** The prompt flags of `k3 run` (exactly one is given; see {@link promptSource}). */
export const PROMPT_GROUP: FlagGroup = {
  name: "prompt",
  title: "prompt (exactly one)",
  flags: {
    prompt: {
      type: "string",
      short: "p",
      value: "TEXT",
      help: "text, encoded with the tokenizer (special tokens are not recognised)",
    },
    "prompt-file": { type: "string", value: "P", file: "input", help: "a UTF-8 file, read verbatim (- reads stdin)" },
    ids: { type: "string", value: "LIST", help: "token ids, comma-separated (no tokenizer needed)" },
  },
};

/** Where a prompt comes from: exactly one of --prompt, --prompt-file, --ids. */
export type PromptSource = { kind: "ids"; text: string } | { kind: "text"; text: string } | {
  kind: "file";
  path: string;
};

/** The prompt flags, checked for exactly one; with none, text piped to stdin (`stdin`, for tests). */
export function promptSource(
  values: Record<string, unknown>,
  stdin: () => string | undefined = pipedStdin,
): PromptSource {
  const given = (["prompt", "prompt-file", "ids"] as const).filter((k) => values[k] !== undefined);
  if (given.length === 0) {
    // `echo text | k3 run MODEL`: piped text is the prompt when no flag names one.
    const text = stdin();
    if (text) return { kind: "text", text };
  }
  if (given.length !== 1) {
    throw usageError(
      given.length === 0
        ? "a prompt is required: one of --prompt, --prompt-file, --ids, or text piped to stdin"
        : `only one prompt source is allowed, got ${given.map((g) => "--" + g).join(" and ")}`,
    );
  }
  if (values.ids !== undefined) return { kind: "ids", text: values.ids as string };
  if (values.prompt !== undefined) return { kind: "text", text: values.prompt as string };
  return { kind: "file", path: values["prompt-file"] as string };
}

/** The text piped to stdin (read now, before the model loads), or undefined on a terminal. */
function pipedStdin(): string | undefined {
  try {
    if (Deno.stdin.isTerminal()) return undefined;
  } catch {
    return undefined;
  }
  const bytes = readInput("-", { what: "stdin", maxBytes: MAX_PROMPT_FILE, allowStdin: true, exitCode: EXIT.usage });
  return decodeUtf8Strict(bytes, "stdin");
}

/** The tokenizer directory: --tok, else the model dir when it holds tiktoken.model. */
export function tokenizerDir(modelDir: string, tokDir?: string): string | undefined {
  if (tokDir) return tokDir;
  // Anything there counts (a FIFO or directory is then refused by the loader, not ignored).
  return notRegular(`${modelDir}/tiktoken.model`) !== "no such file" ? modelDir : undefined;
}

/**
 * Loads the tokenizer in `dir` for a model of `vocab` ids. When it cannot name every id
 * (e.g. no tokenizer_config.json, so the added tokens are unknown), says so once on
 * stderr before the run, and those ids decode as `<|id:N|>` instead of failing.
 */
export function loadModelTokenizer(dir: string, vocab: number): Tokenizer {
  const tok = Tokenizer.load(dir);
  const unnamed = tok.forModel(vocab);
  if (unnamed.length > 0) {
    const count = unnamed.reduce((n, [a, b]) => n + b - a + 1, 0);
    const shown = unnamed.slice(0, 4).map(([a, b]) => (a === b ? `${a}` : `${a}..${b}`)).join(", ");
    console.error(
      `k3: note: the tokenizer in ${dir} names ${vocab - count} of the model's ${vocab} ids; ` +
        `${count} (${shown}${unnamed.length > 4 ? ", ..." : ""}) decode as <|id:N|>`,
    );
  }
  return tok;
}

/** Loads the tokenizer for a model of `vocab` ids, or explains how to get one (usage error). */
export function needTokenizer(modelDir: string, tokDir: string | undefined, why: string, vocab: number): Tokenizer {
  const dir = tokenizerDir(modelDir, tokDir);
  if (!dir) throw usageError(`${why} needs a tokenizer: pass --tok DIR (no tiktoken.model in ${modelDir})`);
  return loadModelTokenizer(dir, vocab);
}

/** Turns a prompt source into ids checked against the vocabulary and at most `limit` ids
 * (the model's window). */
export function promptIds(
  src: PromptSource,
  vocab: number,
  tokenizer: () => Tokenizer,
  limit: number,
): Promise<number[]> {
  let ids: number[];
  if (src.kind === "ids") {
    ids = parseIds("ids", src.text, vocab);
  } else {
    let text: string;
    if (src.kind === "text") text = src.text;
    else {
      const bytes = readInput(src.path, {
        what: "--prompt-file",
        maxBytes: MAX_PROMPT_FILE,
        allowStdin: true,
        exitCode: EXIT.usage,
      });
      text = decodeUtf8Strict(bytes, src.path === "-" ? "stdin" : src.path);
    }
    ids = tokenizer().encode(text, { allowSpecial: false });
    const bad = ids.find((id) => id >= vocab);
    if (bad !== undefined) {
      throw usageError(`the tokenizer produced id ${bad}, outside the model's vocabulary of ${vocab}`);
    }
  }
  if (ids.length === 0) throw usageError("the prompt is empty");
  if (ids.length > limit) throw usageError(promptLimitText(ids.length, limit));
  return Promise.resolve(ids);
}
