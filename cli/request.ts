/**
 * The one conversion from a request to a task: the flags of `k3 run` and `k3 chat`, a
 * line of `k3 batch` (its own format or an OpenAI Batch line), and an OpenAI body of
 * `k3 serve` each become a {@link Task}: prompt ids, sampling, stop ids and strings, and
 * tokens to generate at most, filled from the one table of defaults, {@link DEFAULTS}
 * (docs/requests.md says why each default is what it is).
 *
 * Every sampling field of every request goes through {@link resolveSampling}: what the
 * request leaves out comes from its row of the table, and the result is checked once.
 *
 * @module
 */

import { K3Error, usageError } from "../engine/errors.ts";
import { CHAT_DEFAULTS, checkSampling, GREEDY, type SamplingParams } from "../engine/generate/sampling.ts";
import { type ChatOptions, chatPromptParts, type MessageSpan, stopIds as chatStopIds } from "../engine/text/chat.ts";
import type { Tokenizer } from "../engine/text/tokenizer.ts";
import { ApiError, type ChatRequest, type CompletionRequest, offeredTools, type RequestSampling } from "./openai.ts";
import type { GrammarSpec } from "../engine/generate/grammar/forms.ts";
import { neutral, type Penalties } from "../engine/generate/penalties.ts";
import { chatGrammar } from "./structured.ts";

/** What one request asks the scheduler to run, whichever command it came from. */
export interface Task {
  /** The prompt as token ids (a chat already rendered with the template). */
  promptIds: number[];
  /** Tokens to generate at most. */
  maxTokens: number;
  /** How each next token is picked. */
  sampling: SamplingParams;
  /** Ids that end generation (the chat template's end ids among them for a chat). */
  stopIds: number[];
  /** Stop strings, matched on the decoded text and never emitted. */
  stops: string[];
  /** A chat: whether the think channel was opened (the reply splits into reasoning and
   * content), and whether its tools channel is parsed into calls (tools declared, and
   * tool_choice not "none"). */
  chat?: { thinking: boolean; tools: boolean };
  /** Log probabilities with `top` alternatives per token, when asked. */
  logprobs?: { top: number };
  /** Generate through the end of the turn (vLLM's ignore_eos). */
  ignoreEos?: boolean;
  /** Constrains the reply (response_format, a forced tool call, `k3 run --grammar`): cli/structured.ts. */
  grammar?: GrammarSpec;
  /** A chat: where its messages lie in the prompt ids (the state cache keeps states at
   * their boundaries). */
  messages?: MessageSpan;
  /** A thinking chat: reasoning tokens before the think channel is closed for the reply
   * (engine/generate/reasoning_budget.ts); undefined: no budget. */
  reasoningBudget?: number;
  /** Logit adjustments applied before each pick (engine/generate/penalties.ts). */
  penalties?: Penalties;
}

/** OpenAI's sampling defaults (temperature 1 over all tokens), for `/v1/completions`. */
const OPENAI_SAMPLING: SamplingParams = Object.freeze({ temperature: 1, topP: 1, topK: 0, minP: 0, seed: 0 });

/** One row of {@link DEFAULTS}: what a kind of request gets for the fields it leaves out. */
export interface RequestDefaults {
  /** Sampling (the seed of an OpenAI request: the command's, see {@link OpenAIContext}). */
  readonly sampling: SamplingParams;
  /** Tokens to generate at most (undefined: up to the room the request has). */
  readonly maxTokens?: number;
}

/**
 * The one table of defaults, a row per kind of request (docs/requests.md says why each
 * is what it is). The seed of an OpenAI request without one is the command's (batch:
 * --seed, so a rerun repeats; serve: a fresh random one per request, as OpenAI's).
 */
export const DEFAULTS: {
  /** `k3 run` and the lines of `k3 batch`: greedy, 8 tokens (--gen). */
  readonly run: Required<RequestDefaults>;
  /** `k3 chat`: the vendor's chat sampling, replies up to 1,024 tokens. */
  readonly chat: Required<RequestDefaults>;
  /** OpenAI `/v1/chat/completions` (serve and batch): the vendor's chat sampling; up to the
   * context (serve) or --gen (batch). */
  readonly openaiChat: RequestDefaults;
  /** OpenAI `/v1/completions` (serve and batch): OpenAI's sampling and 16 tokens. */
  readonly openaiCompletion: Required<RequestDefaults>;
} = Object.freeze({
  run: Object.freeze({ sampling: GREEDY, maxTokens: 8 }),
  chat: Object.freeze({ sampling: CHAT_DEFAULTS, maxTokens: 1024 }),
  openaiChat: Object.freeze({ sampling: CHAT_DEFAULTS }),
  openaiCompletion: Object.freeze({ sampling: OPENAI_SAMPLING, maxTokens: 16 }),
});

/** The most tokens any request may generate. */
export const MAX_TOKENS = 4096;

/**
 * A request's sampling: its own fields over `defaults`, checked (a usage error naming
 * `where` and the first field out of range).
 */
export function resolveSampling(given: RequestSampling, defaults: SamplingParams, where = "sampling"): SamplingParams {
  const p: SamplingParams = {
    temperature: given.temperature ?? defaults.temperature,
    topP: given.topP ?? defaults.topP,
    topK: given.topK ?? defaults.topK,
    minP: given.minP ?? defaults.minP,
    seed: given.seed ?? defaults.seed,
  };
  checkSampling(p, where);
  return p;
}

