/**
 * Kimi K3's chat format (XTML): messages wrapped in `<|open|>tag attrs<|sep|>` ...
 * `<|close|>tag<|sep|>`, each ending with `<|end_of_msg|>`, rendered as the released
 * encoder (`encoding_k3.py` with `tokenization_kimi.py`'s `apply_chat_template`) renders
 * them; docs/chat_format.md names the public sources each rule was checked against, and
 * tests/unit/encoder_parity_test.ts holds their golden prompts.
 *
 * The prompt is first a list of segments ({@link chatSegments}), each control text (the
 * four markers, encoded with added tokens allowed) or data (everything else, encoded with
 * them disabled, so a user writing `<|close|>` gets plain bytes and cannot forge a turn).
 * Each segment is BPE-encoded on its own, as the encoder does: an attribute is four
 * segments (` key`, `="`, the escaped value, `"`), and content sent as text parts is one
 * segment per part, so BPE never merges across those boundaries.
 *
 * Order of a prompt: the tool declaration, the thinking-effort note (thinking mode; the
 * effort defaults to `max`, as `apply_chat_template` sets it), the messages, the
 * tool-choice note (`required` and `none` only), the response-format note, and the
 * generation prompt (`add_generation_prompt`, default on). No [BOS] unless asked.
 *
 * @module
 */

import { usageError } from "../errors.ts";
import type { Tokenizer } from "./tokenizer.ts";
import { ReplyReader } from "./xtml.ts";
import { pythonNumber } from "./json_numbers.ts";

/** Who speaks a message. */
export type Role = "system" | "user" | "assistant" | "tool";

/** A tool call of an assistant message in the history. */
export interface HistoryToolCall {
  /** The call's id, which a tool result names as `toolCallId`. */
  id?: string;
  /** The function called. */
  name: string;
  /** Its arguments as JSON text (an object; empty: none; anything else is rendered as a json element). */
  arguments: string;
}

/** One message of a conversation. */
export interface ChatMessage {
  /** Who speaks. */
  role: Role;
  /** The message text (for the assistant: its response channel; for a tool: its result). */
  content: string;
  /** The content as the client sent it in text parts (their concatenation is `content`):
   * each part is its own segment, as the encoder tokenizes it. */
  parts?: readonly string[];
  /** Assistant reasoning, rendered in the think channel (an empty one renders nothing). */
  reasoning?: string;
  /** Assistant tool calls, rendered in the tools channel. */
  toolCalls?: HistoryToolCall[];
  /** A tool result: the id of the call it answers. */
  toolCallId?: string;
  /** The speaker's name (`name` attribute when non-empty); a tool result: the tool's name,
   * used when the result answers no call by id. */
  name?: string;
  /** A system message that declares tools mid-conversation (the encoder's dynamic
   * declaration, which replaces the message's content). */
  tools?: readonly ToolDecl[];
}

/** A function tool the model may call (OpenAI's `tools[].function`). */
export interface ToolDecl {
  /** The function's name. */
  name: string;
  /** What it does. */
  description?: string;
  /** Its parameters, a JSON Schema. */
  parameters?: object;
  /** OpenAI's strict flag (rendered as given). */
  strict?: boolean;
}

/** Which tools the reply may call: OpenAI's `tool_choice`. */
export type ToolChoice = "auto" | "none" | "required" | { name: string };

/** Thinking effort levels the released encoder accepts (it refuses "medium"). */
export const EFFORTS = ["low", "high", "max"] as const;
/** A thinking effort level. */
export type Effort = typeof EFFORTS[number];
/** The effort `apply_chat_template` sets when the caller gives none. */
export const DEFAULT_EFFORT: Effort = "max";

/** The response format a request asks for, as the response-format note names it. */
export type FormatNote = { type: "json_object" } | { type: "json_schema"; schema: unknown };

/** Options of {@link chatPrompt}. */
export interface ChatOptions {
  /** Open the think channel for the reply (default), or go straight to the response. */
  thinking?: boolean;
  /** Thinking effort, a leading system message in thinking mode: undefined = the
   * encoder's default (`max`), null = no note (the encoder's `thinking_effort=None`). */
  effort?: string | null;
  /** Start with [BOS] (default false). */
  bos?: boolean;
  /** Tools the model may call, declared in a leading system message. */
  tools?: readonly ToolDecl[];
  /** The request's tool_choice when it gave one (`none` and `required` add a note). */
  toolChoice?: ToolChoice;
  /** The request's response_format (json_object, json_schema) adds a note. */
  responseFormat?: FormatNote;
  /** End with the generation prompt of the assistant's reply (default true). */
  addGenerationPrompt?: boolean;
}

