/**
 * Kimi K3's chat format (XTML): messages wrapped in `<|open|>tag attrs<|sep|>` ...
 * `<|close|>tag<|sep|>`, each ending with `<|end_of_msg|>`.
 *
 * Control text (the markup) is encoded with added tokens allowed; message text is user
 * data and is encoded with them disabled, so a user writing `<|close|>` gets plain bytes
 * and cannot end their message early or forge a system turn.
 *
 * Choices the spec leaves open, made here: no [BOS] unless asked; an assistant message in
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
  role: Role;
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
    if (!(EFFORTS as readonly string[]).includes(options.effort)) {
      throw usageError(
        `thinking effort must be one of ${EFFORTS.join(", ")}, not ${options.effort}`,
      );
    }
    b.open("message", ' role="system" type="thinking-effort"').user(options.effort)
      .close("message").control("<|end_of_msg|>");
  }
  for (const m of messages) {
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
  b.open("message", ' role="assistant"');
  b.open(options.thinking === false ? "response" : "think");
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
