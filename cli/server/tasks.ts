/**
 * From a parsed OpenAI request to a scheduled sequence and its result, for `k3 serve`:
 * the body is validated (cli/openai.ts), its model name checked, its prompt rendered and
 * fitted to one sequence's context, and the request turned into a task by the one
 * conversion (cli/request.ts); the task then runs as one scheduler sequence with its own
 * sampler and stop matcher.
 *
 * @module
 */

import { withPenalties } from "../../engine/generate/penalties.ts";
import type { SharedPrefill } from "../../engine/generate/shared_prefill.ts";
import type { Scheduler, SequenceResult } from "../../engine/generate/scheduler.ts";
import { makeSampler } from "../../engine/generate/sampling.ts";
import type { TokenLogprob } from "../../engine/generate/logprobs.ts";
import type { ReplyEvent } from "../../engine/text/xtml.ts";
import { chatCachePoints, type StateCache } from "../../engine/generate/state_cache.ts";
import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import type { Ledger } from "../../engine/model/ledger.ts";
import { K3Error } from "../../engine/errors.ts";
import { type ChatRequest, type CompletionRequest, parseChatRequest, parseCompletionRequest } from "../openai.ts";
import { ApiError } from "../openai_error.ts";
import { openaiTask, type Task } from "../request.ts";
import { type ReplyShape, ReplyStream, shownMessage } from "../reply.ts";
import { taskFilter } from "../structured.ts";
import type { SequenceWatch, StatusHub } from "./status.ts";

/** What the server generates with, available once the model is loaded. */
export interface ServeEngine {
  /** Runs every request as a sequence of the batch. */
  scheduler: Pick<Scheduler, "submit" | "queued" | "active">;
  /** Renders prompts and decodes replies. */
  tokenizer: Tokenizer;
  /** Positions one sequence can hold: prompt plus generated tokens. */
  capacity: number;
  /** Token ids must be below this. */
  vocabSize: number;
  /** Bytes read from disk so far (trunk and experts). */
  bytesRead: () => number;
  /** The model's ledger now: its passes' seconds and rows, prefill and decode apart
   * (engine/model/ledger.ts; absent: /metrics says nothing of passes). */
  ledger?: () => Pick<Ledger, "prefillPassSeconds" | "prefillPassRows" | "decodePassSeconds" | "decodePassRows">;
  /** The conversation state cache the scheduler continues from (undefined: off). */
  stateCache?: Pick<StateCache, "stats">;
  /** The reasoning budget of chat requests that give none (--reasoning-budget). */
  reasoningBudget?: number;
  /** The status stream's hub (cli/server/status.ts; undefined: no status stream). */
  status?: StatusHub;
}

/** A validated request and the task it runs. */
export interface ServeTask {
  /** The request as parsed (its endpoint, stream and usage options). */
  request: ChatRequest | CompletionRequest;
  /** What the scheduler runs. */
  task: Task;
}

/** What one generation request produced, for its response, log line and metrics. */
export interface Outcome {
  /** The scheduler's result. */
  result: SequenceResult;
  /** Text emitted (a completion's text; a chat's content), stop strings and ids excluded. */
  text: string;
  /** The reply as read: channels, tool calls, log probabilities. */
  reply: ReplyStream;
  /** Of the tokens generated, those of the think channel (set by the server). */
  reasoningTokens?: number;
}

/** What a task hands out as it runs: events now safe to send, and a token's log probabilities. */
export type Emit = (events: ReplyEvent[], logprob: TokenLogprob | undefined, reply: ReplyStream) => void;

/** The reply reader of a task (its chat shape, stops and log probabilities). */
export function taskReply(tokenizer: Tokenizer, task: Task, callId?: (index: number) => string): ReplyStream {
  return new ReplyStream(tokenizer, { ...replyShape(task), callId });
}

/** How a task's reply is read. */
function replyShape(task: Task): ReplyShape {
  return { chat: task.chat, stops: task.stops, logprobs: task.logprobs, ignoreEos: task.ignoreEos };
}

/** Checks the prompt and max_tokens against what one sequence can hold. */
function checkFits(e: ServeEngine, r: ChatRequest | CompletionRequest, prompt: number[]): void {
  const param = r.kind === "chat" ? "messages" : "prompt";
  if (prompt.length === 0) throw new ApiError(400, "the prompt is empty", param);
  if (prompt.length >= e.capacity) {
    throw new ApiError(
      400,
      `this server's context is ${e.capacity} tokens (prompt plus completion); the prompt has ${prompt.length}`,
      param,
      "context_length_exceeded",
    );
  }
  if (r.maxTokens !== undefined && prompt.length + r.maxTokens > e.capacity) {
    throw new ApiError(
      400,
      `this server's context is ${e.capacity} tokens; ${prompt.length} prompt tokens plus '${r.maxTokensParam}' ${r.maxTokens} do not fit (at most ${
        e.capacity - prompt.length
      })`,
      r.maxTokensParam,
      "context_length_exceeded",
    );
  }
}