/** One piece of a rendered prompt, BPE-encoded on its own. */
export interface Segment {
  /** The text. */
  text: string;
  /** Control text (added tokens allowed) rather than data. */
  control: boolean;
}

/** Collects segments as the encoder's `_open_tag`, `_close_tag` and `_text` write them. */
class Segments {
  readonly list: Segment[] = [];
  control(text: string): this {
    this.list.push({ text, control: true });
    return this;
  }
  /** Data; an empty segment is dropped (the encoder's `_segment("")` is `[]`). */
  data(text: string): this {
    if (text !== "") this.list.push({ text, control: false });
    return this;
  }
  /** Content: one segment per text part when it came in parts. */
  content(m: { content: string; parts?: readonly string[] }): this {
    for (const part of m.parts ?? [m.content]) this.data(part);
    return this;
  }
  /** `<|open|>tag key="value"...<|sep|>`, each attribute as four segments, the value
   * escaped as the encoder escapes it (`&` and `"` only). */
  open(tag: string, attrs: [string, string | number][] = []): this {
    this.control("<|open|>").data(tag);
    for (const [k, v] of attrs) this.data(` ${k}`).data('="').data(escapeAttribute(String(v))).data('"');
    return this.control("<|sep|>");
  }
  close(tag: string): this {
    return this.control("<|close|>").data(tag).control("<|sep|>");
  }
  /** A whole message: open, body, close, `<|end_of_msg|>`. */
  message(attrs: [string, string | number][], body: { content: string; parts?: readonly string[] }): this {
    return this.open("message", attrs).content(body).close("message").control("<|end_of_msg|>");
  }
  /** The encoder's `_internal_system_message`: a system message of a type, body stripped. */
  note(type: string, body: string): this {
    return this.message([["role", "system"], ["type", type]], { content: body.trim() });
  }
}

/** An attribute value escaped as the encoder escapes it: `&` and `"`, nothing else. */
export function escapeAttribute(value: string): string {
  return value.replaceAll("&", "&amp;").replaceAll('"', "&quot;");
}

/** The ids of `segments`, each encoded on its own. */
export function encodeSegments(tok: Tokenizer, segments: readonly Segment[]): number[] {
  const ids: number[] = [];
  for (const s of segments) {
    // One id at a time: spreading a long message's ids into push overflows the stack.
    for (const id of tok.encode(s.text, { allowSpecial: s.control })) ids.push(id);
  }
  return ids;
}

/** The text of `segments` (what the encoder's `apply_chat_template(tokenize=False)` returns). */
export function segmentsText(segments: readonly Segment[]): string {
  return segments.map((s) => s.text).join("");
}

/** Checks an effort level; throws usageError (exit 2) for anything else. */
function checkEffort(effort: string): void {
  if (!(EFFORTS as readonly string[]).includes(effort)) {
    throw usageError(`thinking effort must be one of ${EFFORTS.join(", ")}, not ${effort}`);
  }
}

function byCodePoint(a: string, b: string): number {
  const x = [...a], y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0)! - y[i].codePointAt(0)!;
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

/** A JSON value with sorted keys, compact (the encoder's `_json_compact(deep_sort(v))`),
 * its numbers as Python writes them (json_numbers.ts). */
function compactSorted(v: unknown): string {
  return pyJson(v, ",", ":", true);
}

/** JSON as Python's `json.dumps(v, ensure_ascii=False)` writes it: `, ` and `: ` separators,
 * numbers as Python writes them. */
export function pythonJson(v: unknown): string {
  return pyJson(v, ", ", ": ", false);
}

/** Python's `json.dumps` of `v` with these separators, keys sorted by code point or not. */
function pyJson(v: unknown, comma: string, colon: string, sorted: boolean): string {
  const write = (x: unknown, holder: object, key: string): string => {
    if (typeof x === "number") return pythonNumber(holder, key, x);
    if (Array.isArray(x)) return "[" + x.map((y, i) => write(y, x, String(i))).join(comma) + "]";
    if (typeof x === "object" && x !== null) {
      const keys = sorted ? Object.keys(x).sort(byCodePoint) : Object.keys(x);
      const o = x as Record<string, unknown>;
      return "{" + keys.map((k) => JSON.stringify(k) + colon + write(o[k], o, k)).join(comma) + "}";
    }
    return JSON.stringify(x);
  };
  return write(v, {}, "");
}

