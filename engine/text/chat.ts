/**
 * Kimi K3's chat format (XTML): messages wrapped in `<|open|>tag attrs<|sep|>` ...
 * `<|close|>tag<|sep|>`, each ending with `<|end_of_msg|>`.
 *
 * Control text (the markup) is encoded with added tokens allowed; message text, tool
 * declarations, tool names and arguments are data and are encoded with them disabled, so
 * a user writing `<|close|>` gets plain bytes and cannot end their message early or forge
 * a system turn. Each span between two control tokens is encoded as one piece, as the
 * released encoder encodes it.
 *
 * The rendering follows the released encoder (`encoding_k3.py`) as public renderers that
 * reproduce it byte for byte show it: tool declarations as a leading system message of
 * type `tool-declare` (the tools array as compact JSON, keys sorted), the thinking-effort
 * and tool-choice instructions as system messages, assistant turns as think (in thinking
 * mode, even empty), response and tools channels, and tool results as messages of role
 * `tool` naming the tool and the 1-based index of its call, in the order of the calls
 * whatever order the results came in. A reply's turn ends at `<|close|>message<|sep|>`
 * (engine/text/xtml.ts); the history appends `<|end_of_msg|>`.
 *
 * Choices made here where the public material is silent (each also in the README's
 * "Tools and log probabilities"): no [BOS] unless asked; a named `tool_choice` gets the
 * `required` instruction (the constrained decoder picks the name); float arguments that
 * JSON text gives as `1.0` are rendered as JavaScript writes them (`1`).
 *
 * @module
 */

import { usageError } from "../errors.ts";
import type { Tokenizer } from "./tokenizer.ts";
import { markupIds, ReplyReader } from "./xtml.ts";

/** Who speaks a message. */
export type Role = "system" | "user" | "assistant" | "tool";

/** A tool call of an assistant message in the history. */
export interface HistoryToolCall {
  /** The call's id, which a tool result names as `toolCallId`. */
  id?: string;
  /** The function called. */
  name: string;
  /** Its arguments as JSON text (an object; anything else is rendered as a json element). */
  arguments: string;
}

