/**
 * The OpenAI wire format `k3 serve` and `k3 batch` speak: request validation (400s in OpenAI's error
 * shape, naming the offending `param`), and the response, chunk and error bodies of
 * `/v1/chat/completions` and `/v1/completions`.
 *
 * Pure functions of JSON values: nothing here touches the model, so the fuzz tests can
 * throw thousands of bodies at it quickly.
 *
 * Semantics follow OpenAI where it defines them (completions' max_tokens defaults to 16,
 * unknown fields are ignored) and vLLM where OpenAI does not (top_k, min_p, ignore_eos,
 * chat_template_kwargs, reasoning_content).
 *
 * @module
 */

import type { ChatMessage, HistoryToolCall, ToolChoice, ToolDecl } from "../engine/text/chat.ts";
import { EFFORTS } from "../engine/text/chat.ts";
import { MAX_TOP_LOGPROBS } from "../engine/generate/logprobs.ts";
import type { GNode } from "../engine/generate/grammar/automaton.ts";
import { ANY_OBJECT, compileSchema, SchemaError } from "../engine/generate/grammar/schema.ts";

/** An error answered as `{"error": {message, type, param, code}}` with an HTTP status. */
export class ApiError extends Error {
  /** An error with its HTTP status, the request field at fault, and OpenAI's code and type. */
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    readonly type: string = status >= 500 ? "server_error" : "invalid_request_error",
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** OpenAI's error body. */
export function errorBody(
  e: ApiError,
): { error: { message: string; type: string; param: string | null; code: string | null } } {
  return { error: { message: e.message, type: e.type, param: e.param, code: e.code } };
}

/** Sampling fields of a request; undefined: the endpoint's default (cli/request.ts DEFAULTS). */
export interface RequestSampling {
  /** 0 = greedy. */
  temperature?: number;
  /** Nucleus mass kept (1 = all). */
  topP?: number;
  /** Most likely tokens kept; 0 (or vLLM's -1) = all. */
  topK?: number;
  /** Tokens below minP times the top probability dropped. */
  minP?: number;
  /** The sampler's seed, 0..2^53-1; undefined: the server picks one. */
  seed?: number;
}

/** Fields both endpoints share. */
export interface CommonRequest {
  /** The requested model name, when given. */
  model?: string;
  /** Tokens to generate at most; undefined: the endpoint's default. */
  maxTokens?: number;
  /** Which field set maxTokens (for a 400 that names it). */
  maxTokensParam: "max_tokens" | "max_completion_tokens";
  /** How the next token is picked. */
  sampling: RequestSampling;
  /** Stop strings (never emitted). */
  stop: string[];
  /** Answer as server-sent events. */
  stream: boolean;
  /** stream_options.include_usage. */
  includeUsage: boolean;
  /** vLLM's ignore_eos: generate to max_tokens through end-of-message ids (benchmarks). */
  ignoreEos: boolean;
  /** Return log probabilities (chat `logprobs: true`; completions `logprobs: N`). */
  logprobs?: boolean;
  /** Alternatives per token, 0..20 (chat `top_logprobs`; completions the N of `logprobs`). */
  topLogprobs?: number;
}

/** A validated `response_format` that constrains the reply: its JSON value's grammar. */
export interface ResponseFormat {
  /** json_object: any JSON object (not another value); json_schema: the schema's subset (engine/generate/grammar/schema.ts). */
  type: "json_object" | "json_schema";
  /** json_schema.name. */
  name?: string;
  /** The grammar of the reply's content. */
  value: GNode;
}

/** A validated `/v1/chat/completions` request. */
export interface ChatRequest extends CommonRequest {
  /** Which endpoint. */
  kind: "chat";
  /** The conversation, developer messages as system messages. */
  messages: ChatMessage[];
  /** chat_template_kwargs.thinking (default true: the think channel opens first). */
  thinking: boolean;
  /** chat_template_kwargs.thinking_effort. */
  effort?: string;
  /** response_format json_object or json_schema (text: undefined). */
  responseFormat?: ResponseFormat;
  /** Function tools the reply may call (absent or empty: none). */
  tools?: ToolDecl[];
  /** The request's tool_choice, when it gave one. */
  toolChoice?: ToolChoice;
  /** parallel_tool_calls (default true; false: one call at most). */
  parallelToolCalls?: boolean;
}

/** A validated `/v1/completions` request. */
export interface CompletionRequest extends CommonRequest {
  /** Which endpoint. */
  kind: "completion";
  /** Text (encoded without special tokens) or token ids. */
  prompt: string | number[];
}

/** Stop strings per request at most (OpenAI allows 4; vLLM more). */
export const MAX_STOPS = 16;

type Json = Record<string, unknown>;

function typeName(v: unknown): string {
  return v === null ? "null" : Array.isArray(v) ? "array" : typeof v;
}

function bad(param: string, message: string, code: string | null = null): ApiError {
  return new ApiError(400, message, param, code);
}

/** Reads optional fields of a JSON object, each checked with a 400 naming the field. */
class Fields {
  constructor(readonly obj: Json, readonly prefix = "") {}
  #name(k: string): string {
    return this.prefix + k;
  }
  /** Present and not null (OpenAI treats null as absent). */
  has(k: string): boolean {
    return this.obj[k] !== undefined && this.obj[k] !== null;
  }
  string(k: string): string | undefined {
    const v = this.obj[k];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "string") throw bad(this.#name(k), `'${this.#name(k)}' must be a string, got ${typeName(v)}`);
    return v;
  }
  boolean(k: string): boolean | undefined {
    const v = this.obj[k];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "boolean") throw bad(this.#name(k), `'${this.#name(k)}' must be a boolean, got ${typeName(v)}`);
    return v;
  }
  number(k: string, min: number, max: number, minOpen = false): number | undefined {
    const v = this.obj[k];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "number" || !Number.isFinite(v)) {
      throw bad(this.#name(k), `'${this.#name(k)}' must be a number, got ${typeName(v)}`);
    }
    if (v < min || v > max || (minOpen && v === min)) {
      throw bad(this.#name(k), `'${this.#name(k)}' must be in ${minOpen ? "(" : "["}${min}, ${max}], got ${v}`);
    }
    return v;
  }
  integer(k: string, min: number, max: number): number | undefined {
    const v = this.obj[k];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "number" || !Number.isSafeInteger(v)) {
      throw bad(
        this.#name(k),
        `'${this.#name(k)}' must be an integer, got ${typeName(v) === "number" ? v : typeName(v)}`,
      );
    }
    if (v < min || v > max) throw bad(this.#name(k), `'${this.#name(k)}' must be in [${min}, ${max}], got ${v}`);
    return v;
  }
  object(k: string): Fields | undefined {
    const v = this.obj[k];
    if (v === undefined || v === null) return undefined;
    if (typeName(v) !== "object") throw bad(this.#name(k), `'${this.#name(k)}' must be an object, got ${typeName(v)}`);
    return new Fields(v as Json, this.#name(k) + ".");
  }
  /** Refuses a field k3 does not implement, unless it holds one of the `harmless` values. */
  refuse(k: string, why: string, harmless: unknown[] = []): void {
    const v = this.obj[k];
    if (v === undefined || v === null || harmless.some((h) => h === v)) return;
    if (Array.isArray(v) && v.length === 0 && harmless.some((h) => Array.isArray(h))) return;
    if (
      typeName(v) === "object" && Object.keys(v as Json).length === 0 && harmless.some((h) => typeName(h) === "object")
    ) {
      return;
    }
    throw bad(this.#name(k), `'${this.#name(k)}' is not supported by k3 serve: ${why}`, "unsupported_parameter");
  }
}

function asObject(body: unknown): Fields {
  if (typeName(body) !== "object") {
    throw new ApiError(400, `the request body must be a JSON object, got ${typeName(body)}`);
  }
  return new Fields(body as Json);
}

function stops(f: Fields): string[] {
  const v = f.obj.stop;
  if (v === undefined || v === null) return [];
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list)) throw bad("stop", `'stop' must be a string or an array of strings, got ${typeName(v)}`);
  if (list.length > MAX_STOPS) throw bad("stop", `'stop' has ${list.length} strings, at most ${MAX_STOPS}`);
  list.forEach((s, i) => {
    if (typeof s !== "string") throw bad(`stop[${i}]`, `'stop[${i}]' must be a string, got ${typeName(s)}`);
    if (s === "") throw bad(`stop[${i}]`, `'stop[${i}]' must not be empty`);
  });
  return list as string[];
}

/** The fields chat and completions share, validated. */
function common(f: Fields): CommonRequest {
  const model = f.string("model");
  const n = f.integer("n", 1, 128);
  if (n !== undefined && n !== 1) throw bad("n", `'n' must be 1: k3 serve generates one choice per request, got ${n}`);
  const maxTokens = f.integer("max_tokens", 1, Number.MAX_SAFE_INTEGER);
  const maxCompletion = f.integer("max_completion_tokens", 1, Number.MAX_SAFE_INTEGER);
  const stream = f.boolean("stream") ?? false;
  const opts = f.object("stream_options");
  if (opts && !stream) throw bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
  const includeUsage = opts?.boolean("include_usage") ?? false;
  f.refuse("logit_bias", "logit biases are not applied", [{}]);
  f.refuse("presence_penalty", "penalties are not applied", [0]);
  f.refuse("frequency_penalty", "penalties are not applied", [0]);
  f.refuse("repetition_penalty", "penalties are not applied", [1]);
  const topK = f.integer("top_k", -1, 1e9);
  return {
    model,
    // max_completion_tokens is the newer name; when both are given it wins, as in OpenAI.
    maxTokens: maxCompletion ?? maxTokens,
    maxTokensParam: maxCompletion !== undefined ? "max_completion_tokens" : "max_tokens",
    sampling: {
      temperature: f.number("temperature", 0, 2),
      topP: f.number("top_p", 0, 1, true),
      // vLLM: -1 (and 0) mean no top-k.
      topK: topK === undefined ? undefined : Math.max(topK, 0),
      minP: f.number("min_p", 0, 1 - Number.EPSILON),
      seed: f.integer("seed", 0, Number.MAX_SAFE_INTEGER),
    },
    stop: stops(f),
    stream,
    includeUsage,
    ignoreEos: f.boolean("ignore_eos") ?? false,
  };
}

/** The text of a message's content: a string, or an array of text parts (images refused). */
function messageText(v: unknown, param: string): string {
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) {
    throw bad(param, `'${param}' must be a string or an array of content parts, got ${typeName(v)}`);
  }
  return v.map((part, j) => {
    const p = `${param}[${j}]`;
    if (typeName(part) !== "object") throw bad(p, `'${p}' must be an object, got ${typeName(part)}`);
    const type = (part as Json).type;
    if (type === "text") {
      const text = (part as Json).text;
      if (typeof text !== "string") throw bad(`${p}.text`, `'${p}.text' must be a string, got ${typeName(text)}`);
      return text;
    }
    if (type === "image_url" || type === "input_image" || type === "image") {
      throw bad(p, `'${p}' is an image: k3 serve takes text only`, "unsupported_parameter");
    }
    throw bad(`${p}.type`, `'${p}.type' must be "text", got ${JSON.stringify(type ?? null)}`);
  }).join("");
}

function message(v: unknown, i: number): ChatMessage {
  const p = `messages[${i}]`;
  if (typeName(v) !== "object") throw bad(p, `'${p}' must be an object, got ${typeName(v)}`);
  const f = new Fields(v as Json, `${p}.`);
  const role = f.string("role");
  if (role === undefined) throw bad(`${p}.role`, `'${p}.role' is required`);
  if (role === "function") {
    throw bad(
      `${p}.role`,
      `'${p}.role' "function" (the deprecated function calling) is not supported: use tools and role "tool"`,
      "unsupported_parameter",
    );
  }
  if (!["system", "developer", "user", "assistant", "tool"].includes(role)) {
    throw bad(
      `${p}.role`,
      `'${p}.role' must be one of system, developer, user, assistant, tool, got ${JSON.stringify(role)}`,
    );
  }
  f.refuse("function_call", "the deprecated function calling is not supported: use tool_calls");
  const content = (v as Json).content;
  let text: string;
  if (content === undefined || content === null) {
    if (role !== "assistant") throw bad(`${p}.content`, `'${p}.content' is required`);
    text = "";
  } else {
    text = messageText(content, `${p}.content`);
  }
  const msg: ChatMessage = { role: role === "developer" ? "system" : role as ChatMessage["role"], content: text };
  if (role === "tool") {
    const id = f.string("tool_call_id");
    if (id === undefined) throw bad(`${p}.tool_call_id`, `'${p}.tool_call_id' is required for a tool message`);
    msg.toolCallId = id;
    const name = f.string("name");
    if (name !== undefined) msg.name = name;
  }
  if (role === "assistant") {
    const calls = historyCalls((v as Json).tool_calls, `${p}.tool_calls`);
    if (calls.length > 0) msg.toolCalls = calls;
    // vLLM's name for the think channel; `reasoning` is what some clients send back.
    const reasoning = f.string("reasoning_content") ?? f.string("reasoning");
    if (reasoning !== undefined) msg.reasoning = reasoning;
  }
  return msg;
}

/** The tool calls of an assistant message in the history (OpenAI's shape). */
function historyCalls(v: unknown, param: string): HistoryToolCall[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw bad(param, `'${param}' must be an array, got ${typeName(v)}`);
  return v.map((c, i) => {
    const p = `${param}[${i}]`;
    if (typeName(c) !== "object") throw bad(p, `'${p}' must be an object, got ${typeName(c)}`);
    const f = new Fields(c as Json, `${p}.`);
    const type = f.string("type") ?? "function";
    if (type !== "function") throw bad(`${p}.type`, `'${p}.type' must be "function", got ${JSON.stringify(type)}`);
    const fn = f.object("function");
    if (!fn) throw bad(`${p}.function`, `'${p}.function' is required`);
    const name = fn.string("name");
    if (name === undefined) throw bad(`${p}.function.name`, `'${p}.function.name' is required`);
    const args = fn.obj.arguments;
    // Arguments are JSON text in OpenAI's shape; an object as sent by some clients is accepted.
    const text = typeof args === "string" ? args : args === undefined || args === null ? "{}" : JSON.stringify(args);
    const id = f.string("id");
    return id === undefined ? { name, arguments: text } : { id, name, arguments: text };
  });
}

/** A function name as OpenAI allows one: letters, digits, `_` and `-`, at most 64. */
const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;

/** Validates an OpenAI `tools` array (a `k3 chat --tools` file holds one); throws
 * ApiError(400) naming the bad element. */
export function parseTools(tools: unknown): ToolDecl[] {
  return toolDecls(new Fields({ tools })) ?? [];
}

/** `tools`: OpenAI function tools. */
function toolDecls(f: Fields): ToolDecl[] | undefined {
  const v = f.obj.tools;
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) throw bad("tools", `'tools' must be an array, got ${typeName(v)}`);
  const names = new Set<string>();
  return v.map((t, i) => {
    const p = `tools[${i}]`;
    if (typeName(t) !== "object") throw bad(p, `'${p}' must be an object, got ${typeName(t)}`);
    const tf = new Fields(t as Json, `${p}.`);
    const type = tf.string("type");
    if (type !== "function") {
      throw bad(
        `${p}.type`,
        `'${p}.type' must be "function", got ${JSON.stringify(type ?? null)}`,
        "unsupported_parameter",
      );
    }
    const fn = tf.object("function");
    if (!fn) throw bad(`${p}.function`, `'${p}.function' is required`);
    const name = fn.string("name");
    if (name === undefined || !TOOL_NAME.test(name)) {
      throw bad(
        `${p}.function.name`,
        `'${p}.function.name' must be 1-64 letters, digits, _ or -, got ${JSON.stringify(name ?? null)}`,
      );
    }
    if (names.has(name)) {
      throw bad(`${p}.function.name`, `'${p}.function.name' ${JSON.stringify(name)} is declared twice`);
    }
    names.add(name);
    const decl: ToolDecl = { name };
    const description = fn.string("description");
    if (description !== undefined) decl.description = description;
    const params = fn.object("parameters");
    if (params) decl.parameters = params.obj;
    const strict = fn.boolean("strict");
    if (strict !== undefined) decl.strict = strict;
    return decl;
  });
}