/** The `type` attribute of an argument value, as the encoder names it (never `integer`). */
export function argumentType(v: unknown): "boolean" | "null" | "number" | "string" | "array" | "object" {
  if (typeof v === "boolean") return "boolean";
  if (v === null) return "null";
  if (typeof v === "number") return "number";
  if (typeof v === "string") return "string";
  return Array.isArray(v) ? "array" : "object";
}

/** One argument of a call as the encoder renders it. */
export interface ArgumentElement {
  /** The key. */
  key: string;
  /** Its `type` attribute. */
  type: ReturnType<typeof argumentType>;
  /** A string decoded; any other value as its literal text in the arguments, byte for byte. */
  text: string;
}

/** Whitespace JSON allows between tokens. */
const JSON_WS = /[ \t\n\r]*/y;

/**
 * A call's arguments as the encoder renders them: an object parsed one level deep into
 * its elements (strings decoded, other values as their literal text, so `1e2` stays
 * `1e2` and `[1, 2]` keeps its spacing; text after the closing brace ignored), [] for
 * empty arguments, undefined for anything else (rendered as one `json` element).
 */
export function argumentElements(text: string): ArgumentElement[] | undefined {
  if (text === "") return [];
  let at = 0;
  const ws = () => {
    JSON_WS.lastIndex = at;
    JSON_WS.test(text);
    at = JSON_WS.lastIndex;
  };
  const value = (): [unknown, number] | undefined => {
    const start = at;
    const end = jsonValueEnd(text, at);
    if (end === undefined) return undefined;
    at = end;
    return [JSON.parse(text.slice(start, end)), start];
  };
  ws();
  if (text[at] !== "{") return undefined;
  at++;
  ws();
  const out: ArgumentElement[] = [];
  if (text[at] === "}") return out;
  for (;;) {
    const key = value();
    if (key === undefined || typeof key[0] !== "string") return undefined;
    ws();
    if (text[at] !== ":") return undefined;
    at++;
    ws();
    const v = value();
    if (v === undefined) return undefined;
    out.push({ key: key[0], type: argumentType(v[0]), text: typeof v[0] === "string" ? v[0] : text.slice(v[1], at) });
    ws();
    const sep = text[at++];
    ws();
    if (sep === "}") return out;
    if (sep !== ",") return undefined;
  }
}

/** A JSON string, number or literal (strings hold no raw control characters, as Python's
 * strict json reads them). */
const JSON_SCALAR =
  // deno-lint-ignore no-control-regex
  /"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"|-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null/y;

/** Where the JSON value starting at `at` ends (undefined: none starts there). */
function jsonValueEnd(text: string, at: number): number | undefined {
  const scalar = JSON_SCALAR;
  scalar.lastIndex = at;
  if (scalar.test(text)) return scalar.lastIndex;
  const open = text[at];
  if (open !== "{" && open !== "[") return undefined;
  // A container: find its matching close bracket, then let JSON.parse judge it.
  let depth = 0;
  for (let i = at; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      scalar.lastIndex = i;
      if (!scalar.test(text)) return undefined;
      i = scalar.lastIndex - 1;
    } else if (c === "{" || c === "[") depth++;
    else if (c === "}" || c === "]") {
      if (--depth === 0) {
        try {
          JSON.parse(text.slice(at, i + 1));
          return i + 1;
        } catch {
          return undefined;
        }
      }
    }
  }
  return undefined;
}

/** The encoder's tool declaration: static (the request's tools) or dynamic (a system
 * message's tools, mid-conversation). */
function declareTools(s: Segments, tools: readonly ToolDecl[], dynamic: boolean): void {
  const json = compactSorted(tools.map((t) => ({ type: "function", function: t })));
  const body = dynamic
    ? "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n" +
      "You have access to all existing and extended tools.\nHere are the specs for the extended tools.\n\n"
    : "# Tools\nHere are the available tools, described in JSONSchema.\n\n";
  s.message([["role", "system"], ["type", "tool-declare"]], { content: body + "```json\n" + json + "\n```" });
}

/** An assistant turn's tools channel: `call tool="NAME" index="I"` (1-based per message)
 * holding its argument elements, or one `json type="object"` element for arguments that
 * are not a JSON object. */
