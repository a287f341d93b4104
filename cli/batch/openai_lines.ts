/**
 * OpenAI Batch API lines for `k3 batch`: an input line `{"custom_id", "method": "POST",
 * "url": "/v1/chat/completions" | "/v1/completions", "body": {...}}` is a request, its
 * body validated exactly as `k3 serve` validates one (cli/openai.ts) and turned into a
 * task by the same conversion (cli/request.ts openaiTask); its result line is
 * in the Batch output format, `{"id", "custom_id", "response": {"status_code",
 * "request_id", "body"}, "error"}`, the body a `chat.completion` or `text_completion` (or,
 * for a body that does not validate, OpenAI's error body with status 400). So an existing
 * OpenAI batch file runs unchanged.
 *
 * @module
 */

import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import { promptLimitText } from "../run_options.ts";
import { MAX_TOKENS, openaiTask, type Task } from "../request.ts";
import type { ReplyStream } from "../reply.ts";
import { parseChatRequest, parseCompletionRequest } from "../openai.ts";
import { chatCompletion, completion, finishReason, toolCallBody, usage } from "../openai_response.ts";
import { ApiError, errorBody } from "../openai_error.ts";

/** The endpoints a batch line may name. */
export const BATCH_URLS = ["/v1/chat/completions", "/v1/completions"] as const;

/** A request of an OpenAI batch line, ready to generate. */
export interface OpenAIRequest {
  /** The line's `custom_id`, echoed in its result. */
  customId: string;
  /** Which endpoint the line's `url` names. */
  endpoint: "chat" | "completion";
  /** The model named in the body (echoed in the response), else the model directory. */
  model: string;
  /** What to generate: the rendered prompt, max_tokens, sampling and stops. */
  task: Task;
}

/** What an OpenAI line becomes: a request to run, or a result line to write as is (a 400). */
export type OpenAILine = { request: OpenAIRequest } | { result: Record<string, unknown>; customId: string };

function requestId(): string {
  return crypto.randomUUID().replaceAll("-", "");
}

/** A Batch output line for `customId` whose request failed validation. */
export function openaiErrorLine(customId: string, e: ApiError): Record<string, unknown> {
  return {
    id: `batch_req_${requestId()}`,
    custom_id: customId,
    response: { status_code: e.status, request_id: requestId(), body: errorBody(e) },
    error: null,
  };
}

/**
 * Parses an OpenAI Batch line (`o` has `custom_id`). Throws Error (the line is malformed:
 * reported and skipped) when the envelope is wrong; a body that does not validate gives a
 * 400 result line instead, as the Batch API does.
 */
export function parseOpenAILine(
  o: Record<string, unknown>,
  opts: {
    vocab: number;
    maxPromptIds: number;
    gen: number;
    seed: number;
    modelName: string;
    tokenizer: () => Tokenizer | undefined;
    reasoningBudget?: number;
  },
): OpenAILine {
  const allowed = new Set(["custom_id", "method", "url", "body"]);
  const unknown = Object.keys(o).find((k) => !allowed.has(k));
  if (unknown !== undefined) {
    throw new Error(`unknown field ${JSON.stringify(unknown)} in an OpenAI batch line (custom_id, method, url, body)`);
  }
  if (typeof o.custom_id !== "string" || o.custom_id === "") throw new Error(`"custom_id" must be a non-empty string`);
  const customId = o.custom_id;
  if (o.method !== "POST") throw new Error(`"method" must be "POST", got ${JSON.stringify(o.method)}`);
  if (!(BATCH_URLS as readonly unknown[]).includes(o.url)) {
    throw new Error(`"url" must be one of ${BATCH_URLS.join(", ")}, got ${JSON.stringify(o.url)}`);
  }
  try {
    const r = o.url === "/v1/chat/completions" ? parseChatRequest(o.body) : parseCompletionRequest(o.body, opts.vocab);
    if (r.stream) throw new ApiError(400, "'stream' must be false in a batch", "stream");
    if (r.n > 1) throw new ApiError(400, `'n' must be 1 in a batch (one line, one choice), got ${r.n}`, "n");
    // A chat without max_tokens runs to --gen (the model's limit here), as serve's to its context.
    const task = openaiTask(r, {
      tokenizer: opts.tokenizer(),
      seed: opts.seed,
      capacity: Infinity,
      chatMaxTokens: opts.gen,
      reasoningBudget: opts.reasoningBudget,
    });
    const promptIds = task.promptIds;
    const bad = promptIds.find((x) => x >= opts.vocab);
    if (bad !== undefined) throw new ApiError(400, `the prompt holds id ${bad}, outside the vocabulary`, "prompt");
    if (promptIds.length === 0) throw new ApiError(400, "the prompt is empty", "prompt");
    if (promptIds.length > opts.maxPromptIds) {
      throw new ApiError(400, promptLimitText(promptIds.length, opts.maxPromptIds));
    }
    if (task.maxTokens > MAX_TOKENS) {
      throw new ApiError(
        400,
        `'${r.maxTokensParam}' must be at most ${MAX_TOKENS}, got ${task.maxTokens}`,
        r.maxTokensParam,
      );
    }
    return {
      request: {
        customId,
        endpoint: r.kind === "chat" ? "chat" : "completion",
        model: r.model ?? opts.modelName,
        task,
      },
    };
  } catch (e) {
    if (e instanceof ApiError) return { result: openaiErrorLine(customId, e), customId };
    throw e;
  }
}

/** The Batch output line of a finished request (`text`: generated text, stop ids and
 * strings cut; `reply`: the reply as read, undefined without a tokenizer). */
export function openaiResultLine(
  r: OpenAIRequest,
  out: {
    text: string;
    reply?: ReplyStream;
    finishReason: "stop" | "length";
    completionTokens: number;
    cachedTokens?: number;
  },
): Record<string, unknown> {
  const created = Math.floor(Date.now() / 1000);
  const u = usage(r.task.promptIds.length, out.completionTokens, undefined, out.cachedTokens);
  const thinking = r.task.chat?.thinking ?? false;
  const reply = out.reply;
  const calls = (reply?.calls ?? []).map(toolCallBody);
  const finish = finishReason(out.finishReason, calls.length > 0);
  const lp = r.task.logprobs && reply;
  const body = r.endpoint === "chat"
    ? chatCompletion({ id: `chatcmpl-${requestId()}`, created, model: r.model }, {
      content: out.text,
      reasoning: thinking ? reply?.reasoning ?? "" : null,
      finish,
      usage: u,
      toolCalls: calls,
      logprobs: lp ? reply.chatLogprobs() : null,
    })
    : completion({ id: `cmpl-${requestId()}`, created, model: r.model }, {
      text: out.text,
      finish,
      usage: u,
      logprobs: lp ? reply.completionLogprobs() : null,
    });
  return {
    id: `batch_req_${requestId()}`,
    custom_id: r.customId,
    response: { status_code: 200, request_id: requestId(), body },
    error: null,
  };
}
