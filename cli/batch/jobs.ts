/**
 * The input of `k3 batch`: JSONL lines read and validated into jobs. A line is either in
 * batch's own format (`id` with `prompt`, `ids` or `messages`) or an OpenAI Batch line
 * (cli/batch/openai_lines.ts); both become a {@link Task} through cli/request.ts.
 * {@link jsonlLines} is the one line splitter of every JSONL reader here (input and the
 * resume scan of the output).
 *
 * @module
 */

import { oneLine } from "../../engine/errors.ts";
import type { SamplingParams } from "../../engine/generate/sampling.ts";
import { chatPrompt, parseHistory, stopIds as chatStopIds } from "../../engine/text/chat.ts";
import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import { DEFAULTS, MAX_TOKENS, resolveSampling, type Task } from "../request.ts";
import { promptLimitText } from "../run_options.ts";
import { type OpenAIRequest, parseOpenAILine } from "./openai_lines.ts";
import { parseJson } from "../../engine/text/json_numbers.ts";

/** One line of a JSONL file: where it lies and whether a newline ends it. */
export interface JsonlLine {
  /** One-based line number. */
  number: number;
  /** Offset of its first byte. */
  start: number;
  /** Offset just past its last byte (the newline excluded). */
  end: number;
  /** False for a last line that no newline ends (torn, or an input's unterminated last line). */
  terminated: boolean;
}

/** The lines of `bytes`, split at each newline (a final newline starts no line). */
export function* jsonlLines(bytes: Uint8Array): Generator<JsonlLine> {
  let start = 0, number = 0;
  while (start < bytes.length) {
    const nl = bytes.indexOf(0x0a, start);
    const end = nl < 0 ? bytes.length : nl;
    yield { number: ++number, start, end, terminated: nl >= 0 };
    start = end + 1;
  }
}

/** One valid input line: its task, and where it came from. */
export interface Job extends Task {
  /** Line number in the input file (one-based). */
  line: number;
  /** The line's id, as given. */
  id: string | number;
  /** JSON of the id: 1 and "1" are different ids (an OpenAI line's: `custom_id:` and its JSON). */
  key: string;
  /** An OpenAI Batch line. */
  openai?: OpenAIRequest;
  /** A line answered without generating (an OpenAI request that did not validate). */
  immediate?: Record<string, unknown>;
}

/** What the command gives every line (a line's own fields override). */
export interface JobDefaults {
  /** Token ids must be below this. */
  vocab: number;
  /** The longest prompt in ids: the model's window (model/config.ts modelWindow). */
  maxPromptIds: number;
  /** --gen. */
  gen: number;
  /** --stop-id, checked. */
  stopIds: number[];
  /** The tokenizer, loaded on first use (undefined: none). */
  tokenizer: () => Tokenizer | undefined;
  /** The sampling flags (default: run's row of the defaults, greedy). */
  sampling?: SamplingParams;
  /** --stop. */
  stops?: string[];
  /** The model name an OpenAI response echoes when its body names none. */
  modelName?: string;
  /** --reasoning-budget: the budget of thinking chat lines that give none. */
  reasoningBudget?: number;
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
  const num = (k: string) => {
    if (o[k] === undefined) return undefined;
    if (typeof o[k] !== "number") throw new Error(`"${k}" must be a number, got ${JSON.stringify(o[k])}`);
    return o[k] as number;
  };
  try {
    return resolveSampling({
      temperature: num("temperature"),
      topP: num("top_p"),
      topK: num("top_k"),
      minP: num("min_p"),
      seed: num("seed"),
    }, base);
  } catch (e) {
    throw new Error((e as Error).message.replace(/^sampling: /, ""));
  }
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

/** The job of an OpenAI Batch line (`o` has `custom_id`). */
function openaiJob(o: Record<string, unknown>, line: number, opts: JobDefaults, base: SamplingParams): Job {
  const r = parseOpenAILine(o, {
    vocab: opts.vocab,
    maxPromptIds: opts.maxPromptIds,
    gen: opts.gen,
    seed: base.seed,
    modelName: opts.modelName ?? "kimi-k3",
    tokenizer: opts.tokenizer,
    reasoningBudget: opts.reasoningBudget,
  });
  const customId = "result" in r ? r.customId : r.request.customId;
  const key = `custom_id:${JSON.stringify(customId)}`;
  if ("result" in r) {
    return {
      line,
      id: customId,
      key,
      promptIds: [],
      maxTokens: 0,
      stopIds: [],
      stops: [],
      sampling: base,
      immediate: r.result,
    };
  }
  return { ...r.request.task, line, id: customId, key, openai: r.request };
}

/**
 * Parses one input line into a job, or throws an Error whose message says what is wrong
 * (without the line number).
 */
export function parseJob(text: string, line: number, opts: JobDefaults): Job {
  const base = opts.sampling ?? DEFAULTS.run.sampling;
  let v: unknown;
  try {
    v = parseJson(text);
  } catch (e) {
    throw new Error(`not JSON: ${(e as Error).message}`);
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw new Error("expected a JSON object");
  }
  const o = v as Record<string, unknown>;
  if (o.custom_id !== undefined) return openaiJob(o, line, opts, base);
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
  let chat: { thinking: boolean; tools: boolean } | undefined;
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
    chat = { thinking: o.thinking !== false, tools: false };
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
  if (promptIds.length > opts.maxPromptIds) throw new Error(promptLimitText(promptIds.length, opts.maxPromptIds));
  let maxTokens = opts.gen;
  if (o.gen !== undefined) {
    if (typeof o.gen !== "number" || !Number.isInteger(o.gen) || o.gen < 1 || o.gen > MAX_TOKENS) {
      throw new Error(`"gen" must be an integer in 1..${MAX_TOKENS}, got ${JSON.stringify(o.gen)}`);
    }
    maxTokens = o.gen;
  }
  let stopIds = o.stop_ids === undefined ? opts.stopIds : idList(o.stop_ids, "stop_ids", opts.vocab);
  if (chat) stopIds = [...new Set([...stopIds, ...chatStopIds(opts.tokenizer()!)])];
  const stops = lineStops(o.stop, opts.stops ?? []);
  if (stops.length > 0 && !opts.tokenizer()) throw new Error(`"stop" needs a tokenizer: pass --tok DIR`);
  const sampling = lineSampling(o, base);
  return { line, id, key: JSON.stringify(id), promptIds, maxTokens, stopIds, stops, sampling, chat };
}

/** The jobs of an input file, and how many lines were malformed (each reported on stderr). */
export function readJobs(
  input: Uint8Array,
  inputName: string,
  opts: JobDefaults,
): { jobs: Job[]; failed: number } {
  const jobs: Job[] = [];
  const seen = new Set<string>();
  let failed = 0;
  const fail = (line: number, why: string) => {
    failed++;
    console.error(`k3: batch: ${oneLine(`${inputName}:${line}: ${why}`)}; skipped`);
  };
  const dec = new TextDecoder("utf-8", { fatal: true });
  for (const l of jsonlLines(input)) {
    let text: string;
    try {
      text = dec.decode(input.subarray(l.start, l.end));
    } catch {
      fail(l.number, "not valid UTF-8");
      continue;
    }
    if (text.trim() === "") continue;
    try {
      const job = parseJob(text, l.number, opts);
      if (seen.has(job.key)) {
        fail(l.number, `duplicate id ${job.key}`);
        continue;
      }
      seen.add(job.key);
      jobs.push(job);
    } catch (e) {
      fail(l.number, (e as Error).message);
    }
  }
  return { jobs, failed };
}