function renderCalls(s: Segments, calls: readonly HistoryToolCall[]): void {
  s.open("tools");
  calls.forEach((c, i) => {
    s.open("call", [["tool", c.name], ["index", i + 1]]);
    const elements = argumentElements(c.arguments);
    if (elements === undefined) s.open("json", [["type", "object"]]).data(c.arguments).close("json");
    for (const e of elements ?? []) {
      s.open("argument", [["key", e.key], ["type", e.type]]).data(e.text).close("argument");
    }
    s.close("call");
  });
  s.close("tools");
}

/** Name and speaker attributes: `role`, and `name` when non-empty (the encoder's truthy test). */
function speaker(m: ChatMessage): [string, string][] {
  return m.name ? [["role", m.role], ["name", m.name]] : [["role", m.role]];
}

function renderAssistant(s: Segments, m: ChatMessage, thinking: boolean): void {
  s.open("message", speaker(m));
  if (thinking) s.open("think").data(m.reasoning ?? "").close("think");
  s.open("response").content(m).close("response");
  if (m.toolCalls && m.toolCalls.length > 0) renderCalls(s, m.toolCalls);
  s.close("message").control("<|end_of_msg|>");
}

const ROLES = ["system", "user", "assistant", "tool"];

/**
 * The encoder's `normalize_xtml_tool_result_messages`: each run of tool results is matched
 * by `tool_call_id` to the calls of the latest assistant message; when every result of the
 * run matches, the run is put in call order (stable) and each takes its call's name; when
 * any fails to match, the run stays as written.
 */
function orderResults(messages: readonly ChatMessage[], before: readonly HistoryToolCall[]): ChatMessage[] {
  const out: ChatMessage[] = [];
  let calls = before;
  for (let i = 0; i < messages.length;) {
    const m = messages[i];
    if (m.role !== "tool") {
      if (m.role === "assistant") calls = m.toolCalls ?? [];
      out.push(m);
      i++;
      continue;
    }
    let j = i;
    while (j < messages.length && messages[j].role === "tool") j++;
    const run = messages.slice(i, j).map((r, offset) => {
      const position = r.toolCallId === undefined ? -1 : calls.findIndex((c) => c.id === r.toolCallId);
      return { r, offset, position };
    });
    if (run.some((x) => x.position < 0)) out.push(...run.map((x) => x.r));
    else {
      run.sort((a, b) => a.position - b.position || a.offset - b.offset);
      for (const x of run) out.push({ ...x.r, name: calls[x.position].name });
    }
    i = j;
  }
  return out;
}

/** Renders messages in order: `before` are the calls a leading run of tool results answers
 * (the reply a continuation follows). */
function renderMessages(
  s: Segments,
  messages: readonly ChatMessage[],
  thinking: boolean,
  before: readonly HistoryToolCall[] = [],
): void {
  let calls: readonly HistoryToolCall[] | undefined = before.length > 0 ? before : undefined;
  // The result index counts results since the last assistant message (not reset by other
  // messages between them), as the encoder counts it.
  let resultIndex = 0;
  for (const m of orderResults(messages, before)) {
    if (!ROLES.includes(m.role)) throw usageError(`unknown chat role ${JSON.stringify(m.role)}`);
    if (m.role === "assistant") {
      calls = m.toolCalls;
      resultIndex = 0;
      renderAssistant(s, m, thinking);
    } else if (m.role === "tool") {
      resultIndex++;
      const name = m.name ?? calls?.[resultIndex - 1]?.name;
      if (name === undefined) {
        throw usageError(
          `a tool message (tool_call_id ${JSON.stringify(m.toolCallId ?? null)}) answers no tool call of the ` +
            `assistant message before it and has no name`,
        );
      }
      s.message([["role", "tool"], ["tool", name], ["index", resultIndex]], m);
    } else if (m.role === "system" && m.tools && m.tools.length > 0) declareTools(s, m.tools, true);
    else s.message(speaker(m), m);
  }
}

function renderToolChoice(s: Segments, choice: ToolChoice | undefined): void {
  if (choice === "required") {
    s.note(
      "tool-choice",
      "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
    );
  } else if (choice === "none") {
    s.note(
      "tool-choice",
      "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.",
    );
  }
}

function renderResponseFormat(s: Segments, format: FormatNote | undefined): void {
  if (format === undefined) return;
  const raw =
    "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";
  if (format.type === "json_object") {
    s.note("response-format", `The system is invoked with \`response_format=json_object\`.\n${raw}`);
  } else {
    s.note(
      "response-format",
      `The system is invoked with \`response_format=json_schema\`.\n${raw}\nThe JSON data must match the following schema:\n` +
        "```json\n" + compactSorted(format.schema ?? null) + "\n```",
    );
  }
}

