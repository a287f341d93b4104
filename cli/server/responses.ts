/**
 * OpenAI's Responses API (`POST /v1/responses`) on the chat pipeline: a Responses body
 * becomes a chat body ({@link chatBodyOfResponses}: `instructions` a system message,
 * `input` the messages, `max_output_tokens` the completion limit), is validated and run
 * like any chat request, and its answer is written in the Responses shape: a whole
 * `response` object ({@link responseObject}), or its event stream
 * ({@link ResponseEventWriter}: `response.created` ... `response.output_text.delta` ...
 * `response.completed`). Output items are built from parts: reasoning, message text, and
 * the function calls the reply reader parsed from the token ids (`function_call` items; a
 * `function_call_output` input item is the tool message that answers one).
 *
 * @module
 */

import type { ReplyEvent } from "../../engine/text/xtml.ts";
import type { ReplyStream } from "../reply.ts";
import { type ChatRequest } from "../openai.ts";
import { type ModelList, modelList } from "../openai_response.ts";
import { ApiError, errorBody } from "../openai_error.ts";
import type { Outcome } from "./tasks.ts";

/** A JSON object as built and parsed here. */
export type Json = Record<string, unknown>;

/** One model of `GET /v1/models/{id}` (the same object the list holds). */
export function modelObject(name: string, created: number): ModelList["data"][number] {
  return modelList([name], created).data[0];
}

function bad(param: string, message: string, code: string | null = null): ApiError {
  return new ApiError(400, message, param, code);
}

const kind = (v: unknown) => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);

/** The text of a Responses content (a string, or input_text / output_text parts). */
function contentText(v: unknown, param: string): string {
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) throw bad(param, `'${param}' must be a string or an array of parts, got ${kind(v)}`);
  let text = "";
  v.forEach((part, j) => {
    const p = `${param}[${j}]`;
    if (kind(part) !== "object") throw bad(p, `'${p}' must be an object, got ${kind(part)}`);
    const t = (part as Json).type;
    if (t === "input_text" || t === "output_text" || t === "text") {
      const s = (part as Json).text;
      if (typeof s !== "string") throw bad(`${p}.text`, `'${p}.text' must be a string, got ${kind(s)}`);
      text += s;
    } else if (t === "input_image" || t === "input_file" || t === "input_audio") {
      throw bad(p, `'${p}' is ${String(t)}: k3 serve takes text only`, "unsupported_parameter");
    } else {
      throw bad(`${p}.type`, `'${p}.type' must be "input_text" or "output_text", got ${JSON.stringify(t ?? null)}`);
    }
  });
  return text;
}

/** Fields of a Responses body that have no effect here and are accepted as sent. */
const IGNORED = new Set(["store", "metadata", "user", "truncation", "include", "service_tier"]);
/** Fields passed on to the chat request under their chat names. */
const RENAMED: Record<string, string> = {
  model: "model",
  temperature: "temperature",
  top_p: "top_p",
  stream: "stream",
  max_output_tokens: "max_completion_tokens",
  seed: "seed",
  parallel_tool_calls: "parallel_tool_calls",
  // k3's reasoning switches, as chat requests take them (docs/tools.md).
  max_reasoning_tokens: "max_reasoning_tokens",
  chat_template_kwargs: "chat_template_kwargs",
};

/**
 * A `/v1/responses` body as the chat body it runs as: function `tools` (the Responses API's
 * flat form) and `tool_choice` in their chat form, `text.format` as `response_format`, the
 * input items as messages ({@link inputMessages}), after the conversation of
 * `previous_response_id` when `stored` holds it (404 otherwise). Throws ApiError(400) for
 * what k3 does not do (tools other than functions, conversations, background runs).
 */
