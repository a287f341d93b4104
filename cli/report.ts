/**
 * The one report schema: every JSON object k3 writes for a user (`run --out`, the last line
 * of `run --json`, each `batch` result line, `batch --report`, `presets --json`) is built here, snake_case
 * throughout, with the same head (`schema_version`, `k3_version`, `kind`), the settings
 * that produced it, and for each sequence the same fields: `finish_reason`, `usage`
 * (`prompt_tokens`, `completion_tokens`, `total_tokens`), `prefill_seconds` (prompt eval,
 * up to the first token's logits) and `decode_seconds_per_token` (eval, the tokens after).
 * The README documents it ("Reports"). Formats with their own specification are not this
 * schema: the OpenAI wire format of `k3 serve`, the trunk manifest, saved-state headers.
 *
 * @module
 */

import { VERSION } from "./version.ts";
import type { SamplingParams } from "../engine/generate/sampling.ts";
import type { FinishReason } from "../engine/generate/scheduler.ts";
import type { MemoryOptions } from "../engine/weights/plan_input.ts";

/** Version of this schema; bumped when a field changes meaning or goes away. */
export const SCHEMA_VERSION = 1;

/** What wrote the object. */
export type ReportKind = "run" | "run_json_summary" | "batch_result" | "batch_report" | "presets" | "chat";

/** The head every report starts with. */
export interface ReportHead {
  /** Version of the schema (SCHEMA_VERSION). */
  schema_version: number;
  /** The k3 that wrote the object. */
  k3_version: string;
  /** What wrote it. */
  kind: ReportKind;
}

/** The head of a report of `kind`. */
export function reportHead(kind: ReportKind): ReportHead {
  return { schema_version: SCHEMA_VERSION, k3_version: VERSION, kind };
}

/** `camelCase` -> `snake_case`. */
export function snakeName(name: string): string {
  return name.replace(/([a-z0-9])([A-Z])/g, "$1_$2").replace(/([A-Z])([A-Z][a-z])/g, "$1_$2").toLowerCase();
}

/** A copy of `v` with every object key in snake_case (arrays and values kept; NaN -> null). */
export function snakeKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(snakeKeys);
  if (typeof v === "number" && !Number.isFinite(v)) return null;
  if (v === null || typeof v !== "object" || ArrayBuffer.isView(v)) return v;
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [snakeName(k), snakeKeys(x)]));
}

/** The settings that produced a result. */
export interface ReportSettings {
  /** The model directory as given, and resolved. */
  model_dir: string;
  /** The model directory resolved (symbolic links and `..` removed). */
  model_path: string;
  /** Layers run (--layers, else the model's). */
  layers: number;
  /** Tokens to generate at most (--gen; a batch line's "gen" overrides it for that line). */
  gen: number;
  /** Default stop ids (--stop-id). */
  stop_ids: number[];
  /** Stop strings (--stop). */
  stop: string[];
  /** Sampling parameters (temperature 0: greedy). */
  sampling: { temperature: number; top_p: number; top_k: number; min_p: number; seed: number };
  /** Incremental decoding (false: --full-recompute; the same tokens). */
  incremental: boolean;
  /** The memory budget: --trunk, --trunk-gb, --cache-gb, --preset (null: not given). */
  budget: { trunk_dir: string | null; trunk_gb: number | null; cache_gb: number | null; preset: string | null };
  /** Prompt tokens per forward pass: the segment the plan chose (run), or --chunk as
   * asked, `auto` included (batch, recorded before the plan). */
  chunk: number | "auto";
  /** Compute threads. */
  threads: number;
  /** Prompts generated at once (batch; 1 for run). */
  parallel: number;
}

/** Inputs of `reportSettings`. */
export interface SettingsInput {
  /** The model directory as given. */
  modelDir: string;
  /** Layers run. */
  layers: number;
  /** Tokens to generate at most. */
  gen: number;
  /** Default stop ids. */
  stopIds: number[];
  /** Stop strings. */
  stops?: string[];
  /** Sampling parameters. */
  sampling: SamplingParams;
  /** Incremental decoding. */
  incremental: boolean;
  /** The memory flags. */
  memory: MemoryOptions;
  /** Prefill segment (see ReportSettings.chunk). */
  chunk: number | "auto";
  /** Compute threads. */
  threads: number;
  /** Sequences generated at once. */
  parallel: number;
}