/** `tool_choice`, checked against the declared tools. */
function toolChoice(f: Fields, tools: ToolDecl[] | undefined): ToolChoice | undefined {
  const v = f.obj.tool_choice;
  if (v === undefined || v === null) return undefined;
  let choice: ToolChoice;
  if (v === "none" || v === "auto" || v === "required") choice = v;
  else if (typeName(v) === "object") {
    const c = new Fields(v as Json, "tool_choice.");
    if (c.string("type") !== "function") throw bad("tool_choice.type", `'tool_choice.type' must be "function"`);
    const name = c.object("function")?.string("name");
    if (name === undefined) throw bad("tool_choice.function.name", "'tool_choice.function.name' is required");
    if (!tools?.some((t) => t.name === name)) {
      throw bad(
        "tool_choice",
        `'tool_choice' names the function ${JSON.stringify(name)}, which 'tools' does not declare`,
      );
    }
    choice = { name };
  } else {
    throw bad(
      "tool_choice",
      `'tool_choice' must be "none", "auto", "required" or {"type": "function", ...}, got ${JSON.stringify(v)}`,
    );
  }
  if (choice === "required" && !(tools && tools.length > 0)) {
    throw bad("tool_choice", "'tool_choice' is \"required\" but 'tools' declares none");
  }
  return choice;
}

