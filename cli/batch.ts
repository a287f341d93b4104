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

import { EXIT, K3Error, oneLine, usageError } from "../engine/errors.ts";
import { Scheduler, type SequenceResult } from "../engine/generate/scheduler.ts";
import { ledgerBetween, type LedgerMark, type LedgerReport, markLedger } from "../engine/generate/ledger.ts";
import { openModel, readModelConfig } from "../engine/open.ts";
import type { IoStats } from "../engine/model/weight_source.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { readProblem } from "../engine/paths.ts";
import { makeSampler, type SamplingParams } from "../engine/generate/sampling.ts";
import { StopMatcher } from "../engine/generate/stops.ts";
import { chatPrompt, parseHistory, splitChannels, stopIds as chatStopIds } from "../engine/text/chat.ts";
import { type OpenAIRequest, openaiResultLine, parseOpenAILine } from "./batch_openai.ts";
import { fmtBytes, parseIds, peakRssBytes, plural } from "./common.ts";
import { reportHead, type ReportSettings, reportSettings, sequenceFields, settingsDiff, snakeKeys } from "./report.ts";
import {
  notRegular,
  openDirect,
  prepareOutput,
  readInput,
  writeAllSync,
  writeFailure,
  writeOutput,
  type Writer,
} from "../engine/native/files.ts";
import { fmtDuration, progress } from "./progress.ts";
import {
  GENERATION_FLAGS,
  GENERATION_HELP,
  generationOptions,
  loadModelTokenizer,
  MAX_PROMPT_IDS,
  MEMORY_FLAGS,
  MEMORY_HELP,
  memoryOptions,
  parseFlags,
  SAMPLING_FLAGS,
  samplingHelp,
  samplingOptions,
  tokenizerDir,
} from "./run_options.ts";

/** Usage text of `k3 batch`. */
export const USAGE = `usage: k3 batch <model_dir> --input PROMPTS.jsonl --output RESULTS.jsonl [options]

Greedy generation for every prompt of a JSONL file, opening the model once.

input, one JSON object per line (blank lines are ignored):
  {"id": "a1", "prompt": "Once upon a time"}           text (needs a tokenizer)
  {"id": 2, "ids": [1, 2, 3], "gen": 16, "stop_ids": [770]}
  id        string or number, unique in the file
  {"id": "c", "messages": [{"role": "user", "content": "Hi"}], "thinking": false,
   "temperature": 0.7, "seed": 3, "stop": ["\n\n"]}
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
                    reads (default auto: as many as the memory plan holds, up to 16);
                    results are written in finishing order
  --report FILE     write a JSON summary of the whole run (atomically)
  --force-resume    add to an --output made with other settings (see above)
${GENERATION_HELP}
${samplingHelp("default: greedy; a line's own fields override")}
${MEMORY_HELP}
  -h, --help        this help

example:
  k3 batch tests/fixtures/tiny --input prompts.jsonl --output results.jsonl --gen 16
`;

/** One valid input line. */
export interface Job {
  /** Line number in the input file (one-based). */
  line: number;
  /** The line's id, as given. */
  id: string | number;
  /** JSON of the id: 1 and "1" are different ids. */
  key: string;
  /** Prompt token ids (encoded from "prompt", or "ids"). */
  promptIds: number[];
  /** Tokens to generate at most. */
  gen: number;
  /** Ids that end generation after they are emitted. */
  stopIds: number[];
  /** Stop strings (matched on the decoded text). */
  stops: string[];
  /** This line's sampling. */
  sampling: SamplingParams;
  /** A chat line: whether the think channel was opened. */
  chat?: { thinking: boolean };
  /** An OpenAI Batch line. */
  openai?: OpenAIRequest;
  /** A line answered without generating (an OpenAI request that did not validate). */
  immediate?: Record<string, unknown>;
}

/** What a job line may hold. */
const FIELDS = new Set([
  "id",
  "prompt",
  "ids",
  "messages",
  "thinking",
  "effort",
  "gen",
  "stop_ids",
  "stop",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "seed",
]);