/** Stop strings from --stop (or a line's "stop"): each non-empty. */
export function stopStrings(stops: string[] | undefined): string[] {
  for (const s of stops ?? []) if (s === "") throw usageError("--stop: a stop string cannot be empty");
  return stops ?? [];
}

/**
 * The prompt ids of a validated OpenAI request: a chat rendered with the template, a text
 * prompt encoded without special tokens, ids as given. Without a tokenizer only ids can
 * be given (400 otherwise); a tokenizer that refuses throws K3Error (the caller says how
 * that is answered).
 */
function openaiPrompt(
  r: ChatRequest | CompletionRequest,
  tokenizer: Tokenizer | undefined,
): { ids: number[]; messages?: MessageSpan } {
  if (r.kind === "chat") {
    if (!tokenizer) throw new ApiError(400, "chat requests need a tokenizer: pass --tok DIR", "messages");
    return chatPromptParts(tokenizer, r.messages, chatOptions(r));
  }
  if (typeof r.prompt !== "string") return { ids: r.prompt };
  if (!tokenizer) throw new ApiError(400, "a text prompt needs a tokenizer: pass --tok DIR (or send ids)", "prompt");
  return { ids: tokenizer.encode(r.prompt, { allowSpecial: false }) };
}

/** The rendering options of a validated chat request (the prompt the released encoder
 * writes for it). */
export function chatOptions(r: ChatRequest, addGenerationPrompt = true): ChatOptions {
  const f = r.responseFormat;
  return {
    thinking: r.thinking,
    effort: r.effort,
    tools: r.tools,
    toolChoice: r.toolChoice,
    responseFormat: f === undefined
      ? undefined
      : f.type === "json_object"
      ? { type: "json_object" }
      : { type: "json_schema", schema: f.schema },
    addGenerationPrompt,
  };
}

/** What an OpenAI request's task takes from the command that runs it. */
export interface OpenAIContext {
  /** Names the chat template's end ids (none: a completion of ids in a batch without one). */
  tokenizer?: Tokenizer;
  /** The seed when the request gives none. */
  seed: number;
  /** Positions one sequence holds, prompt and completion (serve: the context; batch: no bound). */
  capacity: number;
  /** A chat's tokens when the request gives no max_tokens (batch: --gen; default: what fits). */
  chatMaxTokens?: number;
  /** The reasoning budget when the request gives no max_reasoning_tokens (--reasoning-budget). */
  reasoningBudget?: number;
}

/**
 * The reasoning budget of a thinking reply: the request's (else the command's default);
 * with a grammar (a forced call, a response format) at most half of its max tokens, so
 * the constrained part has room after the reasoning. Undefined: no budget.
 */
export function reasoningBudget(
  given: number | undefined,
  constrained: boolean,
  maxTokens: number,
): number | undefined {
  if (!constrained) return given;
  const half = Math.floor(maxTokens / 2);
  return given === undefined ? half : Math.min(given, half);
}

/**
 * The task of a validated OpenAI request: its prompt rendered, its row of
 * {@link DEFAULTS} where it leaves a field out; generation ends at the chat template's
 * end ids unless `ignore_eos` (or there is no tokenizer to name them). Sampling the
 * sampler refuses is the client's error (400).
 */
export function openaiTask(r: ChatRequest | CompletionRequest, ctx: OpenAIContext): Task {
  const { ids: promptIds, messages } = openaiPrompt(r, ctx.tokenizer);
  const chat = r.kind === "chat";
  const row = chat ? DEFAULTS.openaiChat : DEFAULTS.openaiCompletion;
  let sampling: SamplingParams;
  try {
    sampling = resolveSampling(r.sampling, { ...row.sampling, seed: ctx.seed });
  } catch (e) {
    if (e instanceof K3Error) throw new ApiError(400, e.message);
    throw e;
  }
  const room = ctx.capacity - promptIds.length;
  const grammar = chat ? chatGrammar(r) : undefined;
  if (grammar && (r.ignoreEos || !ctx.tokenizer)) {
    throw new ApiError(
      400,
      "structured output ends the reply at an end id: 'ignore_eos' cannot be true with it",
      "ignore_eos",
    );
  }
  const maxTokens = r.maxTokens ??
    (chat ? ctx.chatMaxTokens ?? room : Math.min(DEFAULTS.openaiCompletion.maxTokens, room));
  const budget = chat && r.thinking
    ? reasoningBudget(r.maxReasoningTokens ?? ctx.reasoningBudget, grammar !== undefined, maxTokens)
    : undefined;
  return {
    promptIds,
    maxTokens,
    sampling,
    stopIds: r.ignoreEos || !ctx.tokenizer ? [] : chatStopIds(ctx.tokenizer),
    stops: r.stop,
    chat: chat ? { thinking: r.thinking, tools: offeredTools(r).length > 0 && r.toolChoice !== "none" } : undefined,
    ...(r.logprobs ? { logprobs: { top: r.topLogprobs ?? 0 } } : {}),
    ...(r.ignoreEos ? { ignoreEos: true } : {}),
    ...(grammar ? { grammar } : {}),
    ...(budget !== undefined ? { reasoningBudget: budget } : {}),
    ...(messages !== undefined ? { messages } : {}),
    ...(neutral(r.penalties) ? {} : { penalties: r.penalties }),
  };
}