export function chatBodyOfResponses(body: unknown, stored?: StoredLookup): Json {
  if (kind(body) !== "object") throw new ApiError(400, `the request body must be a JSON object, got ${kind(body)}`);
  const b = body as Json;
  const chat: Json = {};
  const messages: Json[] = [];
  for (const [k, v] of Object.entries(b)) {
    if (v === undefined || v === null) continue;
    if (Object.hasOwn(RENAMED, k)) chat[RENAMED[k]] = v; // own keys only: never `constructor`
    else if (IGNORED.has(k)) continue;
    else if (k === "instructions") {
      if (typeof v !== "string") throw bad(k, `'instructions' must be a string, got ${kind(v)}`);
      messages.unshift({ role: "system", content: v });
    } else if (k === "input") continue;
    else if (k === "reasoning") {
      if (kind(v) !== "object") throw bad(k, `'reasoning' must be an object, got ${kind(v)}`);
      // As the chat request reads it: `effort`, and the budget `max_tokens` (OpenRouter's name).
      chat.reasoning = v;
    } else if (k === "text") {
      const format = kind(v) === "object" ? (v as Json).format : undefined;
      if (format !== undefined) chat.response_format = responseFormatOf(format);
    } else if (k === "tools") {
      if (!Array.isArray(v)) throw bad(k, `'tools' must be an array, got ${kind(v)}`);
      chat.tools = v.map((t, i) => functionTool(t, `tools[${i}]`));
    } else if (k === "tool_choice") {
      chat.tool_choice = kind(v) === "object" && (v as Json).type === "function"
        ? { type: "function", function: { name: (v as Json).name } }
        : v;
    } else if (k === "previous_response_id") continue;
    else if (k === "conversation" || k === "background" || k === "prompt") {
      throw bad(k, `'${k}' is not supported by k3 serve`, "unsupported_parameter");
    } else {
      throw bad(k, `'${k}' is not a field of a /v1/responses request`, "unknown_parameter");
    }
  }
  const previous = b.previous_response_id;
  if (previous !== undefined && previous !== null) {
    if (typeof previous !== "string") throw bad("previous_response_id", "'previous_response_id' must be a string");
    const conversation = stored?.conversation(previous);
    if (!conversation) {
      throw new ApiError(
        404,
        `no stored response ${
          JSON.stringify(previous.slice(0, 64))
        } (stored responses live in this server's memory, per API key, the oldest evicted)`,
        "previous_response_id",
        "previous_response_not_found",
      );
    }
    messages.push(...conversation);
  }
  const input = b.input;
  if (typeof input === "string") messages.push({ role: "user", content: input });
  else if (Array.isArray(input)) messages.push(...inputMessages(input, "input", stored));
  else throw bad("input", `'input' is required: a string or an array of messages, got ${kind(input)}`);
  chat.messages = messages;
  return chat;
}

/** Stored responses as a request may reach them (cli/server/response_store.ts), for one API key. */
export interface StoredLookup {
  /** The conversation through response `id` (chat messages, its output last), or undefined. */
  conversation(id: string): Json[] | undefined;
  /** A stored output item by its id, or undefined. */
  item(id: string): Json | undefined;
}

/**
 * Responses input items as chat messages: messages, `function_call` items as the
 * assistant's tool calls, `function_call_output` items as tool messages, `reasoning` items
 * as the next assistant message's `reasoning_content` (where the chat template renders
 * it), `item_reference` items as the stored item they name.
 */