/** A line's sampling: its own fields over the flags'. */
function lineSampling(o: Record<string, unknown>, base: SamplingParams): SamplingParams {
  const num = (k: string, d: number) => {
    if (o[k] === undefined) return d;
    if (typeof o[k] !== "number") throw new Error(`"${k}" must be a number, got ${JSON.stringify(o[k])}`);
    return o[k] as number;
  };
  const p = {
    temperature: num("temperature", base.temperature),
    topP: num("top_p", base.topP),
    topK: num("top_k", base.topK),
    minP: num("min_p", base.minP),
    seed: num("seed", base.seed),
  };
  try {
    makeSampler(p);
  } catch (e) {
    throw new Error((e as Error).message.replace(/^sampling: /, ""));
  }
  return p;
}

/** A line's stop strings: a string or an array of non-empty strings. */
function lineStops(v: unknown, dflt: string[]): string[] {
  if (v === undefined) return dflt;
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list) || list.some((x) => typeof x !== "string" || x === "")) {
    throw new Error(`"stop" must be a non-empty string or an array of them`);
  }
  return list as string[];
}

function idList(v: unknown, field: string, vocab: number): number[] {
  if (!Array.isArray(v)) throw new Error(`"${field}" must be an array of token ids`);
  for (const x of v) {
    if (typeof x !== "number" || !Number.isInteger(x) || x < 0) {
      throw new Error(`"${field}" must hold non-negative integers, got ${JSON.stringify(x)}`);
    }
    if (x >= vocab) {
      throw new Error(`"${field}": id ${x} is outside the vocabulary (0..${vocab - 1})`);
    }
  }
  return v as number[];
}

/**
 * Parses one input line into a job, or throws an Error whose message says what is wrong
 * (without the line number).
 */
