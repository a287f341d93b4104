/**
 * Options shared by `k3 run` and `k3 batch`: model, prompt, generation, memory and
 * diagnostics flags, parsed once, in one place.
 *
 * @module
 */

import type { ParseArgsConfig } from "node:util";
import { EXIT, usageError } from "../engine/errors.ts";
import type { MemoryOptions } from "../engine/weights/plan_input.ts";
import { PRESETS } from "../engine/model/presets.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { decodeUtf8Strict } from "../engine/text/utf8.ts";
import { DRAFT_MODES, type DraftMode } from "../engine/generate/draft.ts";
import { intFlag, lastFlagWins, numFlag, parseFlags, parseIds } from "./common.ts";
import type { ChunkRequest } from "../engine/weights/plan_segment.ts";
import { CHUNK_HELP, chunkFlag } from "./chunk_flag.ts";
import { DEFAULTS, MAX_TOKENS, stopStrings } from "./request.ts";
import { notRegular, readInput } from "../engine/native/files.ts";

/**
 * The longest prompt in ids (run, batch and its OpenAI lines; doctor's longest context).
 * Prefill is quadratic in it through MLA attention over the cache (the only such work:
 * the rest is linear; tests/prefill_work_test.ts counts it, bench/long_prompt.ts times
 * it), so the limit is what the tiny model prefills well within a minute on 2 shared
 * cores: 8,192 ids took 25 s (57 s with the machine 3x oversubscribed); 16,384 took 65 s
 * and 32,768 took 527 s. (`k3 serve` and `k3 chat` size their own --context.)
 */
export const MAX_PROMPT_IDS = 8192;

/** The largest prompt file read (MAX_PROMPT_IDS ids are far less). */
export const MAX_PROMPT_FILE = 64 << 20;

/** Flags of the memory budget; applied in command-line order (a later one overrides). */
export const MEMORY_FLAGS = {
  trunk: { type: "string" },
  "trunk-gb": { type: "string" },
  "cache-gb": { type: "string" },
  preset: { type: "string" },
} as const satisfies ParseArgsConfig["options"];
lastFlagWins(...Object.keys(MEMORY_FLAGS));

/** Generation and diagnostics flags. */
export const GENERATION_FLAGS = {
  gen: { type: "string", short: "n" },
  incremental: { type: "boolean" },
  "full-recompute": { type: "boolean" },
  "stop-id": { type: "string", multiple: true },
  stop: { type: "string", multiple: true },
  layers: { type: "string" },
  chunk: { type: "string" },
  tok: { type: "string" },
  threads: { type: "string", short: "t" },
} as const satisfies ParseArgsConfig["options"];

/** The speculation flag (`k3 run`, `k3 batch`, `k3 serve`). */
export const DRAFT_FLAGS = {
  draft: { type: "string" },
} as const satisfies ParseArgsConfig["options"];

/** Help for the speculation flag. */
export const DRAFT_HELP = `speculation (never changes a token):
  --draft MODE      lookup (n-gram prompt lookup), suffix (the longest earlier match of
                    the text so far, and of recent finished sequences) or off; default:
                    suffix, as many draft tokens per pass as the measured acceptance and
                    pass cost say pay (none where drafting does not pay)`;

/** --draft: one of the draft modes (default suffix); anything else is a usage error. */
export function draftOption(value: string | undefined): DraftMode {
  if (value === undefined) return "suffix";
  if (!(DRAFT_MODES as readonly string[]).includes(value)) {
    throw usageError(`--draft: expected one of ${DRAFT_MODES.join(", ")}, got ${JSON.stringify(value)}`);
  }
  return value as DraftMode;
}

/** Help for the memory flags. */
export const MEMORY_HELP = `memory (a later flag overrides an earlier one):
  --trunk DIR       packed trunk from \`k3 pack\` (streamed layer by layer)
  --trunk-gb X      GB of trunk layers to keep pinned (fractions allowed)
  --cache-gb X      GB of routed-expert cache (at least top-k + 1 experts)
  --preset NAME     ${PRESETS.map((p) => p.name).join(", ")} (see k3 presets)`;

/** Help for the generation and diagnostics flags. */
export const GENERATION_HELP = `generation:
  -n, --gen N       tokens to generate (default 8, 1..4096)
  --incremental     carry KDA/conv state and the MLA cache between steps (the default)
  --full-recompute  recompute the whole sequence every step instead (same tokens, slower)
  --stop-id ID      stop after this id (repeatable; none by default)
  --stop TEXT       stop when the generated text contains TEXT, which is not emitted
                    (repeatable; matched across token boundaries; needs a tokenizer)
  --tok DIR         tokenizer directory (default: the model directory when it has
                    tiktoken.model)
diagnostics:
  --layers N        bind and run only the first N layers
  ${CHUNK_HELP}
  -t, --threads N   compute threads (default and most: the cores; never changes a token)`;