/**
 * Validates a request body of `kind` for the model named `modelName` and turns it into a
 * task that fits one sequence; throws ApiError (400, 404) naming what is wrong. A request
 * without a seed gets a random one.
 */
export function serveTask(
  e: ServeEngine,
  kind: "chat" | "completion",
  body: unknown,
  modelNames: readonly string[],
): ServeTask {
  const r = kind === "chat" ? parseChatRequest(body) : parseCompletionRequest(body, e.vocabSize);
  if (r.model !== undefined && !modelNames.includes(r.model)) {
    throw new ApiError(
      404,
      `the model '${r.model}' does not exist (this server has ${modelNames.map((n) => `'${n}'`).join(", ")})`,
      "model",
      "model_not_found",
    );
  }
  const outside = [...r.penalties.bias.keys()].find((id) => id >= e.vocabSize);
  if (outside !== undefined) {
    throw new ApiError(400, `'logit_bias' names token ${outside}, outside the vocabulary`, `logit_bias.${outside}`);
  }
  let task: Task;
  try {
    task = openaiTask(r, {
      tokenizer: e.tokenizer,
      seed: crypto.getRandomValues(new Uint32Array(1))[0],
      capacity: e.capacity,
      reasoningBudget: e.reasoningBudget,
    });
  } catch (err) {
    if (err instanceof K3Error) throw new ApiError(400, err.message, r.kind === "chat" ? "messages" : "prompt");
    throw err;
  }
  checkFits(e, r, task.promptIds);
  return { request: r, task };
}

/** Prompts in one completions request at most. */
export const MAX_PROMPTS = 128;

/**
 * A completions body whose `prompt` lists several prompts (texts, or lists of ids) as one
 * body per prompt, as OpenAI and vLLM serve them; any other body as itself.
 */
export function promptBodies(body: unknown): unknown[] {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return [body];
  const b = body as Record<string, unknown>;
  const list = b.prompt;
  if (!Array.isArray(list) || list.length < 2 || !list.every((p) => typeof p === "string" || Array.isArray(p))) {
    return [body];
  }
  if (list.length > MAX_PROMPTS) {
    throw new ApiError(400, `'prompt' holds ${list.length} prompts, at most ${MAX_PROMPTS}`, "prompt");
  }
  return list.map((prompt) => ({ ...b, prompt }));
}

/** Runs a task as one scheduler sequence; `emit` gets events as they become safe to send,
 * `watch` (the status stream's) its admission, prefill progress and tokens; `shared`: the
 * choices of its prompt it is one of (the prompt prefilled once for all). */
export async function runTask(
  e: ServeEngine,
  task: Task,
  signal: AbortSignal,
  emit: Emit,
  onFirstToken: () => void,
  watch?: SequenceWatch,
  shared?: SharedPrefill,
): Promise<Outcome> {
  const ends = task.stopIds;
  const reply = taskReply(e.tokenizer, task);
  const choose = makeSampler(task.sampling);
  let first = true;
  const result = await e.scheduler.submit({
    prompt: task.promptIds,
    maxTokens: task.maxTokens,
    stopIds: ends,
    choose,
    grammar: withPenalties(
      taskFilter(task, e.tokenizer, e.vocabSize, ends, task.logprobs !== undefined),
      task.penalties,
      task.promptIds,
    ),
    signal,
    shared,
    onAdmit: watch?.admitted,
    onPrefill: watch?.prefill,
    ...(e.stateCache
      ? chatCachePoints(
        e.tokenizer,
        task.promptIds,
        task.chat,
        (tokens) => shownMessage(e.tokenizer, replyShape(task), tokens),
        task.messages,
      )
      : {}),
    onToken: (token, logits) => {
      if (first) (first = false, onFirstToken());
      watch?.token();
      // A completion's end ids are not text; a chat's reader reads them as the turn's end.
      if (!task.chat && ends.includes(token)) return;
      const step = reply.token(token, logits);
      if (step.events.length > 0 || step.logprob) emit(step.events, step.logprob, reply);
      return step.stop;
    },
  });
  if (result.finishReason !== "interrupted") {
    const rest = reply.end();
    if (rest.length > 0) emit(rest, undefined, reply);
  }
  return { result, text: reply.text, reply };
}
