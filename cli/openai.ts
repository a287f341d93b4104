/**
 * The request side of the OpenAI wire format `k3 serve` and `k3 batch` speak: a request body
 * of `/v1/chat/completions` or `/v1/completions` validated (engine/json_fields.ts) into the
 * ChatRequest or CompletionRequest cli/request.ts converts, or an ApiError (a 400 in OpenAI's
 * error shape naming the offending `param`). The response side is cli/openai_response.ts.
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

import type { ChatMessage, Effort, HistoryToolCall, ToolChoice, ToolDecl } from "../engine/text/chat.ts";
import { EFFORTS, pythonJson } from "../engine/text/chat.ts";
import { MAX_TOP_LOGPROBS } from "../engine/generate/logprobs.ts";
import type { GNode } from "../engine/generate/grammar/automaton.ts";
import { ANY_OBJECT, compileSchema, SchemaError } from "../engine/generate/grammar/schema.ts";
import { JsonFields, type JsonKey } from "../engine/json_fields.ts";
import { ApiError, bad, need, refuse, REQUEST, requestError } from "./openai_error.ts";
import type { Penalties } from "../engine/generate/penalties.ts";

// cli/chat.ts reads `k3 chat --tools` with parseTools and catches its ApiError from here.
export { ApiError };

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
  /** Choices to generate (1..128). */
  n: number;
  /** Tokens to generate at most; undefined: the endpoint's default. */
  maxTokens?: number;
  /** Which field set maxTokens (for a 400 that names it). */
  maxTokensParam: "max_tokens" | "max_completion_tokens";
  /** How the next token is picked. */
  sampling: RequestSampling;
  /** Stop strings (never emitted). */
  stop: string[];
  /** presence/frequency/repetition penalties and logit_bias (neutral when not given). */
  penalties: Penalties;
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
  /** json_schema: the schema as the encoder's response-format note shows it. */
  schema?: unknown;
}