function renderGenerationPrompt(s: Segments, thinking: boolean): void {
  s.open("message", [["role", "assistant"]]).open(thinking ? "think" : "response");
}

/** The effort note a prompt carries: none with thinking off (the encoder ignores the
 * effort then) or with `effort: null`; otherwise the given effort or the default. */
function effortOf(options: ChatOptions): string | undefined {
  if (options.thinking === false || options.effort === null) return undefined;
  const effort = options.effort ?? DEFAULT_EFFORT;
  checkEffort(effort);
  return effort;
}

/**
 * The segments of a chat prompt: tool declarations, the thinking-effort note, the
 * messages, the tool-choice and response-format notes, then the generation prompt.
 * Throws usageError (exit 2) for an unknown role or effort, or a tool result whose tool
 * cannot be named.
 */
export function chatSegments(messages: readonly ChatMessage[], options: ChatOptions = {}): Segment[] {
  return renderChat(messages, options).segments;
}

/** {@link chatSegments}, and which of them hold the messages (`start` up to `end`). */
function renderChat(
  messages: readonly ChatMessage[],
  options: ChatOptions,
): { segments: Segment[]; start: number; end: number } {
  const s = new Segments();
  const thinking = options.thinking !== false;
  if (options.bos) s.control("[BOS]");
  if (options.tools && options.tools.length > 0) declareTools(s, options.tools, false);
  const effort = effortOf(options);
  if (effort !== undefined) {
    s.note(
      "thinking-effort",
      "`thinking_effort` guides on how much to think in your thinking channel (not including the response " +
        "channel), supported values include `low`, `medium`, `high`, and `max`.\n" +
        `Now the system is invoked with \`thinking_effort=${effort}\`.`,
    );
  }
  const start = s.list.length;
  renderMessages(s, messages, thinking);
  const end = s.list.length;
  renderToolChoice(s, options.toolChoice);
  renderResponseFormat(s, options.responseFormat);
  if (options.addGenerationPrompt !== false) renderGenerationPrompt(s, thinking);
  return { segments: s.list, start, end };
}

/** Ids of a chat prompt ({@link chatSegments}, each segment encoded on its own). */
export function chatPrompt(tok: Tokenizer, messages: readonly ChatMessage[], options: ChatOptions = {}): number[] {
  return encodeSegments(tok, chatSegments(messages, options));
}

/** Where a prompt's messages lie in its ids. */
export interface MessageSpan {
  /** After the notes rendered before the messages (tool declaration, effort). */
  start: number;
  /** Before the notes rendered after them (tool choice, response format), which the next
   * step of a conversation renders after its new messages: a state kept here is a prefix
   * of that step. */
  end: number;
}

/** Ids of a chat prompt and where its messages lie. */
export function chatPromptParts(
  tok: Tokenizer,
  messages: readonly ChatMessage[],
  options: ChatOptions = {},
): { ids: number[]; messages: MessageSpan } {
  const { segments, start, end } = renderChat(messages, options);
  const ids = encodeSegments(tok, segments.slice(0, start));
  const span = { start: ids.length, end: 0 };
  for (const id of encodeSegments(tok, segments.slice(start, end))) ids.push(id);
  span.end = ids.length;
  for (const id of encodeSegments(tok, segments.slice(end))) ids.push(id);
  return { ids, messages: span };
}

/** Ids of the generation prompt alone: what follows a rendered history for the reply. */
export function generationPromptIds(tok: Tokenizer, thinking: boolean): number[] {
  const s = new Segments();
  renderGenerationPrompt(s, thinking);
  return encodeSegments(tok, s.list);
}

/**
 * Ids that continue a conversation whose tokens so far end with a generated reply: the
 * markup that closes what the reply left open (from `ReplyReader.left`; nothing but
 * `<|end_of_msg|>` after a reply that ended at `<|close|>message<|sep|>`, nothing at all
 * after `<|end_of_msg|>`), the new messages (tool results answer `calls`, the reply's
 * tool calls), and the generation prompt. Appending these to the kept state prefills only
 * the new turn.
 */
export function continuePrompt(
  tok: Tokenizer,
  left: { open: readonly string[]; ended: boolean },
  messages: readonly ChatMessage[],
  thinking: boolean,
  calls: HistoryToolCall[] = [],
): number[] {
  const s = new Segments();
  const open = left.ended ? [] : left.open;
  for (const tag of [...open].reverse()) {
    // A reply cut inside its think channel still gets its (empty) response channel, as
    // chatPrompt renders an assistant message.
    if (tag === "think") s.close("think").open("response").close("response");
    else s.close(tag);
  }
  if (!left.ended) s.control("<|end_of_msg|>");
  renderMessages(s, messages, thinking, calls);
  renderGenerationPrompt(s, thinking);
  return encodeSegments(tok, s.list);
}

