/**
 * `k3 batch`'s flags (declared once: the parser and `--help` both come from them) and the
 * options they give, checked before anything loads.
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";
import type { DraftMode } from "../../engine/generate/draft.ts";
import type { SamplingParams } from "../../engine/generate/sampling.ts";
import { type OutputTarget, prepareOutput } from "../../engine/native/files.ts";
import { type CommandFlags, commandFlags, type FlagGroup } from "../flags.ts";
import { GENERATION_GROUP, type GenerationOptions, generationOptions } from "../flag_groups/generation.ts";
import { MODEL_GROUP } from "../flag_groups/model.ts";
import { MEMORY_GROUP, memoryOptions } from "../flag_groups/memory.ts";
import { samplingGroup, samplingOptions } from "../flag_groups/sampling.ts";
import { draftOption, SPECULATION_GROUP } from "../flag_groups/speculation.ts";
import { REASONING_GROUP, reasoningBudgetOption } from "../flag_groups/reasoning.ts";
import { STATE_CACHE_GROUP, type StateCacheFlags, stateCacheFlags } from "../state_cache_flags.ts";

/** The files of a batch and how it runs them. */
const BATCH_GROUP: FlagGroup = {
  name: "batch",
  title: "",
  flags: {
    input: { type: "string", value: "FILE", file: "input", help: "prompts, JSONL" },
    output: {
      type: "string",
      value: "FILE",
      file: "output",
      help: "results, JSONL (created, or appended to and resumed)",
    },
    parallel: {
      type: "string",
      value: "N|auto",
      help: "prompts generated at once, sharing every pass's trunk and expert\n" +
        "reads (default auto: up to 16, the number whose memory plan predicts\n" +
        "the most tokens/s); results are written in finishing order",
    },
    report: {
      type: "string",
      value: "FILE",
      file: "output",
      help: "write a JSON summary of the whole run (atomically)",
    },
    "force-resume": { type: "boolean", help: "add to an --output made with other settings (see above)" },
  },
};

/** `k3 batch`'s flags and help. */
export const BATCH_FLAGS: CommandFlags = commandFlags({
  name: "batch",
  head: `usage: k3 batch <model_dir> --input PROMPTS.jsonl --output RESULTS.jsonl [options]

Greedy generation for every prompt of a JSONL file, opening the model once.

input, one JSON object per line (blank lines are ignored):
  {"id": "a1", "prompt": "Once upon a time"}           text (needs a tokenizer)
  {"id": 2, "ids": [1, 2, 3], "gen": 16, "stop_ids": [770]}
  {"id": "c", "messages": [{"role": "user", "content": "Hi"}], "thinking": false,
   "temperature": 0.7, "seed": 3, "stop": ["\\n\\n"]}
  {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
   "body": {"model": "k3", "messages": [...], "max_tokens": 64}}   OpenAI Batch API
  id        string or number, unique in the file
  prompt | ids | messages   exactly one: text, token ids, or a chat (rendered with the
            chat template; "thinking" true (default) opens the think channel, "effort"
            low|high|max; the reply ends at <|end_of_msg|>; "reasoning" and "content" in
            the result)
  gen       tokens to generate for this line (default: --gen)
  stop_ids  ids to stop after (default: --stop-id)
  stop      a string or strings to stop at, not emitted (default: --stop)
  temperature, top_p, top_k, min_p, seed   this line's sampling (default: the flags)
  OpenAI Batch lines (custom_id, method POST, url /v1/chat/completions or
  /v1/completions, body as for k3 serve) get a result line in the Batch output format:
  {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}
output, one JSON object per finished prompt, appended and fsync'ed as it finishes, in
the report schema (README, "Reports"): {"schema_version", "k3_version", "kind", "id",
  "finish_reason", "usage", "prefill_seconds", "decode_seconds_per_token", "prompt_ids",
  "generated_ids", "generated_text" (null without a tokenizer), "seconds", "settings";
  streamed: "trunk_bytes_read", "expert_bytes_read", "expert_cache_hit_rate", ...}
A rerun with the same --output skips ids already there, so a killed run resumes where it
stopped; it is refused (exit 2) when the file's results were made with settings that
change tokens (model, --layers, --gen, --stop-id, sampling), unless --force-resume.
Malformed input lines are reported (FILE:LINE: why) and skipped; the others run.

exit codes: 0 every line done; 1 some input line was malformed (the rest ran) or a
runtime failure; 2 usage error; 4 a prompt's output was unsound (non-finite logits): the
run stops there, results already written are kept.`,
  groups: [
    BATCH_GROUP,
    GENERATION_GROUP,
    MODEL_GROUP,
    samplingGroup("default: greedy; a line's own fields override"),
    SPECULATION_GROUP,
    REASONING_GROUP,
    MEMORY_GROUP,
    STATE_CACHE_GROUP,
  ],
  tail: `example:
  k3 batch tests/fixtures/tiny --input prompts.jsonl --output results.jsonl --gen 16`,
});

/** Everything `k3 batch`'s flags asked for. */
export interface BatchOptions {
  /** The model directory. */
  dir: string;
  /** --input. */
  input: string;
  /** --output, as given. */
  output: string;
  /** --output, checked writable. */
  target: OutputTarget;
  /** --report, checked writable. */
  reportTarget?: OutputTarget;
  /** --force-resume. */
  forceResume: boolean;
  /** Generation and model flags. */
  gen: GenerationOptions;
  /** Sampling (a line's own fields override). */
  sampling: SamplingParams;
  /** --parallel N, or undefined for auto. */
  parallel?: number;
  /** Speculation. */
  draft: DraftMode;
  /** --reasoning-budget: the default budget of thinking chat lines. */
  reasoningBudget?: number;
  /** The memory budget. */
  memory: MemoryOptions;
  /** The state cache flags. */
  stateCache: StateCacheFlags;
}

/** `--parallel N` (1..256), or undefined for auto (the default). */
function parallelOption(v: string | undefined): number | undefined {
  if (v === undefined || v === "auto") return undefined;
  if (!/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 256) {
    throw usageError(`--parallel: expected auto or an integer 1..256, got ${JSON.stringify(v)}`);
  }
  return Number(v);
}

/** Parses `k3 batch`'s arguments; undefined after printing `--help`. */
export function batchOptions(args: string[]): BatchOptions | undefined {
  const flags = BATCH_FLAGS.parseUnlessHelp(args);
  if (flags === undefined) return undefined;
  const { values, positionals, tokens } = flags;
  if (positionals.length !== 1) {
    throw usageError("batch: expected exactly one <model_dir> (see k3 batch --help)");
  }
  const input = flags.str("input"), output = flags.str("output"), report = flags.str("report");
  if (input === undefined) throw usageError("batch: --input PROMPTS.jsonl is required");
  if (output === undefined) throw usageError("batch: --output RESULTS.jsonl is required");
  if (input === output) {
    throw usageError("batch: --input and --output must be different files");
  }
  // Checked before anything loads: a directory, a missing or unwritable directory: exit 2.
  const target = prepareOutput(output, "--output");
  const reportTarget = report !== undefined ? prepareOutput(report, "--report") : undefined;
  return {
    dir: positionals[0],
    input,
    output,
    target,
    reportTarget,
    forceResume: flags.bool("force-resume"),
    gen: generationOptions(values),
    sampling: samplingOptions(values),
    parallel: parallelOption(flags.str("parallel")),
    draft: draftOption(flags.str("draft")),
    reasoningBudget: reasoningBudgetOption(flags.str("reasoning-budget")),
    memory: memoryOptions(tokens),
    stateCache: stateCacheFlags(values),
  };
}