export function inputMessages(items: readonly unknown[], param: string, stored?: StoredLookup): Json[] {
  const messages: Json[] = [];
  let reasoning: string | undefined;
  /** An assistant message, holding the reasoning that came before it. */
  const assistant = (m: Json): Json => {
    if (reasoning !== undefined) m.reasoning_content = reasoning;
    reasoning = undefined;
    return m;
  };
  const add = (item: unknown, p: string, referenced: boolean): void => {
    if (kind(item) !== "object") throw bad(p, `'${p}' must be an object, got ${kind(item)}`);
    const it = item as Json;
    if (it.type === "item_reference" && !referenced) {
      const found = typeof it.id === "string" ? stored?.item(it.id) : undefined;
      if (!found) {
        throw bad(
          `${p}.id`,
          `'${p}.id' names no stored item${stored ? "" : " (responses are not stored: 'store' is false)"}`,
        );
      }
      return add(found, p, true);
    }
    if (it.type === "reasoning") {
      const parts = Array.isArray(it.content) && it.content.length > 0 ? it.content : it.summary;
      const text = Array.isArray(parts)
        ? parts.map((x) => (kind(x) === "object" && typeof (x as Json).text === "string" ? (x as Json).text : ""))
          .join("")
        : "";
      reasoning = (reasoning ?? "") + text;
      return;
    }
    if (it.type === "function_call") {
      const call = { id: it.call_id, type: "function", function: { name: it.name, arguments: it.arguments } };
      const last = messages.at(-1);
      // Parallel calls arrive as consecutive items: one assistant message holds them all.
      if (last?.role === "assistant" && Array.isArray(last.tool_calls) && last.content === null) {
        (last.tool_calls as Json[]).push(call);
      } else messages.push(assistant({ role: "assistant", content: null, tool_calls: [call] }));
      return;
    }
    if (it.type === "function_call_output") {
      const output = typeof it.output === "string" ? it.output : contentText(it.output, `${p}.output`);
      messages.push({ role: "tool", tool_call_id: it.call_id, content: output });
      return;
    }
    if (it.type !== undefined && it.type !== "message") {
      throw bad(
        `${p}.type`,
        `'${p}.type' ${
          JSON.stringify(it.type)
        } is not supported: message, reasoning, function_call, function_call_output and item_reference`,
        "unsupported_parameter",
      );
    }
    const role = it.role;
    if (!["user", "assistant", "system", "developer"].includes(role as string)) {
      throw bad(
        `${p}.role`,
        `'${p}.role' must be one of user, assistant, system, developer, got ${JSON.stringify(role ?? null)}`,
      );
    }
    const m: Json = { role, content: contentText(it.content, `${p}.content`) };
    messages.push(role === "assistant" ? assistant(m) : m);
  };
  items.forEach((item, i) => add(item, `${param}[${i}]`, false));
  return messages;
}

/** A Responses function tool (`{type: "function", name, description, parameters, strict}`)
 * in its chat form. */
function functionTool(t: unknown, p: string): Json {
  if (kind(t) !== "object") throw bad(p, `'${p}' must be an object, got ${kind(t)}`);
  const tool = t as Json;
  if (tool.type !== "function") {
    throw bad(
      `${p}.type`,
      `'${p}.type' must be "function", got ${JSON.stringify(tool.type ?? null)}`,
      "unsupported_parameter",
    );
  }
  const fn: Json = { name: tool.name };
  for (const f of ["description", "parameters", "strict"]) {
    if (tool[f] !== undefined && tool[f] !== null) fn[f] = tool[f];
  }
  return { type: "function", function: fn };
}

/** `text.format` as a chat `response_format` (`json_schema` is flat in the Responses API). */
function responseFormatOf(format: unknown): unknown {
  if (kind(format) !== "object") return format;
  const f = format as Json;
  if (f.type !== "json_schema") return f;
  const { type: _type, ...json_schema } = f;
  return { type: "json_schema", json_schema };
}

/** What identifies one response. */
export interface ResponsesHead {
  /** resp_... */
  id: string;
  /** Unix seconds. */
  created: number;
  /** The served model name. */
  model: string;
  /** The request's `max_output_tokens`, echoed. */
  maxOutputTokens: number | null;
  /** Whether the response is stored (cli/server/response_store.ts). */
  store?: boolean;
  /** The request's `previous_response_id`, echoed. */
  previousResponseId?: string | null;
}

/** One output item of a response: reasoning, a function call, the message. */
export type OutputItem =
  | { type: "reasoning"; id: string; summary: []; content: { type: "reasoning_text"; text: string }[] }
  | {
    type: "function_call";
    id: string;
    call_id: string;
    name: string;
    arguments: string;
    status: "completed";
  }
  | {
    type: "message";
    id: string;
    status: "completed" | "incomplete";
    role: "assistant";
    content: { type: "output_text"; text: string; annotations: [] }[];
  };

/** The Responses usage of an outcome. */
function responsesUsage(promptTokens: number, o: Outcome) {
  const out = o.result.tokens.length;
  return {
    input_tokens: promptTokens,
    input_tokens_details: { cached_tokens: o.result.cachedTokens ?? 0 },
    output_tokens: out,
    output_tokens_details: { reasoning_tokens: o.reasoningTokens ?? 0 },
    total_tokens: promptTokens + out,
  };
}

