/**
 * The writers of `k3 serve`'s answers: a whole JSON body at the end
 * ({@link completionBody}), or server-sent events as text becomes safe to send
 * ({@link EventStream} carrying a {@link ChunkWriter}'s chunks, `[DONE]` last). A chat's
 * reply, read by cli/reply.ts, goes out as `reasoning_content` (and `reasoning`), `content` and
 * `tool_calls`, with log probabilities when asked.
 *
 * @module
 */

import type { TokenLogprob } from "../../engine/generate/logprobs.ts";
import type { ReplyEvent } from "../../engine/text/xtml.ts";
import { type ChatRequest, type CompletionRequest } from "../openai.ts";
import {
  type ChatChunk,
  chatChunk,
  type ChatCompletion,
  chatCompletion,
  type ChatDelta,
  type Completion,
  completion,
  completionChunk,
  finishReason,
  type ResponseHead,
  toolCallBody,
  type Usage,
  usage,
  usageChunk,
} from "../openai_response.ts";
import { type ApiError, errorBody } from "../openai_error.ts";
import type { ReplyStream } from "../reply.ts";
import type { Outcome } from "./tasks.ts";

/** One server-sent event carrying `data` (JSON, or the literal [DONE]). */
function sse(data: unknown): string {
  return `data: ${data === "[DONE]" ? data : JSON.stringify(data)}\n\n`;
}

/** The JSON body of a finished, unstreamed request (`promptTokens`: its prompt's length). */
export function completionBody(
  r: ChatRequest | CompletionRequest,
  head: ResponseHead,
  o: Outcome,
  promptTokens: number,
): ChatCompletion | Completion {
  const u = outcomeUsage(o, promptTokens);
  const reply = o.reply;
  const calls = reply.calls.map(toolCallBody);
  const fin = finishReason(o.result.finishReason, calls.length > 0);
  if (r.kind === "completion") {
    return completion(head, {
      text: o.text,
      finish: fin,
      usage: u,
      logprobs: r.logprobs ? reply.completionLogprobs() : null,
    });
  }
  return chatCompletion(head, {
    content: reply.text,
    reasoning: r.thinking ? reply.reasoning : null,
    finish: fin,
    usage: u,
    toolCalls: calls,
    logprobs: r.logprobs ? reply.chatLogprobs() : null,
  });
}
/**
 * The bodies of the choices of one request as one body: the choices in order (body `i` at
 * index `i`), `promptTokens` (each prompt counted once), the completion tokens of all
 * added up.
 */
export function mergedChoices(
  bodies: (ChatCompletion | Completion)[],
  promptTokens: number,
): ChatCompletion | Completion {
  const [first] = bodies;
  return {
    ...first,
    choices: bodies.map((b, i) => ({ ...b.choices[0], index: i })),
    usage: choicesUsage(bodies.map((b) => b.usage!), promptTokens),
  } as ChatCompletion | Completion;
}

/** The usage of several choices as one: `promptTokens` (each prompt counted once), the
 * completion and reasoning tokens of all added up, the first's cached tokens. */
export function choicesUsage(usages: Usage[], promptTokens: number): Usage {
  const [u] = usages;
  const completion = usages.reduce((sum, c) => sum + c.completion_tokens, 0);
  const reasoning = usages.reduce((sum, c) => sum + (c.completion_tokens_details?.reasoning_tokens ?? 0), 0);
  return {
    ...u,
    prompt_tokens: promptTokens,
    completion_tokens: completion,
    total_tokens: promptTokens + completion,
    ...(u.completion_tokens_details ? { completion_tokens_details: { reasoning_tokens: reasoning } } : {}),
  };
}

/** The usage of one finished choice (`promptTokens`: its prompt's length). */
export function outcomeUsage(o: Outcome, promptTokens: number): Usage {
  return usage(promptTokens, o.result.tokens.length, o.reasoningTokens, o.result.cachedTokens);
}

/** Bytes of events an EventStream holds for a client that reads slower than they come. */
export const PENDING_OUTPUT_LIMIT = 1 << 20;

/** A client whose unread events passed {@link PENDING_OUTPUT_LIMIT}: cut off. */
export class OutputOverflow extends Error {
  constructor() {
    super(`the client left over ${PENDING_OUTPUT_LIMIT} bytes of events unread`);
  }
}

/**
 * A server-sent event stream: events are sent while the client listens, then it closes.
 * Events the client has not read are held up to {@link PENDING_OUTPUT_LIMIT} bytes;
 * beyond, the stream fails (its connection closes) and the client counts as gone, so
 * its sequence is cancelled: memory stays bounded whatever the client reads.
 */
export class EventStream {
  /** The response body. */
  readonly body: ReadableStream<Uint8Array>;
  #ctl!: ReadableStreamDefaultController<Uint8Array>;
  #open = true;
  readonly #enc = new TextEncoder();
  readonly #onCancel: () => void;