export function parseJob(
  text: string,
  line: number,
  opts: {
    vocab: number;
    gen: number;
    stopIds: number[];
    tokenizer: () => Tokenizer | undefined;
    sampling?: SamplingParams;
    stops?: string[];
    modelName?: string;
  },
): Job {
  const base = opts.sampling ?? { temperature: 0, topP: 1, topK: 0, minP: 0, seed: 0 };
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    throw new Error(`not JSON: ${(e as Error).message}`);
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw new Error("expected a JSON object");
  }
  const o = v as Record<string, unknown>;
  if (o.custom_id !== undefined) {
    const r = parseOpenAILine(o, {
      vocab: opts.vocab,
      gen: opts.gen,
      seed: base.seed,
      modelName: opts.modelName ?? "kimi-k3",
      tokenizer: opts.tokenizer,
    });
    const key = `custom_id:${JSON.stringify("result" in r ? r.customId : r.request.customId)}`;
    if ("result" in r) {
      return {
        line,
        id: r.customId,
        key,
        promptIds: [],
        gen: 0,
        stopIds: [],
        stops: [],
        sampling: base,
        immediate: r.result,
      };
    }
    const q = r.request;
    return {
      line,
      id: q.customId,
      key,
      promptIds: q.promptIds,
      gen: q.maxTokens,
      stopIds: q.endpoint === "chat" ? chatStopIds(opts.tokenizer()!) : [],
      stops: q.stops,
      sampling: q.sampling,
      openai: q,
    };
  }
  const unknown = Object.keys(o).find((k) => !FIELDS.has(k));
  if (unknown !== undefined) {
    throw new Error(`unknown field ${JSON.stringify(unknown)} (fields: ${[...FIELDS].join(", ")})`);
  }
  const id = o.id;
  if (!(typeof id === "string" || (typeof id === "number" && Number.isFinite(id)))) {
    throw new Error(`"id" must be a string or a number`);
  }
  const given = ["prompt", "ids", "messages"].filter((k) => o[k] !== undefined);
  if (given.length !== 1) {
    throw new Error(
      given.length
        ? `give one of ${given.map((g) => `"${g}"`).join(" and ")}, not ${given.length === 2 ? "both" : "all"}`
        : `a "prompt" (text), "ids" (token ids) or "messages" (a chat) is required`,
    );
  }
  if (o.messages === undefined && (o.thinking !== undefined || o.effort !== undefined)) {
    throw new Error(`"thinking" and "effort" go with "messages"`);
  }
  let promptIds: number[];
  let chat: { thinking: boolean } | undefined;
  if (o.ids !== undefined) promptIds = idList(o.ids, "ids", opts.vocab);
  else if (o.messages !== undefined) {
    if (!Array.isArray(o.messages) || o.messages.length === 0) {
      throw new Error(`"messages" must be a non-empty array of {"role", "content"}`);
    }
    const tok = opts.tokenizer();
    if (!tok) throw new Error(`"messages" needs a tokenizer: pass --tok DIR`);
    if (o.thinking !== undefined && typeof o.thinking !== "boolean") throw new Error(`"thinking" must be a boolean`);
    if (o.effort !== undefined && typeof o.effort !== "string") throw new Error(`"effort" must be a string`);
    const messages = (() => {
      try {
        return parseHistory(o.messages.map((m) => JSON.stringify(m)).join("\n"), "messages");
      } catch (e) {
        throw new Error(`"messages": ${(e as Error).message.replace(/^messages:(\d+):/, "message $1:")}`);
      }
    })();
    chat = { thinking: o.thinking !== false };
    try {
      promptIds = chatPrompt(tok, messages, { thinking: chat.thinking, effort: o.effort as string | undefined });
    } catch (e) {
      throw new Error((e as Error).message);
    }
  } else {
    if (typeof o.prompt !== "string") throw new Error(`"prompt" must be a string`);
    const tok = opts.tokenizer();
    if (!tok) throw new Error(`"prompt" needs a tokenizer: pass --tok DIR (or use "ids")`);
    promptIds = tok.encode(o.prompt, { allowSpecial: false });
    const bad = promptIds.find((x) => x >= opts.vocab);
    if (bad !== undefined) {
      throw new Error(
        `the tokenizer produced id ${bad}, outside the model's vocabulary of ${opts.vocab}`,
      );
    }
  }
  if (promptIds.length === 0) throw new Error("the prompt is empty");
  if (promptIds.length > MAX_PROMPT_IDS) {
    throw new Error(`the prompt has ${promptIds.length} ids, at most ${MAX_PROMPT_IDS}`);
  }
  let gen = opts.gen;
  if (o.gen !== undefined) {
    if (typeof o.gen !== "number" || !Number.isInteger(o.gen) || o.gen < 1 || o.gen > 4096) {
      throw new Error(`"gen" must be an integer in 1..4096, got ${JSON.stringify(o.gen)}`);
    }
    gen = o.gen;
  }
  let stopIds = o.stop_ids === undefined ? opts.stopIds : idList(o.stop_ids, "stop_ids", opts.vocab);
  if (chat) stopIds = [...new Set([...stopIds, ...chatStopIds(opts.tokenizer()!)])];
  const stops = lineStops(o.stop, opts.stops ?? []);
  if (stops.length > 0 && !opts.tokenizer()) throw new Error(`"stop" needs a tokenizer: pass --tok DIR`);
  const sampling = lineSampling(o, base);
  return { line, id, key: JSON.stringify(id), promptIds, gen, stopIds, stops, sampling, chat };
}

/** The longest result line the resume scan accepts (a longer one is not ours). */
const MAX_RESULT_LINE = 64 << 20;

/**
 * Ids already in an output file, and the settings each line records (undefined: a line
 * from before settings were recorded); a torn or unreadable last line is cut away. Only a
 * regular file is scanned (a device or FIFO is never read), and lines are bounded.
 */
