/**
 * Kimi K3's chat format (XTML): messages wrapped in `<|open|>tag attrs<|sep|>` ...
 * `<|close|>tag<|sep|>`, each ending with `<|end_of_msg|>`.
 *
 * Control text (the markup) is encoded with added tokens allowed; message text is user
 * data and is encoded with them disabled, so a user writing `<|close|>` gets plain bytes
 * and cannot end their message early or forge a system turn.
 *
 * Choices the released chat format leaves open, made here: no [BOS] unless asked; an assistant message in
 * the history gets a think channel only when it has reasoning.
 *
 * @module
 */

import { usageError } from "../errors.ts";
import type { Tokenizer } from "./tokenizer.ts";

/** Who speaks a message. */
export type Role = "system" | "user" | "assistant";

/** One message of a conversation. */
export interface ChatMessage {
  /** Who speaks. */
  role: Role;
  /** The message text (for the assistant: its response channel). */
  content: string;
  /** Assistant reasoning, rendered in the think channel. */
  reasoning?: string;
}

/** Thinking effort levels the released encoder accepts (it refuses "medium"). */
export const EFFORTS = ["low", "high", "max"] as const;
/** A thinking effort level. */
export type Effort = typeof EFFORTS[number];

/** Options of {@link chatPrompt}. */
export interface ChatOptions {
  /** Open the think channel for the reply (default), or go straight to the response. */
  thinking?: boolean;
  /** Thinking effort, sent as a leading system message. */
  effort?: string;
  /** Start with [BOS] (default false). */
  bos?: boolean;
}

/** Builds ids from control text (added tokens allowed) and user text (not allowed). */
class Builder {
  readonly ids: number[] = [];
  constructor(readonly tok: Tokenizer) {}
  control(text: string): this {
    this.ids.push(...this.tok.encode(text, { allowSpecial: true }));
    return this;
  }
  user(text: string): this {
    this.ids.push(...this.tok.encode(text, { allowSpecial: false }));
    return this;
  }
  open(tag: string, attrs = ""): this {
    return this.control(`<|open|>${tag}${attrs}<|sep|>`);
  }
  close(tag: string): this {
    return this.control(`<|close|>${tag}<|sep|>`);
  }
}

/** Checks an effort level; throws usageError (exit 2) for anything else. */
function checkEffort(effort: string): void {
  if (!(EFFORTS as readonly string[]).includes(effort)) {
    throw usageError(`thinking effort must be one of ${EFFORTS.join(", ")}, not ${effort}`);
  }
}

function addMessage(b: Builder, m: ChatMessage): void {
  if (!["system", "user", "assistant"].includes(m.role)) {
    throw usageError(`unknown chat role ${JSON.stringify(m.role)}`);
  }
  b.open("message", ` role="${m.role}"`);
  if (m.role === "assistant") {
    if (m.reasoning !== undefined) b.open("think").user(m.reasoning).close("think");
    b.open("response").user(m.content).close("response");
  } else {
    b.user(m.content);
  }
  b.close("message").control("<|end_of_msg|>");
}

function addGenerationPrompt(b: Builder, thinking: boolean): void {
  b.open("message", ' role="assistant"');
  b.open(thinking ? "think" : "response");
}

/**
 * Ids of a chat prompt: the messages, then the generation prompt for the assistant's
 * reply. Throws usageError (exit 2) for an unknown role or effort.
 */
export function chatPrompt(
  tok: Tokenizer,
  messages: readonly ChatMessage[],
  options: ChatOptions = {},
): number[] {
  const b = new Builder(tok);
  if (options.bos) b.control("[BOS]");
  if (options.effort !== undefined) {
    checkEffort(options.effort);
    b.open("message", ' role="system" type="thinking-effort"').user(options.effort)
      .close("message").control("<|end_of_msg|>");
  }
  for (const m of messages) addMessage(b, m);
  addGenerationPrompt(b, options.thinking !== false);
  return b.ids;
}

/**
 * Ids that continue a conversation whose tokens so far end with a generated reply: the
 * markup that closes what the reply left open (from {@link ChannelSplitter.left};
 * nothing when it ended with `<|end_of_msg|>`), the new messages, and the generation
 * prompt. Appending these to the kept state prefills only the new turn.
 */