/** One message of a conversation. */
export interface ChatMessage {
  /** Who speaks. */
  role: Role;
  /** The message text (for the assistant: its response channel; for a tool: its result). */
  content: string;
  /** Assistant reasoning, rendered in the think channel. */
  reasoning?: string;
  /** Assistant tool calls, rendered in the tools channel. */
  toolCalls?: HistoryToolCall[];
  /** A tool result: the id of the call it answers. */
  toolCallId?: string;
  /** A tool result: the tool's name (else the name of the call it answers). */
  name?: string;
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

/** Options of {@link chatPrompt}. */
export interface ChatOptions {
  /** Open the think channel for the reply (default), or go straight to the response. */
  thinking?: boolean;
  /** Thinking effort, sent as a leading system message (in thinking mode). */
  effort?: string;
  /** Start with [BOS] (default false). */
  bos?: boolean;
  /** Tools the model may call, declared in a leading system message. */
  tools?: readonly ToolDecl[];
  /** The request's tool_choice when it gave one (`none`, `required` and named add an instruction). */
  toolChoice?: ToolChoice;
}

/** Builds ids from control text (added tokens allowed) and data (not allowed). */
class Builder {
  readonly ids: number[] = [];
  readonly #open: number;
  readonly #close: number;
  readonly #sep: number;
  constructor(readonly tok: Tokenizer) {
    const m = markupIds(tok);
    this.#open = m.open, this.#close = m.close, this.#sep = m.sep;
  }
  control(text: string): this {
    return this.#append(this.tok.encode(text, { allowSpecial: true }));
  }
  data(text: string): this {
    return this.#append(this.tok.encode(text, { allowSpecial: false }));
  }
  /** One id at a time: spreading a long message's ids into push overflows the stack. */
  #append(ids: readonly number[]): this {
    for (const id of ids) this.ids.push(id);
    return this;
  }
  /** `<|open|>tag k="v"...<|sep|>`: the header is one data span (attribute values are the
   * client's), `&` and `"` escaped as the encoder escapes them. */
  open(tag: string, attrs: [string, string | number][] = []): this {
    const header = tag +
      attrs.map(([k, v]) => ` ${k}="${String(v).replaceAll("&", "&amp;").replaceAll('"', "&quot;")}"`)
        .join("");
    this.ids.push(this.#open);
    this.data(header);
    this.ids.push(this.#sep);
    return this;
  }
  close(tag: string): this {
    this.ids.push(this.#close);
    this.data(tag);
    this.ids.push(this.#sep);
    return this;
  }
  /** A whole message: open, body, close, `<|end_of_msg|>`. */
  message(attrs: [string, string | number][], body: string): this {
    return this.open("message", attrs).data(body).close("message").control("<|end_of_msg|>");
  }
}

/** Checks an effort level; throws usageError (exit 2) for anything else. */
function checkEffort(effort: string): void {
  if (!(EFFORTS as readonly string[]).includes(effort)) {
    throw usageError(`thinking effort must be one of ${EFFORTS.join(", ")}, not ${effort}`);
  }
}

/** A JSON value with object keys sorted, recursively (the encoder sorts the declarations). */
function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (typeof v === "object" && v !== null) {
    return Object.fromEntries(Object.keys(v).sort().map((k) => [k, sortKeys((v as Record<string, unknown>)[k])]));
  }
  return v;
}

/** JSON as Python's `json.dumps(v, ensure_ascii=False)` writes it: `, ` and `: ` separators. */
function pythonJson(v: unknown): string {
  if (Array.isArray(v)) return "[" + v.map(pythonJson).join(", ") + "]";
  if (typeof v === "object" && v !== null) {
    return "{" + Object.entries(v).map(([k, x]) => JSON.stringify(k) + ": " + pythonJson(x)).join(", ") + "}";
  }
  return JSON.stringify(v);
}

/** The `type` attribute of an argument value, as the encoder names it. */
function argumentType(v: unknown): string {
  if (typeof v === "boolean") return "boolean";
  if (v === null) return "null";
  if (typeof v === "number") return "number";
  if (typeof v === "string") return "string";
  return Array.isArray(v) ? "array" : "object";
}

/**
 * The one rendering of tool declarations and tool turns (so a detail found to differ
 * from the released encoder is corrected here):
 * - declarations: a system message `type="tool-declare"` whose body is `# Tools`, a line
 *   saying the tools are described in JSONSchema, and the OpenAI `tools` array (each
 *   `{"type": "function", "function": {...}}`) as compact JSON with sorted keys in a
 *   json code fence;
 * - an assistant call: `call tool="NAME" index="I"` (1-based per message), each
 *   argument of an object as `argument key="K" type="T"` (strings raw, other values as
 *   Python's json.dumps writes them), arguments that are not a JSON object as one
 *   `json type="object"` element holding the text as given;
 * - a tool result: `message role="tool" tool="NAME" index="I"`, I the index of the call
 *   it answers (by `tool_call_id`, else by position), results put in call order.
 */
const toolRendering = {
  declare(b: Builder, tools: readonly ToolDecl[]): void {
    const payload = tools.map((t) => ({ type: "function", function: t }));
    b.message(
      [["role", "system"], ["type", "tool-declare"]],
      "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" +
        JSON.stringify(sortKeys(payload)) + "\n```",
    );
  },
  calls(b: Builder, calls: readonly HistoryToolCall[]): void {
    b.open("tools");
    calls.forEach((c, i) => {
      b.open("call", [["tool", c.name], ["index", i + 1]]);
      let args: unknown;
      try {
        args = JSON.parse(c.arguments);
      } catch {
        args = undefined;
      }
      if (typeof args === "object" && args !== null && !Array.isArray(args)) {
        for (const [k, v] of Object.entries(args)) {
          b.open("argument", [["key", k], ["type", argumentType(v)]]);
          b.data(typeof v === "string" ? v : pythonJson(v)).close("argument");
        }
      } else {
        b.open("json", [["type", "object"]]).data(c.arguments).close("json");
      }
      b.close("call");
    });
    b.close("tools");
  },
  /** Renders a run of tool results answering `calls` (the previous assistant message's). */
  results(b: Builder, results: readonly ChatMessage[], calls: readonly HistoryToolCall[]): void {
    const placed = results.map((m, k) => {
      let i = m.toolCallId === undefined ? -1 : calls.findIndex((c) => c.id === m.toolCallId);
      if (i < 0 && k < calls.length && m.toolCallId === undefined) i = k;
      if (i < 0 && m.name === undefined) {
        throw usageError(
          `a tool message (tool_call_id ${JSON.stringify(m.toolCallId ?? null)}) answers no tool call of the ` +
            `assistant message before it`,
        );
      }
      return { m, i: i < 0 ? calls.length + k : i, name: m.name ?? calls[i].name };
    });
    placed.sort((a, b) => a.i - b.i);
    for (const { m, i, name } of placed) b.message([["role", "tool"], ["tool", name], ["index", i + 1]], m.content);
  },
};

const ROLES = ["system", "user", "assistant", "tool"];

function addMessage(b: Builder, m: ChatMessage, thinking: boolean): void {
  if (!ROLES.includes(m.role)) throw usageError(`unknown chat role ${JSON.stringify(m.role)}`);
  if (m.role !== "assistant") {
    const attrs: [string, string][] = [["role", m.role]];
    if (m.name !== undefined && m.role !== "tool") attrs.push(["name", m.name]);
    b.message(attrs, m.content);
    return;
  }
  b.open("message", [["role", "assistant"]]);
  if (thinking) {
    b.open("think");
    if (m.reasoning !== undefined && m.reasoning.trim() !== "") b.data(m.reasoning);
    b.close("think");
  }
  b.open("response").data(m.content).close("response");
  if (m.toolCalls && m.toolCalls.length > 0) toolRendering.calls(b, m.toolCalls);
  b.close("message").control("<|end_of_msg|>");
}

/** Renders messages in order, each run of tool results answering the assistant calls before it. */
function addMessages(b: Builder, messages: readonly ChatMessage[], thinking: boolean, before: HistoryToolCall[] = []) {
  let calls = before;
  for (let i = 0; i < messages.length;) {
    const m = messages[i];
    if (m.role === "tool") {
      let j = i;
      while (j < messages.length && messages[j].role === "tool") j++;
      toolRendering.results(b, messages.slice(i, j), calls);
      i = j;
      continue;
    }
    addMessage(b, m, thinking);
    if (m.role === "assistant") calls = m.toolCalls ?? [];
    i++;
  }
}

function addToolChoice(b: Builder, choice: ToolChoice | undefined): void {
  if (choice === undefined || choice === "auto") return;
  const must = choice === "none"
    ? "You MUST NOT call any tools in the next message."
    : "You MUST call tools in the next message.";
  b.message(
    [["role", "system"], ["type", "tool-choice"]],
    `The system is invoked with \`tool_choice=${choice === "none" ? "none" : "required"}\`.\n${must}`,
  );
}

function addGenerationPrompt(b: Builder, thinking: boolean): void {
  b.open("message", [["role", "assistant"]]);
  b.open(thinking ? "think" : "response");
}

/**
 * Ids of a chat prompt: tool declarations, the thinking effort, the messages, the
 * tool-choice instruction, then the generation prompt for the assistant's reply. Throws
 * usageError (exit 2) for an unknown role or effort, or a tool result that answers no call.
 */
export function chatPrompt(
  tok: Tokenizer,
  messages: readonly ChatMessage[],
  options: ChatOptions = {},
): number[] {
  const b = new Builder(tok);
  const thinking = options.thinking !== false;
  if (options.bos) b.control("[BOS]");
  if (options.tools && options.tools.length > 0) toolRendering.declare(b, options.tools);
  if (options.effort !== undefined) {
    checkEffort(options.effort);
    if (thinking) {
      b.message(
        [["role", "system"], ["type", "thinking-effort"]],
        "`thinking_effort` guides on how much to think in your thinking channel (not including the response " +
          "channel), supported values include `low`, `medium`, `high`, and `max`.\n" +
          `Now the system is invoked with \`thinking_effort=${options.effort}\`.`,
      );
    }
  }
  addMessages(b, messages, thinking);
  addToolChoice(b, options.toolChoice);
  addGenerationPrompt(b, thinking);
  return b.ids;
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
  const b = new Builder(tok);
  const open = left.ended ? [] : left.open;
  for (const tag of [...open].reverse()) {
    // A reply cut inside its think channel still gets its (empty) response channel, as
    // chatPrompt renders an assistant message.
    if (tag === "think") b.close("think").open("response").close("response");
    else b.close(tag);
  }
  if (!left.ended) b.control("<|end_of_msg|>");
  addMessages(b, messages, thinking, calls);
  addGenerationPrompt(b, thinking);
  return b.ids;
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
  const generationPrompt = chatPrompt(tok, [], { thinking }).length;
  const closing = continuePrompt(tok, reader.left, [], thinking);
  return closing.slice(0, closing.length - generationPrompt);
}
