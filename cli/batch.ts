/**
 * `k3 batch <model_dir> --input prompts.jsonl --output results.jsonl`: greedy generation
 * for every prompt of a JSONL file, with the model opened once.
 *
 * Each result line is appended and fsync'ed as soon as its prompt finishes, so a killed
 * run loses nothing already done; a rerun with the same output file skips the ids already
 * there (a torn last line, from a kill mid-write, is cut away first). Malformed input lines
 * are reported with their line number and skipped; the exit code is 1 when any was.
 *
 * @module
 */

import { EXIT, usageError } from "../engine/errors.ts";
import { ledgerBetween, markLedger } from "../engine/generate/ledger.ts";
import { openModel, readModelConfig } from "../engine/open.ts";
import { engineEnvironment } from "./environment.ts";
import type { Tokenizer } from "../engine/text/tokenizer.ts";
import { fmtBytes, parseIds, peakRssBytes, plural } from "./common.ts";
import { reportHead, reportSettings, snakeKeys } from "./report.ts";
import { prepareOutput, readInput, writeOutput } from "../engine/native/files.ts";
import { progress } from "./progress.ts";
import {
  DRAFT_FLAGS,
  DRAFT_HELP,
  draftOption,
  GENERATION_FLAGS,
  GENERATION_HELP,
  generationOptions,
  loadModelTokenizer,
  MEMORY_FLAGS,
  MEMORY_HELP,
  memoryOptions,
  parseFlags,
  tokenizerDir,
} from "./run_options.ts";
import { SAMPLING_FLAGS, samplingHelp, samplingOptions } from "./request.ts";
import { readJobs } from "./batch/jobs.ts";
import { type BatchRun, runJobs } from "./batch/run.ts";
import { openStateCache, STATE_CACHE_FLAGS, STATE_CACHE_HELP, stateCacheFlags } from "./state_cache_flags.ts";
import { readDone, resumeMismatch } from "./batch/resume.ts";
import { AppendLog } from "./batch/append_log.ts";

/** Usage text of `k3 batch`. */
export const USAGE = `usage: k3 batch <model_dir> --input PROMPTS.jsonl --output RESULTS.jsonl [options]

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
run stops there, results already written are kept.

  --input FILE      prompts, JSONL
  --output FILE     results, JSONL (created, or appended to and resumed)
  --parallel N|auto prompts generated at once, sharing every pass's trunk and expert
                    reads (default auto: up to 16, the number whose memory plan predicts
                    the most tokens/s); results are written in finishing order
  --report FILE     write a JSON summary of the whole run (atomically)
  --force-resume    add to an --output made with other settings (see above)
${GENERATION_HELP}
${samplingHelp("default: greedy; a line's own fields override")}
${DRAFT_HELP}
${MEMORY_HELP}
${STATE_CACHE_HELP}
  -h, --help        this help

example:
  k3 batch tests/fixtures/tiny --input prompts.jsonl --output results.jsonl --gen 16
`;

/** `--parallel auto` takes the most prompts at once that the memory plan holds, up to this. */
const MAX_AUTO_PARALLEL = 16;

/** `--parallel N` (1..256), or undefined for auto (the default). */
function parallelOption(v: string | undefined): number | undefined {
  if (v === undefined || v === "auto") return undefined;
  if (!/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 256) {
    throw usageError(`--parallel: expected auto or an integer 1..256, got ${JSON.stringify(v)}`);
  }
  return Number(v);
}