export function continuePrompt(
  tok: Tokenizer,
  left: { open: readonly string[]; ended: boolean },
  messages: readonly ChatMessage[],
  thinking: boolean,
): number[] {
  const b = new Builder(tok);
  const open = left.ended ? [] : left.open;
  for (const tag of [...open].reverse()) {
    // A reply cut inside its think channel still gets its (empty) response channel, as
    // chatPrompt renders an assistant message with reasoning.
    if (tag === "think") b.close("think").open("response").close("response");
    else b.close(tag);
  }
  if (!left.ended) b.control("<|end_of_msg|>");
  for (const m of messages) addMessage(b, m);
  addGenerationPrompt(b, thinking);
  return b.ids;
}

/** Ids that end an assistant turn: `<|end_of_msg|>` and `[EOS]`. */
export function stopIds(tok: Tokenizer): number[] {
  return [tok.specialId("<|end_of_msg|>"), tok.specialId("[EOS]")];
}

const CLOSE_THINK = "<|close|>think<|sep|>";
const OPEN_RESPONSE = "<|open|>response<|sep|>";
const CLOSE_RESPONSE = "<|close|>response<|sep|>";

/**
 * Splits generated assistant text (decoded with its markup) into reasoning (the think
 * channel) and content (the response channel), as vLLM's kimi_k3 reasoning parser does.
 * With `thinking` the prompt opened the think channel, so the text starts in it and
 * reasoning runs to `<|close|>think<|sep|>` (all of it when that never came); without,
 * the text starts in the response channel. Content ends at `<|close|>response<|sep|>`;
 * what follows (the message's closing markup) is neither.
 */
export function splitChannels(text: string, thinking: boolean): { reasoning: string; content: string } {
  let reasoning = "";
  let rest = text;
  if (thinking) {
    const end = text.indexOf(CLOSE_THINK);
    if (end < 0) return { reasoning: text, content: "" };
    reasoning = text.slice(0, end);
    rest = text.slice(end + CLOSE_THINK.length);
    if (rest.startsWith(OPEN_RESPONSE)) rest = rest.slice(OPEN_RESPONSE.length);
  }
  const end = rest.indexOf(CLOSE_RESPONSE);
  return { reasoning, content: end < 0 ? rest : rest.slice(0, end) };
}

/** A piece of generated assistant text and the channel it belongs to. */
export interface ChannelText {
  /** think = reasoning, response = the reply's content. */
  channel: "think" | "response";
  /** The text (markup removed). */
  text: string;
}

const MARKUP = /^<\|(open|close)\|>([^<]{0,64}?)<\|sep\|>/;
const ENDS = ["<|end_of_msg|>", "[EOS]"];
const OPENERS = ["<|open|>", "<|close|>", ...ENDS];
/** An open or close marker whose `<|sep|>` has not arrived yet. */
const PARTIAL = /^<\|(open|close)\|>[^<]{0,64}(<(\|(s(e(p(\|)?)?)?)?)?)?$/;

/**
 * Splits generated assistant text into its channels as it arrives: markup
 * (`<|open|>think<|sep|>`, `<|close|>response<|sep|>`, `<|end_of_msg|>`, ...) is consumed,
 * text that could still be the start of markup is held back, and everything else comes
 * out tagged with the channel it is in. Text after the message ends is dropped.
 */
export class ChannelSplitter {
  #buf = "";
  /** Tags open now, outermost first (the generation prompt opened message and a channel). */
  readonly #open: string[];
  #ended = false;

  /** `thinking`: whether the generation prompt opened the think channel (else response). */
  constructor(thinking: boolean) {
    this.#open = ["message", thinking ? "think" : "response"];
  }

  /** What the reply left open so far, for {@link continuePrompt}. */
  get left(): { open: readonly string[]; ended: boolean } {
    return { open: [...this.#open], ended: this.#ended };
  }

  #channel(): "think" | "response" | undefined {
    const top = this.#open[this.#open.length - 1];
    return top === "think" || top === "response" ? top : undefined;
  }

  #emit(out: ChannelText[], text: string): void {
    const channel = this.#channel();
    if (text === "" || this.#ended || channel === undefined) return;
    const last = out[out.length - 1];
    if (last?.channel === channel) last.text += text;
    else out.push({ channel, text });
  }

  /** Feeds generated text; returns the pieces now known to be channel text. */
  push(text: string): ChannelText[] {
    const out: ChannelText[] = [];
    this.#buf += text;
    let from = 0;
    scan: while (from < this.#buf.length) {
      for (let p = from; p < this.#buf.length; p++) {
        const c = this.#buf[p];
        if (c !== "<" && c !== "[") continue;
        const rest = this.#buf.slice(p);
        const end = ENDS.find((e) => rest.startsWith(e));
        const m = end ? null : MARKUP.exec(rest);
        if (end || m) {
          this.#emit(out, this.#buf.slice(0, p));
          if (end) {
            this.#ended = true;
            this.#open.length = 0;
          } else this.#tag(m![1] as "open" | "close", m![2].trim());
          this.#buf = this.#buf.slice(p + (end ?? m![0]).length);
          from = 0;
          continue scan;
        }
        if (OPENERS.some((o) => o.startsWith(rest)) || PARTIAL.test(rest)) {
          // Could still become markup: hold it.
          this.#emit(out, this.#buf.slice(0, p));
          this.#buf = rest;
          return out;
        }
      }
      break;
    }
    this.#emit(out, this.#buf);
    this.#buf = "";
    return out;
  }

  #tag(kind: "open" | "close", tag: string): void {
    const name = tag.split(/\s/, 1)[0];
    if (kind === "open") this.#open.push(name);
    else {
      const i = this.#open.lastIndexOf(name);
      if (i >= 0) this.#open.length = i;
    }
  }