/** Parsed generation options. */
export interface GenerationOptions {
  /** Tokens to generate at most. */
  gen: number;
  /** Carry state between steps (false: --full-recompute). */
  incremental: boolean;
  /** --stop-id values, checked against the vocabulary later. */
  stopIds: string[];
  /** Stop strings. */
  stops: string[];
  /** Bind and run only the first N layers. */
  layers?: number;
  /** Prompt tokens per forward pass (a segment), or `auto`: the plan's. */
  chunk: ChunkRequest;
  /** Tokenizer directory (--tok). */
  tokDir?: string;
  /** Compute threads (capped at the cores). */
  threads: number;
}

/** Reads the memory flags in order from parseArgs tokens. */
export function memoryOptions(tokens: { kind: string; name?: string; value?: string }[]): MemoryOptions {
  const mem: MemoryOptions = {};
  for (const t of tokens) {
    if (t.kind !== "option" || t.value === undefined) continue;
    switch (t.name) {
      case "trunk":
        mem.trunkDir = t.value;
        break;
      case "trunk-gb":
        mem.trunkGB = numFlag("trunk-gb", t.value, 0, 1e6);
        break;
      case "cache-gb":
        mem.cacheGB = numFlag("cache-gb", t.value, 0, 1e6);
        break;
      case "preset": {
        const p = PRESETS.find((x) => x.name === t.value);
        if (!p) {
          throw usageError(
            `--preset: unknown preset ${JSON.stringify(t.value)} (one of ${PRESETS.map((x) => x.name).join(", ")})`,
          );
        }
        mem.preset = p.name;
        if (p.name === "auto") {
          mem.trunkGB = undefined;
          mem.cacheGB = undefined;
        } else {
          mem.trunkGB = p.trunkGB;
          mem.cacheGB = p.cacheGB;
        }
        mem.streamEmbed = p.streamEmbed;
        break;
      }
    }
  }
  return mem;
}

/** --threads, capped at this machine's cores: more workers than cores only contend (and a
 * thread count never changes a token), so the cap is said on stderr, not refused. */
export function threadCount(value: string | undefined, cores = navigator.hardwareConcurrency): number {
  const n = intFlag("threads", value, cores, 1, 256);
  if (n <= cores) return n;
  console.error(`k3: --threads ${n}: this machine has ${cores} cores; using ${cores}`);
  return cores;
}

/** Parses generation flags from parseArgs values (`minGen` 0: a prompt-only run is allowed). */
export function generationOptions(values: Record<string, unknown>, minGen = 1): GenerationOptions {
  if (values.incremental && values["full-recompute"]) {
    throw usageError("--incremental and --full-recompute conflict: choose one");
  }
  return {
    gen: intFlag("gen", values.gen as string | undefined, DEFAULTS.run.maxTokens, minGen, MAX_TOKENS),
    incremental: !values["full-recompute"],
    stopIds: (values["stop-id"] as string[] | undefined) ?? [],
    stops: stopStrings(values.stop as string[] | undefined),
    layers: values.layers === undefined ? undefined : intFlag("layers", values.layers as string, 0, 1, 100000),
    chunk: chunkFlag(values.chunk as string | undefined, MAX_PROMPT_IDS),
    tokDir: values.tok as string | undefined,
    threads: threadCount(values.threads as string | undefined),
  };
}

/** Where a prompt comes from: exactly one of --prompt, --prompt-file, --ids. */
export type PromptSource = { kind: "ids"; text: string } | { kind: "text"; text: string } | {
  kind: "file";
  path: string;
};

/** The prompt flags, checked for exactly one. */
export function promptSource(values: Record<string, unknown>): PromptSource {
  const given = (["prompt", "prompt-file", "ids"] as const).filter((k) => values[k] !== undefined);
  if (given.length !== 1) {
    throw usageError(
      given.length === 0
        ? "a prompt is required: one of --prompt, --prompt-file, --ids (text on stdin: --prompt-file -)"
        : `only one prompt source is allowed, got ${given.map((g) => "--" + g).join(" and ")}`,
    );
  }
  if (values.ids !== undefined) return { kind: "ids", text: values.ids as string };
  if (values.prompt !== undefined) return { kind: "text", text: values.prompt as string };
  return { kind: "file", path: values["prompt-file"] as string };
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

/** Turns a prompt source into ids checked against the vocabulary. */
export function promptIds(src: PromptSource, vocab: number, tokenizer: () => Tokenizer): Promise<number[]> {
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
  if (ids.length > MAX_PROMPT_IDS) throw usageError(`the prompt has ${ids.length} ids, at most ${MAX_PROMPT_IDS}`);
  return Promise.resolve(ids);
}

export { parseFlags };