/** A validated `/v1/chat/completions` request. */
export interface ChatRequest extends CommonRequest {
  /** Which endpoint. */
  kind: "chat";
  /** The conversation, developer messages as system messages. */
  messages: ChatMessage[];
  /** chat_template_kwargs.thinking (default true: the think channel opens first). */
  thinking: boolean;
  /** The thinking effort (chat_template_kwargs.thinking_effort, else reasoning_effort);
   * undefined: the encoder's default, null: no effort note. */
  effort?: Effort | null;
  /** response_format json_object or json_schema (text: undefined). */
  responseFormat?: ResponseFormat;
  /** Function tools the reply may call (absent or empty: none). */
  tools?: ToolDecl[];
  /** The request's tool_choice, when it gave one. */
  toolChoice?: ToolChoice;
  /** parallel_tool_calls (default true; false: one call at most). */
  parallelToolCalls?: boolean;
  /** max_reasoning_tokens: the think channel is closed after this many tokens. */
  maxReasoningTokens?: number;
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

function stops(f: JsonFields): string[] {
  if (!f.has("stop")) return [];
  if (typeof f.get("stop") === "string") return [stopString(f, "stop")];
  const list = need(
    f,
    "stop",
    Array.isArray(f.get("stop")) ? f.array("stop") : undefined,
    "a string or an array of strings",
  );
  if (list.length > MAX_STOPS) throw bad("stop", `'stop' has ${list.length} strings, at most ${MAX_STOPS}`);
  return Array.from({ length: list.length }, (_, i) => stopString(list, i));
}

function stopString(f: JsonFields, k: JsonKey): string {
  const s = need(f, k, f.string(k), "a string");
  if (s === "") throw bad(f.name(k), `'${f.name(k)}' must not be empty`);
  return s;
}

/** presence_penalty, frequency_penalty, repetition_penalty and logit_bias (engine/generate/penalties.ts). */
function penalties(f: JsonFields): Penalties {
  const bias = new Map<number, number>();
  const b = f.object("logit_bias");
  if (b) {
    for (const key of Object.keys(b.value)) {
      if (!/^(0|[1-9]\d{0,9})$/.test(key)) {
        throw bad(b.name(key), `'logit_bias' keys must be token ids, got ${JSON.stringify(key.slice(0, 40))}`);
      }
      bias.set(Number(key), need(b, key, b.number(key, { min: -100, max: 100 }), "a number in -100..100"));
    }
  }
  return {
    presence: f.number("presence_penalty", { min: -2, max: 2 }) ?? 0,
    frequency: f.number("frequency_penalty", { min: -2, max: 2 }) ?? 0,
    repetition: f.number("repetition_penalty", { min: 0, max: 2, minOpen: true }) ?? 1,
    bias,
  };
}

/** The fields chat and completions share, validated. */
function common(f: JsonFields): CommonRequest {
  const model = f.string("model");
  const n = f.int("n", 1, 128) ?? 1;
  const maxTokens = f.int("max_tokens", 1, Number.MAX_SAFE_INTEGER);
  const maxCompletion = f.int("max_completion_tokens", 1, Number.MAX_SAFE_INTEGER);
  const stream = f.boolean("stream") ?? false;
  const opts = f.object("stream_options");
  if (opts && !stream) throw bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
  const includeUsage = opts?.boolean("include_usage") ?? false;
  const topK = f.int("top_k", -1, 1e9);
  return {
    model,
    n,
    // max_completion_tokens is the newer name; when both are given it wins, as in OpenAI.
    maxTokens: maxCompletion ?? maxTokens,
    maxTokensParam: maxCompletion !== undefined ? "max_completion_tokens" : "max_tokens",
    sampling: {
      temperature: f.number("temperature", { min: 0, max: 2 }),
      topP: f.number("top_p", { min: 0, max: 1, minOpen: true }),
      // vLLM: -1 (and 0) mean no top-k.
      topK: topK === undefined ? undefined : Math.max(topK, 0),
      minP: f.number("min_p", { min: 0, max: 1 - Number.EPSILON }),
      seed: f.int("seed", 0, Number.MAX_SAFE_INTEGER),
    },
    penalties: penalties(f),
    stop: stops(f),
    stream,
    includeUsage,
    ignoreEos: f.boolean("ignore_eos") ?? false,
  };
}

/** A message's content: a string, or an array of text parts (images refused), kept as
 * parts since the encoder tokenizes each on its own. */
function messageContent(m: JsonFields): { content: string; parts?: string[] } {
  const content = m.get("content");
  if (typeof content === "string") return { content };
  const expected = "a string or an array of content parts";
  const list = need(m, "content", Array.isArray(content) ? m.array("content") : undefined, expected);
  const parts = Array.from({ length: list.length }, (_, j) => {
    const part = need(list, j, list.object(j), "an object");
    const type = part.get("type");
    if (type === "text") return need(part, "text", part.string("text"), "a string");
    if (type === "image_url" || type === "input_image" || type === "image") {
      throw bad(part.path, `'${part.path}' is an image: k3 serve takes text only`, "unsupported_parameter");
    }
    throw bad(part.name("type"), `'${part.name("type")}' must be "text", got ${JSON.stringify(type ?? null)}`);
  });
  return { content: parts.join(""), parts };
}

const ROLES = ["system", "developer", "user", "assistant", "tool"];

function message(list: JsonFields, i: number): ChatMessage {
  const f = need(list, i, list.object(i), "an object");
  const role = need(f, "role", f.string("role"), "a string");
  if (role === "function") {
    throw bad(
      f.name("role"),
      `'${f.name("role")}' "function" (the deprecated function calling) is not supported: use tools and role "tool"`,
      "unsupported_parameter",
    );
  }
  if (!ROLES.includes(role)) {
    throw bad(f.name("role"), `'${f.name("role")}' must be one of ${ROLES.join(", ")}, got ${JSON.stringify(role)}`);
  }
  refuse(f, "function_call", "the deprecated function calling is not supported: use tool_calls");
  if (!f.has("content") && role !== "assistant") throw requestError(f.problemOf("content", "a string"));
  const msg: ChatMessage = {
    role: role === "developer" ? "system" : role as ChatMessage["role"],
    ...(f.has("content") ? messageContent(f) : { content: "" }),
  };
  const name = f.string("name");
  if (name !== undefined) msg.name = name;
  if (role === "tool") {
    msg.toolCallId = need(f, "tool_call_id", f.string("tool_call_id"), "a string, for a tool message");
  }
  if (role === "system" || role === "developer") {
    // A system message with tools declares them mid-conversation (the encoder's dynamic declaration).
    const tools = toolDecls(f);
    if (tools && tools.length > 0) msg.tools = tools;
  }
  if (role === "assistant") {
    const calls = historyCalls(f);
    if (calls.length > 0) msg.toolCalls = calls;
    // vLLM's name for the think channel; `reasoning` is what some clients send back (the
    // encoder takes `reasoning_content or reasoning`, so an empty one falls back).
    const reasoning = f.string("reasoning_content") || f.string("reasoning");
    if (reasoning !== undefined) msg.reasoning = reasoning;
  }
  return msg;
}

/** The tool calls of an assistant message in the history (OpenAI's shape). */
function historyCalls(m: JsonFields): HistoryToolCall[] {
  const list = m.array("tool_calls");
  if (!list) return [];
  return Array.from({ length: list.length }, (_, i) => {
    const f = need(list, i, list.object(i), "an object");
    f.oneOf("type", ["function"]);
    const fn = need(f, "function", f.object("function"), "an object");
    const name = need(fn, "name", fn.string("name"), "a string");
    const args = fn.get("arguments");
    // Arguments are JSON text in OpenAI's shape; an object as sent by some clients is
    // accepted and written as the encoder writes a dict's values (Python's json.dumps).
    const text = typeof args === "string" ? args : fn.has("arguments") ? pythonJson(args) : "{}";
    const id = f.string("id");
    return id === undefined ? { name, arguments: text } : { id, name, arguments: text };
  });
}

/** A function name as OpenAI allows one: letters, digits, `_` and `-`, at most 64. */
const TOOL_NAME = { pattern: /^[A-Za-z0-9_-]{1,64}$/, what: "1-64 letters, digits, _ or -" };

/** Validates an OpenAI `tools` array (a `k3 chat --tools` file holds one); throws
 * ApiError(400) naming the bad element. */
export function parseTools(tools: unknown): ToolDecl[] {
  return toolDecls(JsonFields.root({ tools }, REQUEST)!) ?? [];
}

/** `tools`: OpenAI function tools. */
function toolDecls(f: JsonFields): ToolDecl[] | undefined {
  const list = f.array("tools");
  if (!list) return undefined;
  const names = new Set<string>();
  return Array.from({ length: list.length }, (_, i) => {
    const t = need(list, i, list.object(i), "an object");
    if (t.get("type") !== "function") {
      const p = t.problemOf("type", '"function"');
      throw bad(p.field, requestError(p).message, "unsupported_parameter");
    }
    const fn = need(t, "function", t.object("function"), "an object");
    const name = need(fn, "name", fn.string("name", TOOL_NAME), TOOL_NAME.what);
    if (names.has(name)) {
      throw bad(fn.name("name"), `'${fn.name("name")}' ${JSON.stringify(name)} is declared twice`);
    }
    names.add(name);
    const decl: ToolDecl = { name };
    const description = fn.string("description");
    if (description !== undefined) decl.description = description;
    const params = fn.object("parameters");
    if (params) decl.parameters = params.value as Record<string, unknown>;
    const strict = fn.boolean("strict");
    if (strict !== undefined) decl.strict = strict;
    return decl;
  });
}

/** A tool a chat request offers, and the request field that declares it. */
export interface OfferedTool {
  /** The declaration. */
  tool: ToolDecl;
  /** Where: `tools[i]`, or `messages[j].tools[i]` for a system message's. */
  param: string;
}

/**
 * Every tool a chat request offers the reply: `tools`, then the tools of each system (or
 * developer) message, the encoder's dynamic declarations mid-conversation, which the model
 * may call from then on. A name declared again is its latest declaration.
 */
export function offeredTools(r: { tools?: readonly ToolDecl[]; messages: readonly ChatMessage[] }): OfferedTool[] {
  const byName = new Map<string, OfferedTool>();
  const offer = (list: readonly ToolDecl[] | undefined, where: string) =>
    list?.forEach((tool, i) => byName.set(tool.name, { tool, param: `${where}[${i}]` }));
  offer(r.tools, "tools");
  r.messages.forEach((m, j) => offer(m.tools, `messages[${j}].tools`));
  return [...byName.values()];
}

/** `tool_choice`, checked against the offered tools ({@link offeredTools}). */
function toolChoice(f: JsonFields, offered: OfferedTool[]): ToolChoice | undefined {
  const v = f.get("tool_choice");
  if (!f.has("tool_choice")) return undefined;
  let choice: ToolChoice;
  if (v === "none" || v === "auto" || v === "required") choice = v;
  else if (typeof v === "object" && !Array.isArray(v)) {
    const c = f.object("tool_choice")!;
    need(c, "type", c.oneOf("type", ["function"]), '"function"');
    const fn = need(c, "function", c.object("function"), "an object");
    const name = need(fn, "name", fn.string("name"), "a string");
    if (!offered.some((o) => o.tool.name === name)) {
      throw bad(
        "tool_choice",
        `'tool_choice' names the function ${
          JSON.stringify(name)
        }, which neither 'tools' nor a system message's 'tools' declares`,
      );
    }
    choice = { name };
  } else {
    throw requestError(f.problemOf("tool_choice", '"none", "auto", "required" or {"type": "function", ...}'));
  }
  // As OpenAI and vLLM answer: a tool_choice (even "none" or "auto") wants tools.
  if (offered.length === 0) {
    throw bad("tool_choice", `'tool_choice' is ${JSON.stringify(choice)} but 'tools' declares none`);
  }
  return choice;
}

/** Validates a `/v1/chat/completions` body; throws ApiError(400) naming the bad field. */
export function parseChatRequest(body: unknown): ChatRequest {
  const f = JsonFields.root(body, REQUEST)!;
  const list = need(f, "messages", f.array("messages"), "a non-empty array");
  if (list.length === 0) throw bad("messages", "'messages' must not be empty");
  const messages = Array.from({ length: list.length }, (_, i) => message(list, i));
  const declared = toolDecls(f);
  const tools = declared && declared.length > 0 ? declared : undefined;
  const choice = toolChoice(f, offeredTools({ tools, messages }));
  const parallelToolCalls = f.boolean("parallel_tool_calls");
  refuse(f, "functions", "the deprecated function calling is not supported: use tools", [[]]);
  refuse(f, "function_call", "the deprecated function calling is not supported: use tool_choice", ["none"]);
  const logprobs = f.boolean("logprobs");
  const topLogprobs = f.int("top_logprobs", 0, MAX_TOP_LOGPROBS);
  if (topLogprobs !== undefined && logprobs !== true) {
    throw bad("top_logprobs", "'top_logprobs' needs 'logprobs' to be true");
  }
  const { thinking, effort, maxReasoningTokens } = reasoningSwitches(f);
  const responseFormat = parseResponseFormat(f);
  return {
    kind: "chat",
    ...common(f),
    messages,
    thinking,
    ...(effort !== undefined ? { effort } : {}),
    ...(maxReasoningTokens !== undefined ? { maxReasoningTokens } : {}),
    ...(tools ? { tools } : {}),
    ...(choice !== undefined ? { toolChoice: choice } : {}),
    ...(parallelToolCalls !== undefined ? { parallelToolCalls } : {}),
    ...(logprobs ? { logprobs: true, topLogprobs: topLogprobs ?? 0 } : {}),
    ...(responseFormat ? { responseFormat } : {}),
  };
}

/**
 * OpenAI's `reasoning_effort` (and the Responses API's `reasoning.effort`) on K3's
 * switches: `none` and `minimal` turn thinking off; `low` is K3's low, `medium` and `high`
 * K3's high (the encoder has no medium; rounding toward K3's default `max` is the smaller
 * departure), `xhigh` and K3's own `max` are max.
 */
export const REASONING_EFFORTS: Readonly<Record<string, Effort | "off">> = Object.freeze({
  none: "off",
  minimal: "off",
  low: "low",
  medium: "high",
  high: "high",
  xhigh: "max",
  max: "max",
});

/**
 * Thinking, its effort and its budget: `chat_template_kwargs` (`thinking` or
 * `enable_thinking`, and K3's `thinking_effort`: low, high, max, or null for no effort
 * note) win over OpenAI's `reasoning_effort` ({@link REASONING_EFFORTS}), which wins over
 * `reasoning.effort` (the Responses API's place, and OpenRouter's in chat requests). No
 * effort: the encoder's default. The budget: `max_reasoning_tokens`, else
 * `reasoning.max_tokens` (OpenRouter's name).
 */
function reasoningSwitches(
  f: JsonFields,
): { thinking: boolean; effort?: Effort | null; maxReasoningTokens?: number } {
  const kw = f.object("chat_template_kwargs");
  // A `reasoning` that is no object is ignored, as unknown fields are (it was, before it was read).
  const r = f.get("reasoning");
  const nested = typeof r === "object" && r !== null && !Array.isArray(r) ? f.object("reasoning") : undefined;
  let thinking = kw?.boolean("thinking") ?? kw?.boolean("enable_thinking");
  let effort: Effort | null | undefined;
  const [where, field] = f.has("reasoning_effort") || !nested ? [f, "reasoning_effort"] : [nested, "effort"];
  const openai = where.string(field);
  if (openai !== undefined) {
    const mapped = REASONING_EFFORTS[openai];
    if (mapped === undefined) {
      const values = Object.keys(REASONING_EFFORTS).join(", ");
      const param = where.name(field);
      throw bad(param, `'${param}' must be one of ${values}, got ${JSON.stringify(openai)}`);
    }
    if (mapped === "off") thinking ??= false;
    else effort = mapped;
  }
  if (kw?.get("thinking_effort") === null) effort = null;
  const native = kw?.string("thinking_effort");
  if (native !== undefined) {
    if (!(EFFORTS as readonly string[]).includes(native)) {
      const param = kw!.name("thinking_effort");
      throw bad(param, `'${param}' must be one of ${EFFORTS.join(", ")}, got ${JSON.stringify(native)}`);
    }
    effort = native as Effort;
  }
  const maxReasoningTokens = f.int("max_reasoning_tokens", 0, Number.MAX_SAFE_INTEGER) ??
    nested?.int("max_tokens", 0, Number.MAX_SAFE_INTEGER);
  return {
    thinking: thinking ?? true,
    ...(effort !== undefined ? { effort } : {}),
    ...(maxReasoningTokens !== undefined ? { maxReasoningTokens } : {}),
  };
}

/** Wraps a schema the grammar cannot enforce as a 400 naming the keyword under `param`. */
export function schemaApiError(e: SchemaError, param: string): ApiError {
  const where = e.path === "" ? param : `${param}.${e.path}`;
  return bad(where, e.message.replace(/^(the schema|'[^']*'):/, `'${where}':`), "unsupported_parameter");
}

/** response_format: text (undefined), json_object, or json_schema with a schema of the subset. */
function parseResponseFormat(f: JsonFields): ResponseFormat | undefined {
  const rf = f.object("response_format");
  if (!rf) return undefined;
  const type = rf.get("type");
  if (!FORMAT_TYPES.some((t) => t === type)) {
    throw requestError(rf.problemOf("type", "text, json_object or json_schema"));
  }
  if (type === "text") return undefined;
  if (type === "json_object") return { type, value: ANY_OBJECT };
  if (type !== "json_schema") return undefined;
  const js = need(rf, "json_schema", rf.object("json_schema"), "an object, for type json_schema");
  const name = need(js, "name", js.string("name"), "a string");
  js.boolean("strict");
  try {
    // The note shows `schema`, else `json_schema`, else the object itself (the encoder's
    // extract_response_schema); the grammar enforces `schema`.
    const schema = js.get("schema") ?? js.get("json_schema") ?? js.value;
    return { type, name, value: compileSchema(js.get("schema") ?? {}), schema };
  } catch (e) {
    if (e instanceof SchemaError) throw schemaApiError(e, js.name("schema"));
    throw e;
  }
}

const FORMAT_TYPES = ["text", "json_object", "json_schema"];

/** Validates a `/v1/completions` body (prompt: text or ids below `vocab`). */
export function parseCompletionRequest(body: unknown, vocab: number): CompletionRequest {
  const f = JsonFields.root(body, REQUEST)!;
  const expected = "a string or an array of token ids";
  let raw = need(f, "prompt", f.has("prompt") ? f.get("prompt") : undefined, expected);
  // A list holding one prompt (text or ids) is that prompt; more would be a batch.
  if (Array.isArray(raw) && raw.length === 1 && (typeof raw[0] === "string" || Array.isArray(raw[0]))) raw = raw[0];
  if ((typeof raw === "string" || Array.isArray(raw)) && raw.length === 0) {
    throw bad("prompt", "'prompt' must not be empty");
  }
  if (Array.isArray(raw) && raw.every((x) => typeof x === "string" || Array.isArray(x))) {
    throw bad("prompt", `'prompt' holds ${raw.length} prompts: a batch line takes one`);
  }
  if (typeof raw !== "string" && !Array.isArray(raw)) throw requestError(f.problemOf("prompt", expected));
  const expectedId = `a token id in 0..${vocab - 1}`;
  (Array.isArray(raw) ? raw : []).forEach((got, i) => {
    if (!Number.isSafeInteger(got) || got < 0 || got >= vocab) {
      throw requestError({ field: `prompt[${i}]`, expected: expectedId, missing: false, got });
    }
  });
  refuse(f, "echo", "the prompt is not echoed", [false]);
  refuse(f, "suffix", "insertion is not supported", [""]);
  const bestOf = f.int("best_of", 1, 128);
  if (bestOf !== undefined && bestOf !== 1) throw bad("best_of", `'best_of' must be 1, got ${bestOf}`);
  // Completions' logprobs is the number of alternatives (0: the chosen token's only).
  const n = f.int("logprobs", 0, MAX_TOP_LOGPROBS);
  const prompt = raw as string | number[];
  return { kind: "completion", ...common(f), prompt, ...(n !== undefined ? { logprobs: true, topLogprobs: n } : {}) };
}