export async function readDone(
  path: string,
): Promise<{ done: Set<string>; cutBytes: number; lines: number; settings: (ReportSettings | undefined)[] }> {
  const why = notRegular(path);
  if (why === "no such file") return { done: new Set(), cutBytes: 0, lines: 0, settings: [] };
  if (why !== undefined) throw new K3Error(`--output: cannot resume from ${path}: ${why}`);
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(path);
  } catch (e) {
    throw new K3Error(`--output: cannot read ${readProblem(path, e)}`);
  }
  const done = new Set<string>();
  const settings: (ReportSettings | undefined)[] = [];
  const dec = new TextDecoder("utf-8", { fatal: true });
  let start = 0, lineNo = 0, keep = 0;
  while (start < bytes.length) {
    const nl = bytes.indexOf(0x0a, start);
    const end = nl < 0 ? bytes.length : nl;
    lineNo++;
    if (end - start > MAX_RESULT_LINE) {
      throw new K3Error(`--output: ${path}:${lineNo} is longer than any result line; refusing to append to this file`);
    }
    let key: string | undefined;
    if (nl >= 0) {
      try {
        const v = JSON.parse(dec.decode(bytes.subarray(start, end)));
        if (
          v && typeof v === "object" && (typeof v.id === "string" || typeof v.id === "number") &&
          Array.isArray(v.generated_ids)
        ) {
          key = JSON.stringify(v.id);
          settings.push(v.settings && typeof v.settings === "object" ? v.settings : undefined);
        } else if (
          // An OpenAI Batch output line (its format has no settings to record).
          v && typeof v === "object" && typeof v.custom_id === "string" && "response" in v && "error" in v
        ) key = `custom_id:${JSON.stringify(v.custom_id)}`;
      } catch { /* not a result line */ }
    }
    if (key === undefined) {
      // Only the last line can be torn (we write whole lines); anything else is not ours.
      const last = nl < 0 || nl === bytes.length - 1;
      if (!last) {
        throw new K3Error(
          `--output: ${path}:${lineNo} is not a result line; refusing to append to this file`,
        );
      }
      break;
    }
    done.add(key);
    keep = end + 1;
    start = end + 1;
  }
  const cutBytes = bytes.length - keep;
  if (cutBytes > 0) await Deno.truncate(path, keep);
  return { done, cutBytes, lines: done.size, settings };
}

/** Bytes read and expert-cache hits of one prompt (streamed weights only). */
function ioDelta(a: IoStats | undefined, b: IoStats | undefined, ledger: LedgerReport): Record<string, number> {
  if (!a || !b) return {};
  const hits = b.expertHits - a.expertHits, lookups = hits + b.expertMisses - a.expertMisses;
  return {
    trunk_bytes_read: b.trunkBytes - a.trunkBytes,
    expert_bytes_read: b.expertBytes - a.expertBytes,
    expert_cache_hit_rate: lookups ? hits / lookups : 0,
    io_wait_seconds: ledger.trunk_read_wait_seconds + ledger.expert_read_wait_seconds,
  };
}

/** Why the recorded settings of an output file do not fit this run (the token-deciding
 * ones: cli/report.ts tokenSettings), or undefined when a resume is sound. */
export function resumeMismatch(recorded: (ReportSettings | undefined)[], now: ReportSettings): string | undefined {
  if (recorded.length === 0) return undefined;
  if (recorded.some((s) => s === undefined)) return "lines without recorded settings, from an older k3";
  for (const s of recorded) {
    const diff = settingsDiff(s!, now);
    if (diff.length) return diff.join("; ");
  }
  return undefined;
}

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

