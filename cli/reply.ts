/**
 * One generated reply as a request sees it, token by token: a chat's ids read by the
 * XTML reader (engine/text/xtml.ts: channels, tool calls, the turn boundary), a
 * completion's decoded as text; stop strings matched on the text (a chat's per channel);
 * log probabilities computed from the sampler's logits when asked. Serve, batch and chat
 * all go through this, so a reply is read the same way everywhere.
 *
 * @module
 */

import { type TokenLogprob, tokenLogprob } from "../engine/generate/logprobs.ts";
import { StopMatcher } from "../engine/generate/stops.ts";
import type { Tokenizer } from "../engine/text/tokenizer.ts";
import type { ChatMessage } from "../engine/text/chat.ts";
import { type ReplyEvent, ReplyReader, type ToolCall } from "../engine/text/xtml.ts";
import type { ChatLogprobs, CompletionLogprobs, LogprobEntry } from "./openai_response.ts";

/** What a reply is read as. */
export interface ReplyShape {
  /** A chat: whether the think channel was opened, and whether tool calls are parsed. */
  chat?: { thinking: boolean; tools: boolean };
  /** Stop strings (never emitted). */
  stops: readonly string[];
  /** Log probabilities with this many alternatives per token (absent: none). */
  logprobs?: { top: number };
  /** Keep generating past the end of the turn (vLLM's ignore_eos). */
  ignoreEos?: boolean;
  /** Ids of the calls (tests); default random. */
  callId?: (index: number) => string;
}

/** What one token added. */
export interface ReplyStep {
  /** Events now safe to send (a completion's text as response-channel text). */
  events: ReplyEvent[];
  /** Log probabilities of this token, when asked and it is a content token. */
  logprob?: TokenLogprob;
  /** The reply is over (a stop string matched, or the turn ended). */
  stop: boolean;
}

/** A reply being read; see the module doc. */
export class ReplyStream {
  readonly #tok: Tokenizer;
  readonly #shape: ReplyShape;
  readonly #reader: ReplyReader | undefined;
  readonly #stops: StopMatcher;
  /** The channel of the text the stop matcher holds. */
  #heldChannel: "think" | "response" = "response";
  #stopped = false;
  /** A completion's text / a chat's folded channels. */
  text = "";
  /** A chat's think-channel text (stop strings cut). */
  reasoning = "";
  /** Log probabilities of the content tokens, in order. */
  readonly logprobs: TokenLogprob[] = [];