/** The `response` object: in progress (no outcome yet) or finished. */
export function responseObject(
  h: ResponsesHead,
  output: OutputItem[],
  done?: { o: Outcome; promptTokens: number },
): Json {
  const incomplete = done?.o.result.finishReason === "length";
  return {
    id: h.id,
    object: "response",
    created_at: h.created,
    status: !done ? "in_progress" : incomplete ? "incomplete" : "completed",
    error: null,
    incomplete_details: incomplete ? { reason: "max_output_tokens" } : null,
    instructions: null,
    max_output_tokens: h.maxOutputTokens,
    model: h.model,
    output,
    parallel_tool_calls: false,
    previous_response_id: h.previousResponseId ?? null,
    reasoning: { effort: null, summary: null },
    store: h.store ?? false,
    temperature: null,
    text: { format: { type: "text" } },
    tool_choice: "auto",
    tools: [],
    top_p: null,
    truncation: "disabled",
    usage: done ? responsesUsage(done.promptTokens, done.o) : null,
    metadata: {},
  };
}

/** The output items of a finished chat outcome: its think channel, then its reply. */
export function outputItems(r: ChatRequest, o: Outcome, ids: { reasoning: string; message: string }): OutputItem[] {
  const items = itemsOf(r.thinking ? o.reply.reasoning : "", o.reply.text, o.result.finishReason === "length", ids);
  const calls = o.reply.calls.map(callItem);
  if (calls.length === 0) return items;
  // A reply that only calls tools has no message item.
  const message = items.at(-1)!;
  const keep = message.type === "message" && message.content[0].text === "" ? items.slice(0, -1) : items;
  return [...keep, ...calls];
}

/** The `function_call` output item of a parsed call. */
function callItem(c: { id: string; name: string; arguments: string }): OutputItem {
  return {
    type: "function_call",
    id: `fc_${c.id.replace(/^call_/, "")}`,
    call_id: c.id,
    name: c.name,
    arguments: c.arguments,
    status: "completed",
  };
}

function itemsOf(
  reasoning: string,
  reply: string,
  cut: boolean,
  ids: { reasoning: string; message: string },
): OutputItem[] {
  const items: OutputItem[] = [];
  if (reasoning) {
    items.push({
      type: "reasoning",
      id: ids.reasoning,
      summary: [],
      content: [{ type: "reasoning_text", text: reasoning }],
    });
  }
  items.push({
    type: "message",
    id: ids.message,
    status: cut ? "incomplete" : "completed",
    role: "assistant",
    content: [{ type: "output_text", text: reply, annotations: [] }],
  });
  return items;
}

/** Sends one named server-sent event. */
export type SendEvent = (type: string, data: Json) => void;

/**
 * The event stream of one streamed response: `response.created` and `in_progress` first,
 * then the reasoning item's and the message item's events as text arrives, then
 * `response.completed` (or `incomplete`), or `error`.
 */
export class ResponseEventWriter {
  #seq = 0;
  #reasoning = "";
  #reply = "";
  /** Which item is open: none yet, the reasoning item, the message, or a function call. */
  #open: "none" | "reasoning" | "message" | "call" = "none";
  #items = 0;
  /** The function call being streamed. */
  #call?: { id: string; call_id: string; name: string; arguments: string };
  /** Whether a message item was sent (a reply of calls alone has none). */
  #messageSent = false;

  /** Events of a response under `head` to the chat request `r`, sent with `send`. */
  constructor(
    readonly send: SendEvent,
    readonly r: ChatRequest,
    readonly head: ResponsesHead,
    readonly ids: { reasoning: string; message: string },
  ) {
    const response = responseObject(head, []);
    this.#event("response.created", { response });
    this.#event("response.in_progress", { response });
  }