/** Validates a `/v1/chat/completions` body; throws ApiError(400) naming the bad field. */
export function parseChatRequest(body: unknown): ChatRequest {
  const f = asObject(body);
  const raw = f.obj.messages;
  if (raw === undefined || raw === null) throw bad("messages", "'messages' is required");
  if (!Array.isArray(raw)) throw bad("messages", `'messages' must be an array, got ${typeName(raw)}`);
  if (raw.length === 0) throw bad("messages", "'messages' must not be empty");
  const messages = raw.map(message);
  const declared = toolDecls(f);
  const tools = declared && declared.length > 0 ? declared : undefined;
  const choice = toolChoice(f, tools);
  const parallelToolCalls = f.boolean("parallel_tool_calls");
  f.refuse("functions", "the deprecated function calling is not supported: use tools", [[]]);
  f.refuse("function_call", "the deprecated function calling is not supported: use tool_choice", ["none"]);
  const logprobs = f.boolean("logprobs");
  const topLogprobs = f.integer("top_logprobs", 0, MAX_TOP_LOGPROBS);
  if (topLogprobs !== undefined && logprobs !== true) {
    throw bad("top_logprobs", "'top_logprobs' needs 'logprobs' to be true");
  }
  const kw = f.object("chat_template_kwargs");
  const thinking = kw?.boolean("thinking") ?? kw?.boolean("enable_thinking") ?? true;
  const effort = kw?.string("thinking_effort") ?? f.string("reasoning_effort");
  if (effort !== undefined && !(EFFORTS as readonly string[]).includes(effort)) {
    const param = kw?.has("thinking_effort") ? "chat_template_kwargs.thinking_effort" : "reasoning_effort";
    throw bad(param, `'${param}' must be one of ${EFFORTS.join(", ")}, got ${JSON.stringify(effort)}`);
  }
  const responseFormat = parseResponseFormat(f);
  return {
    kind: "chat",
    ...common(f),
    messages,
    thinking,
    effort,
    ...(tools ? { tools } : {}),
    ...(choice !== undefined ? { toolChoice: choice } : {}),
    ...(parallelToolCalls !== undefined ? { parallelToolCalls } : {}),
    ...(logprobs ? { logprobs: true, topLogprobs: topLogprobs ?? 0 } : {}),
    ...(responseFormat ? { responseFormat } : {}),
  };
}