function realPath(p: string): string {
  try {
    return Deno.realPathSync(p);
  } catch {
    return p;
  }
}

/** The settings block of a report. */
export function reportSettings(s: SettingsInput): ReportSettings {
  return {
    model_dir: s.modelDir,
    model_path: realPath(s.modelDir),
    layers: s.layers,
    gen: s.gen,
    stop_ids: s.stopIds,
    stop: s.stops ?? [],
    sampling: {
      temperature: s.sampling.temperature,
      top_p: s.sampling.topP,
      top_k: s.sampling.topK,
      min_p: s.sampling.minP,
      seed: s.sampling.seed,
    },
    incremental: s.incremental,
    budget: {
      trunk_dir: s.memory.trunkDir ?? null,
      trunk_gb: s.memory.trunkGB ?? null,
      cache_gb: s.memory.cacheGB ?? null,
      preset: s.memory.preset ?? null,
    },
    chunk: s.chunk,
    threads: s.threads,
    parallel: s.parallel,
  };
}

/**
 * The settings that decide the tokens, for comparing a batch resume: the model, layers,
 * generation length, stops and sampling. Budget, chunk, threads and parallelism never
 * change a token (the bit-identity rule), so a resume may change them freely.
 */
export function tokenSettings(s: ReportSettings): Record<string, unknown> {
  return {
    model_path: s.model_path,
    layers: s.layers,
    gen: s.gen,
    stop_ids: s.stop_ids,
    stop: s.stop,
    sampling: s.sampling,
  };
}

/** The token-deciding settings that differ between `a` (recorded) and `b` (now), as
 * "name: recorded -> now" phrases; empty when a resume is sound. */
export function settingsDiff(a: ReportSettings, b: ReportSettings): string[] {
  const x = tokenSettings(a), y = tokenSettings(b);
  return Object.keys(y).filter((k) => JSON.stringify(x[k]) !== JSON.stringify(y[k])).map((k) =>
    `${k} ${JSON.stringify(x[k])} there, ${JSON.stringify(y[k])} now`
  );
}

/** One sequence's outcome, as the scheduler reports it. */
export interface SequenceOutcome {
  /** Tokens of the prompt. */
  promptTokens: number;
  /** Tokens generated. */
  completionTokens: number;
  /** Why generation ended. */
  finishReason: FinishReason;
  /** Admission to the first token's logits. */
  prefillSeconds: number;
  /** The rest of the sequence's time. */
  decodeSeconds: number;
}

/** Token counts, OpenAI style. */
export interface Usage {
  /** Tokens of the prompt. */
  prompt_tokens: number;
  /** Tokens generated. */
  completion_tokens: number;
  /** Both. */
  total_tokens: number;
}

/** The per-sequence fields of the schema. */
export interface SequenceFields {
  /** Why generation ended: stop, length or interrupted. */
  finish_reason: FinishReason;
  /** Token counts. */
  usage: Usage;
  /** Prompt eval: admission to the first token's logits. */
  prefill_seconds: number;
  /** Prompt tokens per second of prefill. */
  prompt_tokens_per_second: number;
  /** Eval: the time after the first token. */
  decode_seconds: number;
  /** Eval seconds per token after the first. */
  decode_seconds_per_token: number;
}

/** The per-sequence fields for `o`. Decode counts the tokens after the first: the first
 * token's logits end the prefill. */
export function sequenceFields(o: SequenceOutcome): SequenceFields {
  const decoded = Math.max(o.completionTokens - 1, 0);
  return {
    finish_reason: o.finishReason,
    usage: {
      prompt_tokens: o.promptTokens,
      completion_tokens: o.completionTokens,
      total_tokens: o.promptTokens + o.completionTokens,
    },
    prefill_seconds: o.prefillSeconds,
    prompt_tokens_per_second: o.prefillSeconds > 0 ? o.promptTokens / o.prefillSeconds : 0,
    decode_seconds: o.decodeSeconds,
    decode_seconds_per_token: decoded > 0 ? o.decodeSeconds / decoded : 0,
  };
}