/** Writes all of `data` (write may be partial). */
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
  const memory = memoryOptions(tokens);
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
  const jobs: Job[] = [];
  const seen = new Set<string>();
  let failed = 0;
  const fail = (line: number, why: string) => {
    failed++;
    console.error(`k3: batch: ${oneLine(`${values.input}:${line}: ${why}`)}; skipped`);
  };
  const dec = new TextDecoder("utf-8", { fatal: true });
  const lines = (() => {
    const out: Uint8Array[] = [];
    let s = 0;
    while (s <= inputBytes.length) {
      const nl = inputBytes.indexOf(0x0a, s);
      const e = nl < 0 ? inputBytes.length : nl;
      out.push(inputBytes.subarray(s, e));
      if (nl < 0) break;
      s = nl + 1;
    }
    return out;
  })();
  lines.forEach((raw, i) => {
    let text: string;
    try {
      text = dec.decode(raw);
    } catch {
      return fail(i + 1, "not valid UTF-8");
    }
    if (text.trim() === "") return;
    try {
      const job = parseJob(text, i + 1, {
        vocab: cfg.vocabSize,
        gen: genOpts.gen,
        stopIds,
        tokenizer: getTokenizer,
        sampling,
        stops: genOpts.stops,
        modelName: dir.replace(/\/+$/, "").split("/").pop() || "kimi-k3",
      });
      if (seen.has(job.key)) return fail(i + 1, `duplicate id ${job.key}`);
      seen.add(job.key);
      jobs.push(job);
    } catch (e) {
      fail(i + 1, (e as Error).message);
    }
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
  let out: Deno.FsFile | Writer | typeof Deno.stdout;
  try {
    out = target.kind === "stdout"
      ? Deno.stdout
      : target.kind === "atomic"
      ? await Deno.open(target.real, { append: true, create: true })
      : await openDirect(target.real);
  } catch (e) {
    throw new K3Error(`--output: cannot open ${readProblem(values.output, e)}`);
  }
  // Appends one result line durably; on a failed write the partial line is cut away.
  const appendLine = (bytes: Uint8Array) => {
    if (!(out instanceof Deno.FsFile) || target.kind !== "atomic") {
      try {
        writeAllSync(out, bytes);
      } catch (e) {
        throw writeFailure(values.output!, bytes.length, e);
      }
      return;
    }
    const f = out;
    const before = f.statSync().size;
    try {
      writeAllSync(f, bytes);
      f.syncSync();
    } catch (e) {
      try {
        f.truncateSync(before);
      } catch { /* the failure below is what matters */ }
      throw writeFailure(values.output!, bytes.length, e);
    }
  };
  try {
    // OpenAI requests that did not validate are answered at once (status 400), as the
    // Batch API does.
    for (const job of todo.filter((j) => j.immediate)) {
      appendLine(new TextEncoder().encode(JSON.stringify(job.immediate) + "\n"));
      console.error(`k3: batch: ${values.input}:${job.line}: custom_id ${job.key.slice(10)}: answered 400`);
    }
    todo = todo.filter((j) => !j.immediate);
    if (todo.length === 0) return failed ? EXIT.runtime : EXIT.ok;
    const capacity = todo.reduce((m, j) => Math.max(m, j.promptIds.length + j.gen), 0);
    const t0 = performance.now();
    const opened = await openModel(config, {
      capacity,
      chunk: genOpts.chunk,
      sequences: Math.min(parallel ?? MAX_AUTO_PARALLEL, todo.length),
      autoSequences: parallel === undefined,
      threads: genOpts.threads,
      memory,
      log: (line) => console.error(`k3: ${line}`),
      onProgress: (what, d, n) => progress(what, d, n),
    });
    const inFlight = opened.plan.state.sequences;
    console.error(
      `k3: ${dir}: ${cfg.numLayers} layers, hidden ${cfg.hiddenSize}, vocab ${cfg.vocabSize}; capacity ${capacity} positions; ${inFlight} ${
        inFlight === 1 ? "prompt" : "prompts"
      } at a time; ready in ${((performance.now() - t0) / 1000).toFixed(2)} s`,
    );
    const enc = new TextEncoder();
    const weights = opened.model.weights;
    const io = () => weights.ioStats?.();
    const io0 = io();
    let tokensDone = 0, finished = 0;
    const t1 = performance.now();
    const start = markLedger(opened.model);
    const scheduler = new Scheduler(opened.model, { maxSequences: inFlight, chunk: opened.plan.chunk });
    // A prompt whose output is unsound stops the run: the others are interrupted and not
    // written (they would resume on a rerun), results already written stay.
    const stop = new AbortController();
    let unsound: unknown;
    const write = (job: Job, r: SequenceResult, admitted: LedgerMark, text: string) => {
      const ledger = ledgerBetween(admitted, markLedger(opened.model));
      const ids = r.tokens;
      const seconds = r.prefillSeconds + r.decodeSeconds;
      const result = job.openai
        ? openaiResultLine(job.openai, {
          text,
          finishReason: r.finishReason as "stop" | "length",
          completionTokens: ids.length,
        })
        : {
          ...reportHead("batch_result"),
          id: job.id,
          ...sequenceFields({
            promptTokens: job.promptIds.length,
            completionTokens: ids.length,
            finishReason: r.finishReason,
            prefillSeconds: r.prefillSeconds,
            decodeSeconds: r.decodeSeconds,
          }),
          prompt_ids: job.promptIds,
          generated_ids: ids,
          generated_text: tokenizer ? text : null,
          ...(job.chat ? splitChannels(text, job.chat.thinking) : {}),
          seconds,
          seconds_per_token: seconds / Math.max(ids.length, 1),
          ...ioDelta(admitted.io, io(), ledger),
          // From admission to finish; with --parallel > 1 the passes were shared.
          ledger,
          settings: { ...settings, parallel: inFlight },
        };
      appendLine(enc.encode(JSON.stringify(result) + "\n"));
      finished++;
      tokensDone += ids.length;
      const elapsed = (performance.now() - t1) / 1000;
      const now = io();
      const bytes = now && io0 ? now.trunkBytes + now.expertBytes - io0.trunkBytes - io0.expertBytes : 0;
      const left = todo.length - finished;
      console.error(
        `k3: batch: ${finished}/${todo.length} done (id ${job.key}: ${ids.length} ${plural(ids.length, "token")} in ${
          seconds.toFixed(3)
        } s); ` +
          `${tokensDone} tokens, ${(tokensDone / elapsed).toFixed(2)} tok/s` +
          (now ? `, ${fmtBytes(Math.round(bytes / Math.max(tokensDone, 1)))} read/token` : "") +
          `, ETA ${left ? fmtDuration((elapsed / finished) * left) : "0 s"}`,
      );
    };
    try {
      await Promise.all(todo.map((job) => {
        let admitted = markLedger(opened.model);
        // The text as it is generated: stop strings cut, a chat's closing stop id left out.
        const matcher = tokenizer ? new StopMatcher(tokenizer, job.stops) : undefined;
        let text = "";
        return scheduler.submit({
          prompt: job.promptIds,
          maxTokens: job.gen,
          stopIds: job.stopIds,
          choose: makeSampler(job.sampling),
          onToken: (token) => {
            if (!matcher || ((job.chat || job.openai) && job.stopIds.includes(token))) return;
            const r = matcher.push(token);
            text += r.text;
            return r.stopped;
          },
          recompute: !genOpts.incremental,
          signal: stop.signal,
          onAdmit: () => (admitted = markLedger(opened.model)),
        }).then(
          (r) => {
            if (matcher && !matcher.stopped) text += matcher.flush();
            try {
              if (r.finishReason !== "interrupted") write(job, r, admitted, text);
            } catch (e) {
              unsound ??= e; // a failed write stops the run like an unsound output
              stop.abort();
            }
          },
          (e) => {
            unsound ??= e;
            stop.abort();
          },
        );
      }));
      if (unsound) throw unsound;
    } finally {
      await scheduler.close();
      await opened.close();
    }
    const wall = (performance.now() - t1) / 1000;
    console.error(
      `k3: batch: ${todo.length} ${plural(todo.length, "prompt")}, ${tokensDone} ${plural(tokensDone, "token")} in ${
        wall.toFixed(3)
      } s (${(wall / Math.max(tokensDone, 1)).toFixed(4)} s/token); PEAK RSS ${fmtBytes(peakRssBytes())}` +
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
    if (out !== Deno.stdout) out.close();
  }
}