  /** A reader for a reply of `shape`. */
  constructor(tok: Tokenizer, shape: ReplyShape) {
    this.#tok = tok;
    this.#shape = shape;
    this.#stops = new StopMatcher(tok, shape.stops);
    if (shape.chat) {
      this.#reader = new ReplyReader(tok, {
        thinking: shape.chat.thinking,
        tools: shape.chat.tools,
        callId: shape.callId,
      });
    }
  }

  /** The chat reader (what the reply left open, its calls). */
  get reader(): ReplyReader | undefined {
    return this.#reader;
  }

  /** Whether a stop string ended the reply. */
  get stoppedByString(): boolean {
    return this.#stopped;
  }

  /** The tool calls (a chat whose tools channel parsed). */
  get calls(): readonly ToolCall[] {
    return this.#reader?.calls ?? [];
  }

  #fold(out: ReplyEvent[], e: ReplyEvent): void {
    if (e.type === "text") {
      if (e.text === "") return;
      if (e.channel === "think") this.reasoning += e.text;
      else this.text += e.text;
    }
    const last = out[out.length - 1];
    if (e.type === "text" && last?.type === "text" && last.channel === e.channel) last.text += e.text;
    else out.push(e);
  }

  /** Channel text through the stop matcher (held text is released at a channel change). */
  #channelText(out: ReplyEvent[], channel: "think" | "response", text: string): void {
    if (channel !== this.#heldChannel) this.#release(out);
    this.#heldChannel = channel;
    const r = this.#stops.pushText(text);
    this.#fold(out, { type: "text", channel, text: r.text });
    if (r.stopped) this.#stopped = true;
  }

  #release(out: ReplyEvent[]): void {
    if (this.#stopped) return;
    const held = this.#stops.flush();
    if (held) this.#fold(out, { type: "text", channel: this.#heldChannel, text: held });
  }

  /** Feeds one generated token and the logits it was picked from. */
  token(id: number, logits: Float32Array | undefined): ReplyStep {
    const out: ReplyEvent[] = [];
    if (this.#stopped) return { events: out, stop: true };
    let content: boolean;
    if (this.#reader) {
      for (const e of this.#reader.push(id)) {
        if (e.type === "text") this.#channelText(out, e.channel, e.text);
        else (this.#release(out), this.#fold(out, e));
        if (this.#stopped) break;
      }
      content = this.#reader.lastPart === "response";
    } else {
      const r = this.#stops.push(id);
      this.#fold(out, { type: "text", channel: "response", text: r.text });
      if (r.stopped) this.#stopped = true;
      content = true;
    }
    let logprob: TokenLogprob | undefined;
    if (this.#shape.logprobs && logits && content) {
      logprob = tokenLogprob(logits, id, this.#shape.logprobs.top);
      this.logprobs.push(logprob);
    }
    const ended = !this.#shape.ignoreEos && this.#reader?.ended === true;
    return { events: out, logprob, stop: this.#stopped || ended };
  }

  /** Ends the reply (generation stopped, not interrupted): what was held back. */
  end(): ReplyEvent[] {
    const out: ReplyEvent[] = [];
    if (this.#stopped) return out;
    if (this.#reader) {
      for (const e of this.#reader.finish()) {
        if (e.type === "text") this.#channelText(out, e.channel, e.text);
        else (this.#release(out), this.#fold(out, e));
      }
      this.#release(out);
    } else {
      const rest = this.#stops.flush();
      if (rest) this.#fold(out, { type: "text", channel: "response", text: rest });
    }
    return out;
  }

  #entry(id: number, logprob: number): LogprobEntry {
    return { token: this.#tok.decode([id]), logprob, bytes: Array.from(this.#tok.decodeBytes([id])) };
  }

  /** Chat `logprobs` for `entries` (default: all so far). */
  chatLogprobs(entries: readonly TokenLogprob[] = this.logprobs): ChatLogprobs {
    return {
      content: entries.map((e) => ({
        ...this.#entry(e.id, e.logprob),
        top_logprobs: e.top.map((t) => this.#entry(t.id, t.logprob)),
      })),
      refusal: null,
    };
  }

  /** Completions `logprobs` for `entries`, text offsets counted from `offset`. */
  completionLogprobs(entries: readonly TokenLogprob[] = this.logprobs, offset = 0): CompletionLogprobs {
    const out: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
    let at = offset;
    for (const e of entries) {
      const token = this.#tok.decode([e.id]);
      out.tokens.push(token);
      out.token_logprobs.push(e.logprob);
      out.top_logprobs.push(Object.fromEntries(e.top.map((t) => [this.#tok.decode([t.id]), t.logprob])));
      out.text_offset.push(at);
      at += token.length;
    }
    return out;
  }
}

/**
 * A chat reply's generated `tokens` as the client is shown them: the assistant message it
 * sends back in its next request's history (content and tool calls; the reasoning most
 * clients drop is left out).
 */
export function shownMessage(tok: Tokenizer, shape: ReplyShape, tokens: readonly number[]): ChatMessage {
  const reply = new ReplyStream(tok, shape);
  for (const id of tokens) reply.token(id, undefined);
  reply.end();
  const toolCalls = reply.calls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments }));
  return { role: "assistant", content: reply.text, ...(toolCalls.length > 0 ? { toolCalls } : {}) };
}