/** Ids that end an assistant turn by themselves: `<|end_of_msg|>` and `[EOS]` (the turn
 * also ends at `<|close|>message<|sep|>`, which engine/text/xtml.ts reads). */
export function stopIds(tok: Tokenizer): number[] {
  return [tok.specialId("<|end_of_msg|>"), tok.specialId("[EOS]")];
}

/** The fields a history line may hold. */
const HISTORY_FIELDS = new Set(["role", "content", "reasoning", "tool_calls", "tool_call_id", "name"]);

/**
 * Parses a chat history: JSONL, one message per line (`role`, `content`, and `reasoning`
 * and `tool_calls` (`[{id, name, arguments}]`) for assistant turns only, `tool_call_id`
 * and `name` for tool results), blank lines ignored. Strict: anything else is a usage
 * error (exit 2) naming `what:LINE`.
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
    if (unknown !== undefined) {
      throw bad(`unknown field ${JSON.stringify(unknown)} (fields: ${[...HISTORY_FIELDS].join(", ")})`);
    }
    if (!(ROLES as unknown[]).includes(o.role)) {
      throw bad(`"role" must be "system", "user", "assistant" or "tool", got ${JSON.stringify(o.role)}`);
    }
    if (typeof o.content !== "string") throw bad(`"content" must be a string`);
    const m: ChatMessage = { role: o.role as Role, content: o.content };
    if (o.reasoning !== undefined) {
      if (o.role !== "assistant") throw bad(`"reasoning" is only for assistant messages`);
      if (typeof o.reasoning !== "string") throw bad(`"reasoning" must be a string`);
      m.reasoning = o.reasoning;
    }
    if (o.tool_calls !== undefined) {
      const calls = o.tool_calls;
      const ok = o.role === "assistant" && Array.isArray(calls) &&
        calls.every((c) =>
          typeof c?.name === "string" && typeof c?.arguments === "string" &&
          (c.id === undefined || typeof c.id === "string")
        );
      if (!ok) throw bad(`"tool_calls" (assistant only) must be [{"id", "name", "arguments"}] with strings`);
      m.toolCalls = (calls as HistoryToolCall[]).map((c) =>
        c.id === undefined
          ? { name: c.name, arguments: c.arguments }
          : { id: c.id, name: c.name, arguments: c.arguments }
      );
    }
    for (const [k, field] of [["tool_call_id", "toolCallId"], ["name", "name"]] as const) {
      if (o[k] === undefined) continue;
      if (o.role !== "tool" || typeof o[k] !== "string") throw bad(`"${k}" is a string, for tool messages only`);
      m[field] = o[k] as string;
    }
    out.push(m);
  });
  return out;
}

/** A history as JSONL, one message per line (what {@link parseHistory} reads). */
export function formatHistory(messages: readonly ChatMessage[]): string {
  return messages.map((m) => {
    const o: Record<string, unknown> = { role: m.role, content: m.content };
    if (m.reasoning !== undefined) o.reasoning = m.reasoning;
    if (m.toolCalls !== undefined) o.tool_calls = m.toolCalls;
    if (m.toolCallId !== undefined) o.tool_call_id = m.toolCallId;
    if (m.name !== undefined) o.name = m.name;
    return JSON.stringify(o) + "\n";
  }).join("");
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
 * The ids that close a generated assistant reply (its `tokens`, read on their control ids)
 * as the template renders it in the history: the channels and message it left open, then
 * `<|end_of_msg|>`; nothing when the reply ended with `<|end_of_msg|>` itself. Undefined
 * when the reply ended with [EOS] (which a rendered history never holds).
 */
export function replyCloser(tok: Tokenizer, tokens: readonly number[], thinking: boolean): number[] | undefined {
  if (tokens.at(-1) === tok.specialId("[EOS]")) return undefined;
  const reader = new ReplyReader(tok, { thinking, tools: true });
  for (const id of tokens) reader.push(id);
  reader.finish();
  const generationPrompt = generationPromptIds(tok, thinking).length;
  const closing = continuePrompt(tok, reader.left, [], thinking);
  return closing.slice(0, closing.length - generationPrompt);
}
