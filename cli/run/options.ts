/**
 * `k3 run`'s flags (declared once: the parser and `--help` both come from them) and the
 * options they give.
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";
import type { DraftMode } from "../../engine/generate/draft.ts";
import type { SamplingParams } from "../../engine/generate/sampling.ts";
import { type OutputTarget, prepareOutput } from "../../engine/native/files.ts";
import { type CommandFlags, commandFlags, type FlagGroup } from "../flags.ts";
import { modelDirArg } from "../common.ts";
import { GENERATION_GROUP, type GenerationOptions, generationOptions } from "../flag_groups/generation.ts";
import { MODEL_GROUP } from "../flag_groups/model.ts";
import { MEMORY_GROUP, memoryOptions } from "../flag_groups/memory.ts";
import { samplingGroup, samplingOptions } from "../flag_groups/sampling.ts";
import { draftOption, SPECULATION_GROUP } from "../flag_groups/speculation.ts";
import { TERMINAL_GROUP } from "../flag_groups/terminal.ts";
import { type OutputMode, outputMode } from "../progress.ts";
import { PROMPT_GROUP, type PromptSource, promptSource } from "../run_options.ts";
import { runGrammar, STRUCTURED_GROUP } from "../structured.ts";
import type { GrammarSpec } from "../../engine/generate/grammar/forms.ts";

/** `--context`, beside the generation flags. */
const CONTEXT_GROUP: FlagGroup = {
  name: "context",
  title: "",
  flags: {
    context: {
      type: "string",
      value: "N",
      help: "positions the run may hold (default: the prompt, a loaded state and\n" +
        "--gen; a smaller one is refused, a larger one sizes the cache)",
    },
  },
};

/** What `k3 run` writes besides the streamed text. */
const RUN_OUTPUT_GROUP: FlagGroup = {
  name: "output",
  title: "output",
  flags: {
    json: {
      type: "boolean",
      help: 'stdout: one JSON object per token {"index","id","text","seconds","logprob"}\n' +
        "(logprob: float64 log-softmax of the logits the token was picked from),\n" +
        'then {"finish_reason","generated_ids","generated_text","prompt_tokens"}',
    },
    "dump-logits": {
      type: "string",
      value: "F",
      file: "output",
      help: "write the logits of every step, float32 little-endian [steps][vocab]",
    },
    out: { type: "string", value: "FILE", file: "output", help: "write a JSON report (atomically)" },
    ledger: {
      type: "boolean",
      help: "print where the seconds went (reads, matmuls, experts, attention,\n" +
        "head, sampling) and what was read; the report always has it",
    },
  },
};

/** Saved sequence states. */
const SAVED_STATE_GROUP: FlagGroup = {
  name: "saved states",
  title: "saved states (exact prefixes only: a KDA state cannot be rewound)",
  flags: {
    "save-state": {
      type: "string",
      value: "F",
      file: "output",
      help: "after the prompt and any generation, save the sequence state to F\n(--gen 0 runs the prompt only)",
    },
    "load-state": {
      type: "string",
      value: "F",
      file: "input",
      help: "continue the state saved in F; the prompt is the suffix to add",
    },
  },
};

/** `k3 run`'s flags and help. */
export const RUN_FLAGS: CommandFlags = commandFlags({
  name: "run",
  head: `usage: k3 run <model_dir> (--prompt TEXT | --prompt-file PATH | --ids 1,2,3) [options]

Generation from one prompt (with no prompt flag, the text piped to stdin). The text goes to stdout as tokens arrive (the ids, without a
tokenizer); the plan, progress and the summary go to stderr, and the per-step table too
when stderr is not a terminal (or with --verbose). Ctrl-C (SIGINT) or SIGTERM stops
cleanly: what was generated is printed, --out is written with finish_reason
"interrupted", exit 130.`,
  groups: [
    PROMPT_GROUP,
    GENERATION_GROUP,
    CONTEXT_GROUP,
    MODEL_GROUP,
    samplingGroup("default: greedy"),
    SPECULATION_GROUP,
    RUN_OUTPUT_GROUP,
    STRUCTURED_GROUP,
    SAVED_STATE_GROUP,
    MEMORY_GROUP,
    TERMINAL_GROUP,
  ],
  tail: `examples:
  k3 run tests/fixtures/tiny --prompt "Once upon a time" --gen 8
  k3 run tests/fixtures/tiny -p "Once upon a time" -n 32 --temperature 0.8 --seed 7
  echo "Once upon a time" | k3 run tests/fixtures/tiny --quiet
  k3 run tests/fixtures/tiny --ids 5,17,300 --gen 20 --out report.json
  k3 run /data/kimi-k3 --trunk /data/k3-trunk --preset laptop --prompt-file q.txt`,
});

/** Everything `k3 run`'s flags asked for, checked before anything loads. */
export interface RunOptions {
  /** The model directory. */
  dir: string;
  /** What stderr shows. */
  mode: OutputMode;
  /** --out, checked writable. */
  outTarget?: OutputTarget;
  /** --dump-logits, checked writable. */
  logitsTarget?: OutputTarget;
  /** Where the prompt comes from. */
  source: PromptSource;
  /** Generation and model flags. */
  gen: GenerationOptions;
  /** Sampling. */
  sampling: SamplingParams;
  /** The memory budget. */
  memory: MemoryOptions;
  /** --grammar / --json-schema. */
  grammar?: GrammarSpec;
  /** The flag that asked for the grammar (for "needs a tokenizer"). */
  grammarFlag: string;
  /** --context (undefined: what the run needs). */
  context?: string;
  /** Speculation. */
  draft: DraftMode;
  /** --json. */
  json: boolean;
  /** --ledger. */
  ledger: boolean;
  /** --save-state. */
  saveState?: string;
  /** --load-state. */
  loadState?: string;
}

/** Parses `k3 run`'s arguments; undefined after printing `--help`. */
export function runOptions(args: string[]): RunOptions | undefined {
  const flags = RUN_FLAGS.parseUnlessHelp(args);
  if (flags === undefined) return undefined;
  const { values, positionals, tokens } = flags;
  const dir = modelDirArg("run", positionals, "--prompt");
  const mode = outputMode(values as { quiet?: boolean; verbose?: boolean; color?: string });
  // Outputs are checked before anything loads (a directory, an unwritable place: exit 2).
  const out = flags.str("out"), logits = flags.str("dump-logits");
  const outTarget = out !== undefined ? prepareOutput(out, "--out") : undefined;
  const logitsTarget = logits !== undefined ? prepareOutput(logits, "--dump-logits") : undefined;
  const source = promptSource(values);
  const saveState = flags.str("save-state"), loadState = flags.str("load-state");
  const gen = generationOptions(values, saveState !== undefined ? 0 : 1);
  const sampling = samplingOptions(values);
  const memory = memoryOptions(tokens);
  if ((saveState || loadState) && !gen.incremental) {
    throw usageError("--save-state and --load-state carry the state: they cannot be used with --full-recompute");
  }
  return {
    dir,
    mode,
    outTarget,
    logitsTarget,
    source,
    gen,
    sampling,
    memory,
    grammar: runGrammar(values),
    grammarFlag: flags.str("grammar") ? "--grammar" : "--json-schema",
    context: flags.str("context"),
    draft: draftOption(flags.str("draft")),
    json: flags.bool("json"),
    ledger: flags.bool("ledger"),
    saveState,
    loadState,
  };
}