/** Wraps a schema the grammar cannot enforce as a 400 naming the keyword under `param`. */
export function schemaApiError(e: SchemaError, param: string): ApiError {
  const where = e.path === "" ? param : `${param}.${e.path}`;
  return bad(where, e.message.replace(/^(the schema|'[^']*'):/, `'${where}':`), "unsupported_parameter");
}

/** response_format: text (undefined), json_object, or json_schema with a schema of the subset. */
function parseResponseFormat(f: Fields): ResponseFormat | undefined {
  const rf = f.object("response_format");
  if (!rf) return undefined;
  const type = rf.string("type");
  if (type === undefined) throw bad("response_format.type", "'response_format.type' is required");
  if (type === "text") return undefined;
  if (type === "json_object") return { type, value: ANY_OBJECT };
  if (type !== "json_schema") {
    throw bad(
      "response_format.type",
      `'response_format.type' must be text, json_object or json_schema, got ${JSON.stringify(type)}`,
    );
  }
  const js = rf.object("json_schema");
  if (!js) throw bad("response_format.json_schema", "'response_format.json_schema' is required for type json_schema");
  const name = js.string("name");
  if (name === undefined) {
    throw bad("response_format.json_schema.name", "'response_format.json_schema.name' is required");
  }
  js.boolean("strict");
  const schema = js.obj.schema ?? {};
  try {
    return { type, name, value: compileSchema(schema) };
  } catch (e) {
    if (e instanceof SchemaError) throw schemaApiError(e, "response_format.json_schema.schema");
    throw e;
  }
}

/** Validates a `/v1/completions` body (prompt: text or ids below `vocab`). */
export function parseCompletionRequest(body: unknown, vocab: number): CompletionRequest {
  const f = asObject(body);
  let raw = f.obj.prompt;
  if (raw === undefined || raw === null) throw bad("prompt", "'prompt' is required");
  // A list holding one prompt (text or ids) is that prompt; more would be a batch.
  if (Array.isArray(raw) && raw.length === 1 && (typeof raw[0] === "string" || Array.isArray(raw[0]))) raw = raw[0];
  let prompt: string | number[];
  if (typeof raw === "string") {
    if (raw === "") throw bad("prompt", "'prompt' must not be empty");
    prompt = raw;
  } else if (Array.isArray(raw)) {
    if (raw.length === 0) throw bad("prompt", "'prompt' must not be empty");
    if (raw.every((x) => typeof x === "string" || Array.isArray(x))) {
      throw bad("prompt", `'prompt' holds ${raw.length} prompts: k3 serve takes one per request`);
    }
    raw.forEach((id, i) => {
      if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id >= vocab) {
        throw bad(`prompt[${i}]`, `'prompt[${i}]' must be a token id in [0, ${vocab - 1}], got ${JSON.stringify(id)}`);
      }
    });
    prompt = raw as number[];
  } else {
    throw bad("prompt", `'prompt' must be a string or an array of token ids, got ${typeName(raw)}`);
  }
  f.refuse("echo", "the prompt is not echoed", [false]);
  f.refuse("suffix", "insertion is not supported", [""]);
  const bestOf = f.integer("best_of", 1, 128);
  if (bestOf !== undefined && bestOf !== 1) throw bad("best_of", `'best_of' must be 1, got ${bestOf}`);
  // Completions' logprobs is the number of alternatives (0: the chosen token's only).
  const n = f.integer("logprobs", 0, MAX_TOP_LOGPROBS);
  return { kind: "completion", ...common(f), prompt, ...(n !== undefined ? { logprobs: true, topLogprobs: n } : {}) };
}

/** Token counts of a response. */
export interface Usage {
  /** Tokens of the prompt (the rendered chat, for chat). */
  prompt_tokens: number;
  /** Tokens generated, a final stop id included. */
  completion_tokens: number;
  /** The sum. */
  total_tokens: number;
  /** Of the completion tokens, those of the think channel. */
  completion_tokens_details?: { reasoning_tokens: number };
  /** Of the prompt tokens, those served from the state cache instead of prefilled. */
  prompt_tokens_details?: { cached_tokens: number };
}

/** Usage from prompt and completion token counts (`reasoning`: think-channel tokens, when
 * known; `cached`: prompt tokens served from the state cache, OpenAI's `prompt_tokens_details`). */
export function usage(prompt: number, completion: number, reasoning?: number, cached?: number): Usage {
  const u: Usage = { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
  if (reasoning !== undefined) u.completion_tokens_details = { reasoning_tokens: reasoning };
  if (cached !== undefined) u.prompt_tokens_details = { cached_tokens: cached };
  return u;
}

/** OpenAI's finish reasons; an interrupted sequence is never answered as finished. */
export type OpenAIFinish = "stop" | "length" | "tool_calls";

/** The OpenAI finish reason of a finished (not interrupted) sequence; a turn that ended
 * with tool calls finished with "tool_calls". */
export function finishReason(r: "stop" | "length" | "interrupted", toolCalls = false): OpenAIFinish {
  if (r === "interrupted") throw new Error("an interrupted sequence has no OpenAI finish reason");
  return r === "stop" && toolCalls ? "tool_calls" : r;
}

/** One tool call of an answer, OpenAI's shape. */
export interface ToolCallBody {
  /** The call's id. */
  id: string;
  /** Always "function". */
  type: "function";
  /** What is called. */
  function: { name: string; arguments: string };
}

/** A tool call as OpenAI answers it. */
export function toolCallBody(c: { id: string; name: string; arguments: string }): ToolCallBody {
  return { id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } };
}

/** One token's log probability entry, OpenAI's chat shape. */
export interface LogprobEntry {
  /** The token's text (its bytes decoded alone; `bytes` has them exactly). */
  token: string;
  /** Its log probability. */
  logprob: number;
  /** Its UTF-8 bytes. */
  bytes: number[];
}

/** Chat `logprobs`: per content token, its entry and the most likely alternatives'. */
export interface ChatLogprobs {
  /** One per token of the response channel. */
  content: (LogprobEntry & { top_logprobs: LogprobEntry[] })[];
  /** Always null. */
  refusal: null;
}

/** Completions `logprobs`: the legacy shape, one element per generated token. */
export interface CompletionLogprobs {
  /** The tokens' texts. */
  tokens: string[];
  /** Their log probabilities. */
  token_logprobs: number[];
  /** Per token, the alternatives as text to log probability. */
  top_logprobs: Record<string, number>[];
  /** Where each token's text starts in the completion (UTF-16 code units). */
  text_offset: number[];
}

/** What identifies one response and its chunks. */
export interface ResponseHead {
  /** chatcmpl-... or cmpl-..., the same in every chunk. */
  id: string;
  /** Unix seconds. */
  created: number;
  /** The served model name. */
  model: string;
  /** What identifies the server's build and model (OpenAI's `system_fingerprint`). */
  system_fingerprint?: string;
}

/** `chat.completion`: a whole chat answer. */
export interface ChatCompletion extends ResponseHead {
  /** Always "chat.completion". */
  object: "chat.completion";
  /** The one choice. */
  choices: {
    index: 0;
    message: {
      role: "assistant";
      content: string | null;
      reasoning_content: string | null;
      refusal: null;
      tool_calls?: ToolCallBody[];
    };
    logprobs: ChatLogprobs | null;
    finish_reason: OpenAIFinish;
  }[];
  /** Token counts. */
  usage: Usage;
}

/** `chat.completion.chunk`: one server-sent event of a streamed chat answer. */
export interface ChatChunk extends ResponseHead {
  /** Always "chat.completion.chunk". */
  object: "chat.completion.chunk";
  /** The one choice's delta (none in the usage chunk). */
  choices: { index: 0; delta: ChatDelta; logprobs: ChatLogprobs | null; finish_reason: OpenAIFinish | null }[];
  /** null on every chunk but the last when stream_options.include_usage; absent otherwise. */
  usage?: Usage | null;
}

/** `text_completion`: a whole completion, or one chunk of a streamed one. */
export interface Completion extends ResponseHead {
  /** Always "text_completion". */
  object: "text_completion";
  /** The one choice (none in the usage chunk). */
  choices: { index: 0; text: string; logprobs: CompletionLogprobs | null; finish_reason: OpenAIFinish | null }[];
  /** Token counts (null or absent on stream chunks before the last). */
  usage?: Usage | null;
}

/** `GET /v1/models`. */
export interface ModelList {
  /** Always "list". */
  object: "list";
  /** The one served model. */
  data: { id: string; object: "model"; created: number; owned_by: string }[];
}

/** A non-streamed chat completion. */
export function chatCompletion(
  h: ResponseHead,
  out: {
    content: string;
    reasoning: string | null;
    finish: OpenAIFinish;
    usage: Usage;
    toolCalls?: ToolCallBody[];
    logprobs?: ChatLogprobs | null;
  },
): ChatCompletion {
  const calls = out.toolCalls ?? [];
  return {
    id: h.id,
    object: "chat.completion" as const,
    created: h.created,
    model: h.model,
    system_fingerprint: h.system_fingerprint,
    choices: [{
      index: 0,
      message: {
        role: "assistant" as const,
        // With tool calls and no text, content is null, as OpenAI answers.
        content: calls.length > 0 && out.content === "" ? null : out.content,
        reasoning_content: out.reasoning,
        refusal: null,
        ...(calls.length > 0 ? { tool_calls: calls } : {}),
      },
      logprobs: out.logprobs ?? null,
      finish_reason: out.finish,
    }],
    usage: out.usage,
  };
}

/** The delta of one chat chunk. */
export interface ChatDelta {
  /** "assistant", on the first chunk only. */
  role?: "assistant";
  /** Response-channel text. */
  content?: string;
  /** Think-channel text. */
  reasoning_content?: string;
  /** Tool calls: the first delta of a call has its id, type and name, later ones more arguments. */
  tool_calls?: {
    index: number;
    id?: string;
    type?: "function";
    function: { name?: string; arguments: string };
  }[];
}

/** One streamed chat chunk; `usage` is null on every chunk but the last when usage was asked. */
export function chatChunk(
  h: ResponseHead,
  delta: ChatDelta,
  finish: OpenAIFinish | null,
  includeUsage: boolean,
  logprobs: ChatLogprobs | null = null,
): ChatChunk {
  return {
    id: h.id,
    object: "chat.completion.chunk" as const,
    created: h.created,
    model: h.model,
    system_fingerprint: h.system_fingerprint,
    choices: [{ index: 0, delta, logprobs, finish_reason: finish }],
    ...(includeUsage ? { usage: null } : {}),
  };
}

/** The last chunk of a stream that asked for usage: no choices, the usage. */
export function usageChunk(
  h: ResponseHead,
  object: "chat.completion.chunk" | "text_completion",
  u: Usage,
): ChatChunk | Completion {
  return {
    id: h.id,
    object,
    created: h.created,
    model: h.model,
    system_fingerprint: h.system_fingerprint,
    choices: [],
    usage: u,
  };
}

/** A non-streamed completion. */
export function completion(
  h: ResponseHead,
  out: { text: string; finish: OpenAIFinish; usage: Usage; logprobs?: CompletionLogprobs | null },
): Completion {
  return {
    id: h.id,
    object: "text_completion" as const,
    created: h.created,
    model: h.model,
    system_fingerprint: h.system_fingerprint,
    choices: [{ index: 0, text: out.text, logprobs: out.logprobs ?? null, finish_reason: out.finish }],
    usage: out.usage,
  };
}

/** One streamed completion chunk. */
export function completionChunk(
  h: ResponseHead,
  text: string,
  finish: OpenAIFinish | null,
  includeUsage: boolean,
  logprobs: CompletionLogprobs | null = null,
): Completion {
  return {
    id: h.id,
    object: "text_completion" as const,
    created: h.created,
    model: h.model,
    system_fingerprint: h.system_fingerprint,
    choices: [{ index: 0, text, logprobs, finish_reason: finish }],
    ...(includeUsage ? { usage: null } : {}),
  };
}

/** `GET /v1/models`. */
export function modelList(name: string, created: number): ModelList {
  return { object: "list" as const, data: [{ id: name, object: "model" as const, created, owned_by: "k3" }] };
}

/** One server-sent event carrying `data` (JSON, or the literal [DONE]). */
export function sse(data: unknown): string {
  return `data: ${data === "[DONE]" ? data : JSON.stringify(data)}\n\n`;
}