/** Runs `k3 batch`; returns the exit code, throws K3Error on failure. */
export async function main(args: string[]): Promise<number> {
  const { values, positionals, tokens } = parseFlags("batch", args, {
    input: { type: "string" },
    output: { type: "string" },
    parallel: { type: "string" },
    report: { type: "string" },
    "force-resume": { type: "boolean" },
    ...GENERATION_FLAGS,
    ...SAMPLING_FLAGS,
    ...MEMORY_FLAGS,
    ...STATE_CACHE_FLAGS,
    ...DRAFT_FLAGS,
    help: { type: "boolean", short: "h" },
  });
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  if (positionals.length !== 1) {
    throw usageError("batch: expected exactly one <model_dir> (see k3 batch --help)");
  }
  if (values.input === undefined) throw usageError("batch: --input PROMPTS.jsonl is required");
  if (values.output === undefined) throw usageError("batch: --output RESULTS.jsonl is required");
  if (values.input === values.output) {
    throw usageError("batch: --input and --output must be different files");
  }
  // Checked before anything loads: a directory, a missing or unwritable directory: exit 2.
  const target = prepareOutput(values.output, "--output");
  const reportTarget = values.report !== undefined ? prepareOutput(values.report, "--report") : undefined;
  const dir = positionals[0];
  const genOpts = generationOptions(values);
  const sampling = samplingOptions(values);
  const parallel = parallelOption(values.parallel);
  const draft = draftOption(values.draft);
  const memory = memoryOptions(tokens);
  const stateCacheAsked = stateCacheFlags(values);
  const config = await readModelConfig(dir, genOpts.layers);
  const { cfg } = config;
  const stopIds = genOpts.stopIds.map((s) => parseIds("stop-id", s, cfg.vocabSize)[0]);

  const inputBytes = readInput(values.input, {
    what: "--input",
    maxBytes: 1 << 30,
    allowStdin: true,
    exitCode: EXIT.usage,
  });
  const tokDir = tokenizerDir(dir, genOpts.tokDir);
  let tokenizer: Tokenizer | undefined;
  const getTokenizer = () => (tokDir ? (tokenizer ??= loadModelTokenizer(tokDir, cfg.vocabSize)) : undefined);
  if (tokDir) getTokenizer(); // generated text for every line, and a bad --tok fails up front

  // Parse every line first: the model's capacity is the longest prompt + gen.
  const { jobs, failed } = readJobs(inputBytes, values.input, {
    vocab: cfg.vocabSize,
    gen: genOpts.gen,
    stopIds,
    tokenizer: getTokenizer,
    sampling,
    stops: genOpts.stops,
    modelName: dir.replace(/\/+$/, "").split("/").pop() || "kimi-k3",
  });

  // Resume only from a regular file: stdout, a FIFO or a device is written, never read.
  const { done, cutBytes, settings: recorded } = target.kind === "atomic"
    ? await readDone(target.real)
    : { done: new Set<string>(), cutBytes: 0, settings: [] };
  if (cutBytes > 0) {
    console.error(
      `k3: batch: ${values.output}: cut a torn last line (${cutBytes} bytes) left by an interrupted run`,
    );
  }
  // The settings of this run, recorded in every result line: a resume under settings that
  // change tokens would mix two experiments in one file under one name.
  const settings = reportSettings({
    modelDir: dir,
    layers: cfg.numLayers,
    gen: genOpts.gen,
    stopIds,
    sampling,
    incremental: genOpts.incremental,
    memory,
    chunk: genOpts.chunk,
    threads: genOpts.threads,
    parallel: parallel ?? 0,
  });
  const mismatch = resumeMismatch(recorded, settings);
  if (mismatch && !values["force-resume"]) {
    throw usageError(
      `batch: ${values.output} holds results made with other settings (${mismatch}); ` +
        "use another --output, or --force-resume to add to it anyway",
    );
  }
  if (mismatch) console.error(`k3: batch: --force-resume: adding to ${values.output} despite ${mismatch}`);
  let todo = jobs.filter((j) => !done.has(j.key));
  console.error(
    `k3: batch: ${jobs.length} ${plural(jobs.length, "prompt")} in ${values.input}` +
      (jobs.length - todo.length ? `, ${jobs.length - todo.length} already in ${values.output}` : "") +
      (failed ? `, ${failed} malformed ${plural(failed, "line")} skipped` : "") + `; ${todo.length} to run`,
  );
  const out = await AppendLog.open(target, values.output);
  try {
    // OpenAI requests that did not validate are answered at once (status 400), as the
    // Batch API does.
    for (const job of todo.filter((j) => j.immediate)) {
      out.append(job.immediate);
      console.error(`k3: batch: ${values.input}:${job.line}: custom_id ${job.key.slice(10)}: answered 400`);
    }
    todo = todo.filter((j) => !j.immediate);
    if (todo.length === 0) return failed ? EXIT.runtime : EXIT.ok;
    const capacity = todo.reduce((m, j) => Math.max(m, j.promptIds.length + j.maxTokens), 0);
    const t0 = performance.now();
    const opened = await openModel(config, {
      ...engineEnvironment(),
      capacity,
      chunk: genOpts.chunk,
      sequences: Math.min(parallel ?? MAX_AUTO_PARALLEL, todo.length),
      autoSequences: parallel === undefined,
      threads: genOpts.threads,
      memory,
      drafts: draft !== "off" && genOpts.incremental,
      predict: true,
      stateCache: { gb: stateCacheAsked.gb },
      log: (line) => console.error(`k3: ${line}`),
      onProgress: (what, d, n) => progress(what, d, n),
    });
    const inFlight = opened.plan.state.sequences;
    console.error(
      `k3: ${dir}: ${cfg.numLayers} layers, hidden ${cfg.hiddenSize}, vocab ${cfg.vocabSize}; capacity ${capacity} positions; ${inFlight} ${
        inFlight === 1 ? "prompt" : "prompts"
      } at a time; ready in ${((performance.now() - t0) / 1000).toFixed(2)} s`,
    );
    let run: BatchRun;
    try {
      const stateCache = genOpts.incremental
        ? await openStateCache(opened, stateCacheAsked, (line) => console.error(`k3: ${line}`))
        : undefined;
      run = await runJobs(opened.model, todo, {
        stateCache,
        inFlight,
        chunk: opened.plan.chunk,
        incremental: genOpts.incremental,
        draft,
        tokenizer,
        settings,
        out,
      });
    } finally {
      await opened.close();
    }
    const { tokensDone, io, io0, start } = run;
    const wall = (performance.now() - run.startedAt) / 1000;
    console.error(
      `k3: batch: ${todo.length} ${plural(todo.length, "prompt")}, ${tokensDone} ${plural(tokensDone, "token")} in ${
        wall.toFixed(3)
      } s (${(wall / Math.max(tokensDone, 1)).toFixed(4)} s/token); PEAK RSS ${fmtBytes(peakRssBytes())}` +
        (run.cachedTokens ? `; ${run.cachedTokens} prompt tokens from kept states, not prefilled` : "") +
        `; speculation (${draft}): ${run.accepted} of ${run.drafted} draft tokens accepted` +
        (failed ? `; ${failed} malformed input ${plural(failed, "line")} skipped (exit 1)` : ""),
    );
    if (values.report) {
      const end = io();
      await writeOutput(
        reportTarget!,
        JSON.stringify(
          {
            ...reportHead("batch_report"),
            settings: { ...settings, parallel: inFlight },
            prompts: todo.length,
            parallel: inFlight,
            generated_tokens: tokensDone,
            cached_tokens: run.cachedTokens,
            draft: { mode: draft, drafted: run.drafted, accepted: run.accepted },
            wall_seconds: wall,
            tokens_per_second: tokensDone / wall,
            trunk_bytes_read: end && io0 ? end.trunkBytes - io0.trunkBytes : 0,
            expert_bytes_read: end && io0 ? end.expertBytes - io0.expertBytes : 0,
            peak_rss_bytes: peakRssBytes(),
            ledger: ledgerBetween(start, markLedger(opened.model)),
            memory: snakeKeys(opened.plan),
          },
          null,
          2,
        ) + "\n",
      );
    }
    return failed ? EXIT.runtime : EXIT.ok;
  } finally {
    out.close();
  }
}
