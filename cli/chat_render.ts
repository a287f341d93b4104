/**
 * The render API: an OpenAI chat request rendered as the released encoder renders it
 * (engine/text/chat.ts), without running the model, so anyone can check k3's prompt
 * against the reference: `k3 tokenize --chat REQUEST.json`, and `k3 serve`'s vLLM-shaped
 * `POST /tokenize` and `POST /detokenize` and llama-server's `POST /apply-template`.
 *
 * A chat body takes the fields of `/v1/chat/completions` (`messages`, `tools`,
 * `tool_choice`, `response_format`, `reasoning_effort`, `chat_template_kwargs`) and vLLM's
 * `add_generation_prompt` (default true). Bad input is an ApiError (400) naming its field.
 *
 * @module
 */

import { K3Error } from "../engine/errors.ts";
import { chatSegments, encodeSegments, type Segment, segmentsText } from "../engine/text/chat.ts";
import type { Tokenizer } from "../engine/text/tokenizer.ts";
import { JsonFields } from "../engine/json_fields.ts";
import { parseChatRequest } from "./openai.ts";
import { ApiError, bad, need, REQUEST, requestError } from "./openai_error.ts";
import { chatOptions } from "./request.ts";

/** A chat request's prompt: its segments, their ids and their text. */
export interface RenderedChat {
  /** The segments, each encoded on its own. */
  segments: Segment[];
  /** The prompt's ids. */
  ids: number[];
  /** The prompt's text (the encoder's `apply_chat_template(tokenize=False)`). */
  text: string;
}

/** Renders an OpenAI chat body; throws ApiError (400) for a bad one. */
export function renderChatBody(tok: Tokenizer, body: unknown): RenderedChat {
  const f = JsonFields.root(body, REQUEST)!;
  const addGenerationPrompt = f.boolean("add_generation_prompt") ?? true;
  if (f.boolean("continue_final_message")) {
    throw bad("continue_final_message", "'continue_final_message' is not supported: the encoder closes every message");
  }
  const r = parseChatRequest(body);
  let segments: Segment[];
  try {
    segments = chatSegments(r.messages, chatOptions(r, addGenerationPrompt));
  } catch (e) {
    if (e instanceof K3Error) throw new ApiError(400, e.message, "messages");
    throw e;
  }
  return { segments, ids: encodeSegments(tok, segments), text: segmentsText(segments) };
}

/** vLLM's `POST /tokenize` answer. */
export interface TokenizeAnswer {
  /** Number of ids. */
  count: number;
  /** Positions one sequence holds. */
  max_model_len: number;
  /** The ids. */
  tokens: number[];
  /** Not given (vLLM's `return_token_strs`). */
  token_strs: null;
}

/**
 * vLLM's `POST /tokenize`: a chat body (`messages`) rendered as `/v1/chat/completions`
 * renders it, or a `prompt` text encoded as `/v1/completions` encodes it (no special
 * tokens).
 */
export function tokenizeBody(tok: Tokenizer, body: unknown, maxModelLen: number): TokenizeAnswer {
  const f = JsonFields.root(body, REQUEST)!;
  let tokens: number[];
  if (f.has("messages")) tokens = renderChatBody(tok, body).ids;
  else {
    const prompt = need(f, "prompt", f.string("prompt"), "a string (or give 'messages')");
    tokens = tok.encode(prompt, { allowSpecial: false });
  }
  return { count: tokens.length, max_model_len: maxModelLen, tokens, token_strs: null };
}

/** vLLM's `POST /detokenize`: `{tokens}` (ids below `vocab`) -> `{prompt}`. */
export function detokenizeBody(tok: Tokenizer, body: unknown, vocab: number): { prompt: string } {
  const f = JsonFields.root(body, REQUEST)!;
  const list = need(f, "tokens", f.array("tokens"), "an array of token ids");
  const ids = Array.from({ length: list.length }, (_, i) => {
    const id = list.get(i);
    if (!Number.isSafeInteger(id) || (id as number) < 0 || (id as number) >= vocab) {
      throw requestError({ field: `tokens[${i}]`, expected: `a token id in 0..${vocab - 1}`, missing: false, got: id });
    }
    return id as number;
  });
  return { prompt: tok.decode(ids) };
}

/** llama-server's `POST /apply-template`: a chat body -> `{prompt}` (the prompt's text). */
export function applyTemplateBody(tok: Tokenizer, body: unknown): { prompt: string } {
  return { prompt: renderChatBody(tok, body).text };
}