  #event(type: string, data: Json): void {
    this.send(type, { type, sequence_number: this.#seq++, ...data });
  }

  #openMessage(): void {
    if (this.#open === "message") return;
    this.#closeOpen();
    this.#open = "message";
    this.#messageSent = true;
    const item = { type: "message", id: this.ids.message, status: "in_progress", role: "assistant", content: [] };
    this.#event("response.output_item.added", { output_index: this.#items, item });
    this.#event("response.content_part.added", {
      item_id: this.ids.message,
      output_index: this.#items,
      content_index: 0,
      part: { type: "output_text", text: "", annotations: [] },
    });
  }

  #closeReasoning(): void {
    const item = itemsOf(this.#reasoning, "", false, this.ids)[0];
    const where = { item_id: this.ids.reasoning, output_index: this.#items, content_index: 0 };
    this.#event("response.reasoning_text.done", { ...where, text: this.#reasoning });
    this.#event("response.content_part.done", { ...where, part: { type: "reasoning_text", text: this.#reasoning } });
    this.#event("response.output_item.done", { output_index: this.#items, item });
    this.#items++;
  }

  /** Closes the item that is open (its done events). */
  #closeOpen(): void {
    if (this.#open === "reasoning") this.#closeReasoning();
    else if (this.#open === "message") this.#closeMessage(false);
    else if (this.#open === "call") this.#closeCall();
    this.#open = "none";
  }

  #closeMessage(cut: boolean): void {
    const item = itemsOf("", this.#reply, cut, this.ids)[0];
    const where = { item_id: this.ids.message, output_index: this.#items, content_index: 0 };
    this.#event("response.output_text.done", { ...where, text: this.#reply, logprobs: [] });
    this.#event("response.content_part.done", { ...where, part: item.type === "message" ? item.content[0] : null });
    this.#event("response.output_item.done", { output_index: this.#items, item });
    this.#items++;
  }

  #closeCall(): void {
    const c = this.#call!;
    this.#event("response.function_call_arguments.done", {
      item_id: c.id,
      output_index: this.#items,
      arguments: c.arguments,
    });
    this.#event("response.output_item.done", {
      output_index: this.#items,
      item: { type: "function_call", ...c, status: "completed" },
    });
    this.#items++;
    this.#call = undefined;
  }

  /** Sends what a step of the reply made safe: channel text, and function calls as they
   * are parsed (an item per call, its arguments as deltas). */
  step(_reply: ReplyStream, events: ReplyEvent[]): void {
    for (const e of events) {
      if (e.type === "text") this.#piece(e);
      else if (e.type === "call") {
        this.#closeOpen();
        this.#open = "call";
        this.#call = { id: `fc_${e.id.replace(/^call_/, "")}`, call_id: e.id, name: e.name, arguments: "" };
        this.#event("response.output_item.added", {
          output_index: this.#items,
          item: { type: "function_call", ...this.#call, status: "in_progress" },
        });
      } else if (this.#call) {
        this.#call.arguments += e.text;
        this.#event("response.function_call_arguments.delta", {
          item_id: this.#call.id,
          output_index: this.#items,
          delta: e.text,
        });
      }
    }
  }

  #piece(p: { channel: "think" | "response"; text: string }): void {
    if (p.channel === "think") {
      if (this.#open === "none") {
        this.#open = "reasoning";
        const item = { type: "reasoning", id: this.ids.reasoning, summary: [], content: [] };
        this.#event("response.output_item.added", { output_index: this.#items, item });
        // The part the deltas go to, announced first (openai-node's accumulator needs it).
        this.#event("response.content_part.added", {
          item_id: this.ids.reasoning,
          output_index: this.#items,
          content_index: 0,
          part: { type: "reasoning_text", text: "" },
        });
      }
      // Think text after the reply began is not the model's reasoning: it is dropped.
      if (this.#open !== "reasoning") return;
      this.#reasoning += p.text;
      this.#event("response.reasoning_text.delta", {
        item_id: this.ids.reasoning,
        output_index: this.#items,
        content_index: 0,
        delta: p.text,
      });
    } else {
      this.#openMessage();
      this.#reply += p.text;
      this.#event("response.output_text.delta", {
        item_id: this.ids.message,
        output_index: this.#items,
        content_index: 0,
        delta: p.text,
        logprobs: [],
      });
    }
  }

  /** Sends the end: the items' done events, the response. */
  finish(o: Outcome, promptTokens: number): void {
    const cut = o.result.finishReason === "length";
    const calls = o.reply.calls.length > 0;
    if (this.#open === "message") this.#closeMessage(cut);
    else {
      this.#closeOpen();
      // Every reply has its message item, except one of calls alone.
      if (!calls && !this.#messageSent) {
        this.#openMessage();
        this.#closeMessage(cut);
      }
    }
    const response = responseObject(this.head, outputItems(this.r, o, this.ids), { o, promptTokens });
    this.#event(cut ? "response.incomplete" : "response.completed", { response });
  }

  /** Sends an error event. */
  error(e: ApiError): void {
    const { error } = errorBody(e);
    this.#event("error", { code: error.code, message: error.message, param: error.param });
  }
}