  /** The text still held back, as channel text (call when generation ends). */
  flush(): ChannelText[] {
    const out: ChannelText[] = [];
    this.#emit(out, this.#buf);
    this.#buf = "";
    return out;
  }
}

/** The fields a history line may hold. */
const HISTORY_FIELDS = new Set(["role", "content", "reasoning"]);

/**
 * Parses a chat history: JSONL, one message per line (`role`, `content`, and `reasoning`
 * for assistant turns only), blank lines ignored. Strict: anything else is a usage error
 * (exit 2) naming `what:LINE`.
 */
export function parseHistory(text: string, what: string): ChatMessage[] {
  const out: ChatMessage[] = [];
  text.split("\n").forEach((line, i) => {
    if (line.trim() === "") return;
    const bad = (why: string) => usageError(`${what}:${i + 1}: ${why}`);
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch (e) {
      throw bad(`not JSON (${(e as Error).message})`);
    }
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw bad("expected a JSON object");
    const o = v as Record<string, unknown>;
    const unknown = Object.keys(o).find((k) => !HISTORY_FIELDS.has(k));
    if (unknown !== undefined) throw bad(`unknown field ${JSON.stringify(unknown)} (fields: role, content, reasoning)`);
    if (o.role !== "system" && o.role !== "user" && o.role !== "assistant") {
      throw bad(`"role" must be "system", "user" or "assistant", got ${JSON.stringify(o.role)}`);
    }
    if (typeof o.content !== "string") throw bad(`"content" must be a string`);
    const m: ChatMessage = { role: o.role, content: o.content };
    if (o.reasoning !== undefined) {
      if (o.role !== "assistant") throw bad(`"reasoning" is only for assistant messages`);
      if (typeof o.reasoning !== "string") throw bad(`"reasoning" must be a string`);
      m.reasoning = o.reasoning;
    }
    out.push(m);
  });
  return out;
}

/** A history as JSONL, one message per line (what {@link parseHistory} reads). */
export function formatHistory(messages: readonly ChatMessage[]): string {
  return messages.map((m) =>
    JSON.stringify(
      m.reasoning === undefined ? { role: m.role, content: m.content } : {
        role: m.role,
        content: m.content,
        reasoning: m.reasoning,
      },
    ) + "\n"
  ).join("");
}

/**
 * Message boundaries of rendered chat ids: the position after each `<|end_of_msg|>`, where
 * a complete message ends and a conversation's next turn can continue (the state cache
 * keeps states there). Ascending.
 */
export function messageBoundaries(tok: Tokenizer, ids: readonly number[]): number[] {
  const end = tok.specialId("<|end_of_msg|>");
  const out: number[] = [];
  ids.forEach((t, i) => t === end && out.push(i + 1));
  return out;
}

/**
 * The ids that close a generated assistant reply (its `tokens`, decoded with their markup)
 * as the template renders it in the history: the channels and message it left open, then
 * `<|end_of_msg|>`; nothing when the reply ended with `<|end_of_msg|>` itself. Undefined
 * when the reply ended with [EOS] (which a rendered history never holds).
 */
export function replyCloser(tok: Tokenizer, tokens: readonly number[], thinking: boolean): number[] | undefined {
  if (tokens.at(-1) === tok.specialId("[EOS]")) return undefined;
  const split = new ChannelSplitter(thinking);
  split.push(tok.decode([...tokens]));
  const generationPrompt = chatPrompt(tok, [], { thinking }).length;
  const closing = continuePrompt(tok, split.left, [], thinking);
  return closing.slice(0, closing.length - generationPrompt);
}
