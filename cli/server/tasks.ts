/**
 * From a parsed OpenAI request to a scheduled sequence and its result, for `k3 serve`:
 * the body is validated (cli/openai.ts), its model name checked, its prompt rendered and
 * fitted to one sequence's context, and the request turned into a task by the one
 * conversion (cli/request.ts); the task then runs as one scheduler sequence with its own
 * sampler and stop matcher.
 *
 * @module
 */

import type { Scheduler, SequenceResult } from "../../engine/generate/scheduler.ts";
import { makeSampler } from "../../engine/generate/sampling.ts";
import { StopMatcher } from "../../engine/generate/stops.ts";
import { chatCachePoints, type StateCache } from "../../engine/generate/state_cache.ts";
import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import { K3Error } from "../../engine/errors.ts";
import {
  ApiError,
  type ChatRequest,
  type CompletionRequest,
  parseChatRequest,
  parseCompletionRequest,
} from "../openai.ts";
import { openaiTask, type Task } from "../request.ts";

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
  /** The conversation state cache the scheduler continues from (undefined: off). */
  stateCache?: Pick<StateCache, "stats">;
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
  /** Text emitted (stop strings and stop ids excluded). */
  text: string;
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
export function serveTask(e: ServeEngine, kind: "chat" | "completion", body: unknown, modelName: string): ServeTask {
  const r = kind === "chat" ? parseChatRequest(body) : parseCompletionRequest(body, e.vocabSize);
  if (r.model !== undefined && r.model !== modelName) {
    throw new ApiError(
      404,
      `the model '${r.model}' does not exist (this server has '${modelName}')`,
      "model",
      "model_not_found",
    );
  }
  let task: Task;
  try {
    task = openaiTask(r, {
      tokenizer: e.tokenizer,
      seed: crypto.getRandomValues(new Uint32Array(1))[0],
      capacity: e.capacity,
    });
  } catch (err) {
    if (err instanceof K3Error) throw new ApiError(400, err.message, r.kind === "chat" ? "messages" : "prompt");
    throw err;
  }
  checkFits(e, r, task.promptIds);
  return { request: r, task };
}

/** Runs a task as one scheduler sequence; `emit` gets text as it becomes safe to send. */
export async function runTask(
  e: ServeEngine,
  task: Task,
  signal: AbortSignal,
  emit: (text: string) => void,
  onFirstToken: () => void,
): Promise<Outcome> {
  const ends = task.stopIds;
  const matcher = new StopMatcher(e.tokenizer, task.stops);
  const choose = makeSampler(task.sampling);
  let text = "";
  let stoppedByString = false;
  let first = true;
  const result = await e.scheduler.submit({
    prompt: task.promptIds,
    maxTokens: task.maxTokens,
    stopIds: ends,
    choose,
    signal,
    ...(e.stateCache ? chatCachePoints(e.tokenizer, task.promptIds, task.chat) : {}),
    onToken: (token) => {
      if (first) (first = false, onFirstToken());
      if (ends.includes(token)) return;
      const out = matcher.push(token);
      if (out.text) (text += out.text, emit(out.text));
      if (out.stopped) return (stoppedByString = true);
    },
  });
  if (!stoppedByString && result.finishReason !== "interrupted") {
    const rest = matcher.flush();
    if (rest) (text += rest, emit(rest));
  }
  return { result, text };
}
