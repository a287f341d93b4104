/**
 * The writers of `k3 serve`'s answers: a whole JSON body at the end
 * ({@link completionBody}), or server-sent events as text becomes safe to send
 * ({@link EventStream} carrying a {@link ChunkWriter}'s chunks, `[DONE]` last). A chat's
 * text is split into its think channel (`reasoning_content`) and its reply here.
 *
 * @module
 */

import { ChannelSplitter, type ChannelText } from "../../engine/text/chat.ts";
import {
  type ApiError,
  chatChunk,
  type ChatCompletion,
  chatCompletion,
  type ChatDelta,
  type ChatRequest,
  type Completion,
  completion,
  completionChunk,
  type CompletionRequest,
  errorBody,
  finishReason,
  type ResponseHead,
  sse,
  usage,
  usageChunk,
} from "../openai.ts";
import type { Outcome } from "./tasks.ts";

/** The JSON body of a finished, unstreamed request (`promptTokens`: its prompt's length). */
export function completionBody(
  r: ChatRequest | CompletionRequest,
  head: ResponseHead,
  o: Outcome,
  promptTokens: number,
): ChatCompletion | Completion {
  const u = usage(promptTokens, o.result.tokens.length, o.result.cachedTokens);
  const fin = finishReason(o.result.finishReason);
  if (r.kind === "completion") return completion(head, { text: o.text, finish: fin, usage: u });
  const split = new ChannelSplitter(r.thinking);
  const pieces = [...split.push(o.text), ...split.flush()];
  const text = (channel: string) => pieces.filter((p) => p.channel === channel).map((p) => p.text).join("");
  return chatCompletion(head, {
    content: text("response"),
    reasoning: r.thinking ? text("think") : null,
    finish: fin,
    usage: u,
  });
}

/** A server-sent event stream: events are sent while the client listens, then it closes. */
export class EventStream {
  /** The response body. */
  readonly body: ReadableStream<Uint8Array>;
  #ctl!: ReadableStreamDefaultController<Uint8Array>;
  #open = true;
  readonly #enc = new TextEncoder();

  /** `onCancel`: the client went away (the body was cancelled). */
  constructor(onCancel: () => void) {
    this.body = new ReadableStream<Uint8Array>({
      start: (c) => void (this.#ctl = c),
      cancel: () => {
        this.#open = false;
        onCancel();
      },
    });
  }

  /** Sends one event (nothing once the client is gone). */
  send(data: unknown): void {
    if (!this.#open) return;
    try {
      this.#ctl.enqueue(this.#enc.encode(sse(data)));
    } catch {
      this.#open = false;
    }
  }

  /** Sends `[DONE]` and ends the stream. */
  close(): void {
    this.send("[DONE]");
    if (this.#open) {
      this.#open = false;
      this.#ctl.close();
    }
  }
}

/** The chunks of one streamed request, in OpenAI's shapes for its endpoint. */
export class ChunkWriter {
  readonly #channels: ChannelSplitter;

  /** Chunks of `r` under `head`, sent on `events`. */
  constructor(readonly events: EventStream, readonly r: ChatRequest | CompletionRequest, readonly head: ResponseHead) {
    this.#channels = new ChannelSplitter(r.kind === "chat" && r.thinking);
    if (r.kind === "chat") events.send(chatChunk(head, { role: "assistant", content: "" }, null, r.includeUsage));
  }

  #pieces(pieces: ChannelText[]): void {
    for (const p of pieces) {
      const d: ChatDelta = p.channel === "think" ? { reasoning_content: p.text } : { content: p.text };
      this.events.send(chatChunk(this.head, d, null, this.r.includeUsage));
    }
  }

  /** Sends text as it becomes safe. */
  text(text: string): void {
    if (this.r.kind === "chat") this.#pieces(this.#channels.push(text));
    else this.events.send(completionChunk(this.head, text, null, this.r.includeUsage));
  }

  /** Sends the end: what the splitter held, the finish reason, and usage when asked. */
  finish(o: Outcome, promptTokens: number): void {
    const r = this.r;
    const fin = finishReason(o.result.finishReason);
    if (r.kind === "chat") {
      this.#pieces(this.#channels.flush());
      this.events.send(chatChunk(this.head, {}, fin, r.includeUsage));
    } else {
      this.events.send(completionChunk(this.head, "", fin, r.includeUsage));
    }
    if (r.includeUsage) {
      this.events.send(
        usageChunk(
          this.head,
          r.kind === "chat" ? "chat.completion.chunk" : "text_completion",
          usage(promptTokens, o.result.tokens.length, o.result.cachedTokens),
        ),
      );
    }
  }

  /** Sends an error event. */
  error(e: ApiError): void {
    this.events.send(errorBody(e));
  }
}