  /** `onCancel`: the client went away (the body was cancelled, or its output overflowed). */
  constructor(onCancel: () => void) {
    this.#onCancel = onCancel;
    this.body = new ReadableStream<Uint8Array>({
      start: (c) => void (this.#ctl = c),
      cancel: () => {
        this.#open = false;
        onCancel();
      },
    }, { highWaterMark: PENDING_OUTPUT_LIMIT, size: (chunk) => chunk.length });
  }

  /** Queues `text` for the client; past the bound, fails the stream and cancels. */
  #enqueue(text: string): void {
    if (!this.#open) return;
    try {
      this.#ctl.enqueue(this.#enc.encode(text));
    } catch {
      this.#open = false;
      return;
    }
    if ((this.#ctl.desiredSize ?? 0) < 0) {
      this.#open = false;
      this.#ctl.error(new OutputOverflow());
      this.#onCancel();
    }
  }

  /** Sends one event (nothing once the client is gone). */
  send(data: unknown): void {
    this.#enqueue(sse(data));
  }

  /** Sends one event named `type` (the Responses API names its events). */
  sendEvent(type: string, data: unknown): void {
    this.#enqueue(`event: ${type}\n${sse(data)}`);
  }

  /** Events queued and not yet taken by the client (0 while it keeps up). */
  get backlog(): number {
    return this.#open ? Math.max(0, -(this.#ctl.desiredSize ?? 0)) : 0;
  }

  /** Sends `[DONE]` and ends the stream. */
  close(): void {
    this.send("[DONE]");
    this.end();
  }

  /** Ends the stream without `[DONE]`. */
  end(): void {
    if (this.#open) {
      this.#open = false;
      this.#ctl.close();
    }
  }
}

/**
 * The chunks of one choice of a streamed request, in OpenAI's shapes for its endpoint; the
 * choices of a request of several (`n` > 1, several prompts) each have one, their chunks
 * interleaved on one stream as they come, told apart by `index`.
 */
export class ChunkWriter {
  /** Log probabilities of tokens whose text has not been sent yet. */
  #pending: TokenLogprob[] = [];
  /** Text sent so far (a completion's text offsets). */
  #sent = 0;

  /** Chunks of choice `index` of `r` under `head`, sent on `events`. */
  constructor(
    readonly events: EventStream,
    readonly r: ChatRequest | CompletionRequest,
    readonly head: ResponseHead,
    readonly index = 0,
  ) {
    if (r.kind === "chat") this.#send(chatChunk(head, { role: "assistant", content: "" }, null, r.includeUsage));
  }

  /** Sends a chunk of this choice. */
  #send(chunk: ChatChunk | Completion): void {
    if (this.index !== 0) {
      chunk.choices = chunk.choices.map((c) => ({ ...c, index: this.index })) as typeof chunk.choices;
    }
    this.events.send(chunk);
  }

  /** Sends what a step of the reply made safe; a token's log probabilities ride on the
   * next chunk of text. */
  step(reply: ReplyStream, events: ReplyEvent[], logprob?: TokenLogprob): void {
    if (logprob) this.#pending.push(logprob);
    const r = this.r;
    for (const e of events) {
      if (r.kind === "completion") {
        if (e.type !== "text") continue;
        const lp = r.logprobs ? reply.completionLogprobs(this.#pending.splice(0), this.#sent) : null;
        this.#sent += lp ? lp.tokens.join("").length : 0;
        this.#send(completionChunk(this.head, e.text, null, r.includeUsage, lp));
        continue;
      }
      let d: ChatDelta;
      if (e.type === "text") {
        d = e.channel === "think" ? { reasoning_content: e.text, reasoning: e.text } : { content: e.text };
      } else if (e.type === "call") {
        d = { tool_calls: [{ index: e.index, id: e.id, type: "function", function: { name: e.name, arguments: "" } }] };
      } else d = { tool_calls: [{ index: e.index, function: { arguments: e.text } }] };
      const lp = r.logprobs && e.type === "text" && e.channel === "response" && this.#pending.length > 0
        ? reply.chatLogprobs(this.#pending.splice(0))
        : null;
      this.#send(chatChunk(this.head, d, null, r.includeUsage, lp));
    }
  }

  /** Sends the choice's end: its finish reason (with log probabilities not yet sent). */
  finish(o: Outcome): void {
    const r = this.r;
    const fin = finishReason(o.result.finishReason, o.reply.calls.length > 0);
    const rest = this.#pending.splice(0);
    if (r.kind === "chat") {
      const lp = r.logprobs && rest.length > 0 ? o.reply.chatLogprobs(rest) : null;
      this.#send(chatChunk(this.head, {}, fin, r.includeUsage, lp));
    } else {
      const lp = r.logprobs && rest.length > 0 ? o.reply.completionLogprobs(rest, this.#sent) : null;
      this.#send(completionChunk(this.head, "", fin, r.includeUsage, lp));
    }
  }

  /** Sends the request's usage (of all its choices), when asked: the last chunk before [DONE]. */
  usage(u: Usage): void {
    const r = this.r;
    if (r.includeUsage) {
      this.events.send(usageChunk(this.head, r.kind === "chat" ? "chat.completion.chunk" : "text_completion", u));
    }
  }

  /** Sends an error event. */
  error(e: ApiError): void {
    this.events.send(errorBody(e));
  }
}
