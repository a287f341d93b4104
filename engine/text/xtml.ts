/**
 * Reading a generated assistant reply of Kimi K3's chat format (XTML) from its token ids,
 * as they are generated: the one parser serve, batch and chat use.
 *
 * Markup is recognised by token id, never by decoded text: an element opens with the
 * `<|open|>` id, its header (tag and attributes) is the ordinary tokens up to the
 * `<|sep|>` id, and `<|close|>` ... `<|sep|>` closes it. A reply whose text holds
 * `<|close|>response<|sep|>` or `[EOS]` as ordinary tokens keeps that text as text.
 *
 * The reply starts inside the channel the generation prompt opened (think or response),
 * inside the assistant message. Its turn ends where the released encoder ends it: at
 * `<|close|>message<|sep|>` closing that message (the serving stop; the encoder appends
 * `<|end_of_msg|>` itself when the turn goes into the history), or at `<|end_of_msg|>`
 * or `[EOS]`.
 *
 * The tools channel (`<|open|>tools<|sep|>` after the response channel) holds calls:
 * `<|open|>call tool="NAME" index="1"<|sep|>`, then its arguments, either as
 * `<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>` elements (a
 * string VALUE raw, any other type as JSON) or as one
 * `<|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>`, then
 * `<|close|>call<|sep|>`. Each call becomes an OpenAI tool call whose `arguments` is a
 * JSON object text, streamed as deltas whose concatenation is the whole: a string value
 * as it arrives, any other value once its element closes and it has parsed as JSON.
 *
 * A tools channel that does not follow that form (an unknown element, text between
 * elements, a value that is not JSON) is reported the way vLLM reports it: its markup
 * becomes response text, and the reply is not a tool call ({@link ReplyReader.malformed}).
 *
 * @module
 */

import type { StreamDecoder, Tokenizer } from "./tokenizer.ts";

/** What a reply produces, in order, as its tokens arrive. */
export type ReplyEvent =
  /** Channel text: think = reasoning, response = the reply's content. */
  | { type: "text"; channel: "think" | "response"; text: string }
  /** A tool call starts (`index`: 0-based, in the order of the calls). */
  | { type: "call"; index: number; id: string; name: string }
  /** More of tool call `index`'s arguments (JSON text). */
  | { type: "arguments"; index: number; text: string };

/** One parsed tool call, OpenAI's shape without its envelope. */
export interface ToolCall {
  /** The call's id (`call_...`), which the tool result names as `tool_call_id`. */
  id: string;
  /** The function called. */
  name: string;
  /** Its arguments, a JSON object as text. */
  arguments: string;
}

/** The ids of the chat format's control tokens. */
export interface MarkupIds {
  /** `<|open|>`. */
  open: number;
  /** `<|close|>`. */
  close: number;
  /** `<|sep|>`. */
  sep: number;
  /** `<|end_of_msg|>`. */
  endOfMsg: number;
  /** `[EOS]`. */
  eos: number;
}

/** The control token ids of `tok`; throws K3Error when it lacks one. */
export function markupIds(tok: Tokenizer): MarkupIds {
  return {
    open: tok.specialId("<|open|>"),
    close: tok.specialId("<|close|>"),
    sep: tok.specialId("<|sep|>"),
    endOfMsg: tok.specialId("<|end_of_msg|>"),
    eos: tok.specialId("[EOS]"),
  };
}

/** Which part of the reply a token was: channel text, markup, or part of a tool call. */
export type TokenPart = "think" | "response" | "markup" | "tools";

/** Options of a {@link ReplyReader}. */
export interface ReplyOptions {
  /** Whether the generation prompt opened the think channel (else the response channel). */
  thinking: boolean;
  /** Parse the tools channel into calls (false: tool_choice none or no tools; the channel is dropped). */
  tools: boolean;
  /** The id of the call at `index` (default: `call_` and 24 random hex digits). */
  callId?: (index: number) => string;
}

/** A header longer than this many bytes is not markup the model meant. */
const MAX_HEADER_BYTES = 1024;

function randomCallId(): string {
  const b = crypto.getRandomValues(new Uint8Array(12));
  return "call_" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** Attributes of a header `tag k="v" k2="v2"`, values unescaped (`&quot;`, `&amp;`). */
export function parseHeader(header: string): { tag: string; attrs: Map<string, string> } | undefined {
  const m = /^\s*([A-Za-z_][\w-]*)/.exec(header);
  if (!m) return undefined;
  const attrs = new Map<string, string>();
  let rest = header.slice(m[0].length);
  const re = /^\s+([A-Za-z_][\w-]*)="([^"]*)"/;
  for (let a = re.exec(rest); a; a = re.exec(rest)) {
    attrs.set(a[1], a[2].replaceAll("&quot;", '"').replaceAll("&amp;", "&"));
    rest = rest.slice(a[0].length);
  }
  if (rest.trim() !== "") return undefined;
  return { tag: m[1], attrs };
}

/** A call being read. */
interface OpenCall {
  index: number;
  id: string;
  name: string;
  arguments: string;
  /** Arguments written so far (argument elements), or "json" once a json element came. */
  args: number | "json";
}

/**
 * Reads a reply token by token (see the module doc). {@link push} returns the events a
 * token completes; {@link finish} what was held at the end. The fold of all events is
 * the whole reply: {@link reasoning}, {@link content}, {@link calls}.
 */
export class ReplyReader {
  readonly #tok: Tokenizer;
  readonly #ids: MarkupIds;
  readonly #opts: ReplyOptions;
  readonly #dec: StreamDecoder;
  /** Elements open now, outermost first. */
  readonly #stack: string[];
  #ended = false;
  #endedByMarker = false;
  /** The header being read: which marker opened it and its tokens. */
  #header: { kind: "open" | "close"; ids: number[]; bytes: number } | undefined;
  /** Ids of the tools channel so far (its raw text, should it turn out malformed). */
  #toolIds: number[] | undefined;
  /** The raw markup of a malformed tools channel goes to the response channel from here. */
  #raw = false;
  #malformed = false;
  #call: OpenCall | undefined;
  /** Type and buffered text of the argument or json element open now. */
  #value: { type: string; text: string } | undefined;
  readonly #calls: ToolCall[] = [];
  #callCount = 0;
  #part: TokenPart = "markup";
  #reasoning = "";
  #content = "";

  /** A reader of a reply generated after `chatPrompt`'s generation prompt. */
  constructor(tok: Tokenizer, opts: ReplyOptions) {
    this.#tok = tok;
    this.#ids = markupIds(tok);
    this.#opts = opts;
    this.#dec = tok.streamDecoder();
    this.#stack = ["message", opts.thinking ? "think" : "response"];
  }

  /** Whether the turn has ended (later tokens are ignored). */
  get ended(): boolean {
    return this.#ended;
  }

  /** What the reply left open, for `continuePrompt`: `ended` when it ended with
   * `<|end_of_msg|>` or `[EOS]` (nothing to add). */
  get left(): { open: readonly string[]; ended: boolean } {
    return { open: [...this.#stack], ended: this.#endedByMarker };
  }

  /** Which part of the reply the last pushed token was. */
  get lastPart(): TokenPart {
    return this.#part;
  }

  /** Think-channel text so far. */
  get reasoning(): string {
    return this.#reasoning;
  }

  /** Response-channel text so far (with a malformed tools channel's markup). */
  get content(): string {
    return this.#content;
  }

  /** Tool calls completed so far (none when the tools channel was malformed). */
  get calls(): readonly ToolCall[] {
    return this.#malformed ? [] : this.#calls;
  }

  /** Whether a tools channel did not follow the call form (its markup went to content). */
  get malformed(): boolean {
    return this.#malformed;
  }

  #text(out: ReplyEvent[], channel: "think" | "response", text: string): void {
    if (text === "") return;
    if (channel === "think") this.#reasoning += text;
    else this.#content += text;
    const last = out[out.length - 1];
    if (last?.type === "text" && last.channel === channel) last.text += text;
    else out.push({ type: "text", channel, text });
  }

  #args(out: ReplyEvent[], text: string): void {
    const call = this.#call!;
    call.arguments += text;
    const last = out[out.length - 1];
    if (last?.type === "arguments" && last.index === call.index) last.text += text;
    else out.push({ type: "arguments", index: call.index, text });
  }

  /** The channel text goes to: the innermost think or response element (response when none). */
  #channel(): "think" | "response" {
    for (let i = this.#stack.length - 1; i >= 0; i--) {
      const t = this.#stack[i];
      if (t === "think" || t === "response") return t;
    }
    return "response";
  }

  #inTools(): boolean {
    return this.#stack.includes("tools");
  }

  /** Feeds one generated token; returns the events it completes. */
  push(id: number): ReplyEvent[] {
    const out: ReplyEvent[] = [];
    if (this.#ended) return (this.#part = "markup", out);
    const ids = this.#ids;
    const tools = this.#inTools();
    if (id === ids.endOfMsg || id === ids.eos) {
      this.#flushText(out);
      if (this.#header) this.#headerAsText(out);
      if (this.#inTools() && !this.#raw) this.#fail(out, false);
      this.#ended = this.#endedByMarker = true;
      this.#stack.length = 0;
      this.#part = "markup";
      return out;
    }
    if (this.#toolIds && !this.#raw) this.#toolIds.push(id);
    if (id === ids.open || id === ids.close) {
      this.#flushText(out);
      if (this.#header) this.#headerAsText(out);
      this.#header = { kind: id === ids.open ? "open" : "close", ids: [id], bytes: 0 };
      this.#part = tools ? "tools" : "markup";
      return out;
    }
    if (this.#header) {
      this.#header.ids.push(id);
      this.#part = tools ? "tools" : "markup";
      if (id === ids.sep) {
        const h = this.#header;
        this.#header = undefined;
        this.#element(out, h.kind, h.ids);
      } else {
        this.#header.bytes += this.#tok.decodeBytes([id]).length;
        if (this.#header.bytes > MAX_HEADER_BYTES) this.#headerAsText(out);
      }
      return out;
    }
    if (id === ids.sep) {
      // A separator outside a header: no markup the format has.
      this.#part = tools ? "tools" : "markup";
      if (this.#raw) this.#text(out, "response", this.#tok.decode([id]));
      else if (tools) this.#fail(out, true);
      return out;
    }
    this.#data(out, this.#dec.push(id));
    return out;
  }

  /** Ordinary text at the current place. */
  #data(out: ReplyEvent[], text: string): void {
    if (this.#raw) {
      this.#part = "tools";
      return this.#text(out, "response", text);
    }
    if (!this.#inTools()) {
      const channel = this.#channel();
      this.#part = channel;
      return this.#text(out, channel, text);
    }
    this.#part = "tools";
    if (!this.#opts.tools) return; // a tools channel nobody asked for is dropped
    const top = this.#stack[this.#stack.length - 1];
    if ((top === "argument" || top === "json") && this.#value) {
      if (top === "argument" && this.#value.type === "string") this.#args(out, JSON.stringify(text).slice(1, -1));
      else this.#value.text += text;
      return;
    }
    if (text.trim() !== "") this.#fail(out, true);
  }

  #flushText(out: ReplyEvent[]): void {
    const text = this.#dec.flush();
    if (text !== "") this.#data(out, text);
  }

  /** A header that did not become markup: its tokens are text after all. */
  #headerAsText(out: ReplyEvent[]): void {
    const h = this.#header!;
    this.#header = undefined;
    const text = this.#tok.decode(h.ids);
    if (this.#inTools() && !this.#raw) return this.#fail(out, true);
    this.#data(out, text);
  }

  /** The tools channel is malformed: from here its markup is response text (`raw`), or
   * the reply ends here; the last `drop` ids of the channel are not part of it. */
  #fail(out: ReplyEvent[], raw: boolean, drop = 0): void {
    if (!this.#opts.tools) return;
    this.#malformed = true;
    this.#raw = raw;
    this.#dec.flush();
    const ids = this.#toolIds ?? [];
    const text = this.#tok.decode(ids.slice(0, ids.length - drop));
    this.#toolIds = undefined;
    this.#call = undefined;
    this.#value = undefined;
    this.#text(out, "response", text);
  }

  #element(out: ReplyEvent[], kind: "open" | "close", headerIds: number[]): void {
    const parsed = parseHeader(this.#tok.decode(headerIds.slice(1, -1)));
    const tools = this.#inTools() && this.#opts.tools;
    const endsTurn = kind === "close" && parsed?.tag === "message" && this.#stack.lastIndexOf("message") === 0;
    if (endsTurn) {
      // The turn boundary, wherever the reply is: a tools channel still open is malformed.
      if (tools && !this.#raw) this.#fail(out, false, headerIds.length);
      return this.#endTurn();
    }
    if (this.#raw) {
      // Malformed: the markup is text, but the tools channel still ends where it does.
      this.#text(out, "response", this.#tok.decode(headerIds));
      if (kind === "close" && parsed?.tag === "tools") {
        this.#raw = false;
        this.#stack.length = Math.max(0, this.#stack.lastIndexOf("tools"));
      }
      return;
    }
    if (!parsed) {
      if (tools) return this.#fail(out, true);
      return this.#data(out, this.#tok.decode(headerIds));
    }
    const { tag, attrs } = parsed;
    if (kind === "close") {
      if (tools && !this.#closeInTools(out, tag)) return this.#fail(out, true);
      const i = this.#stack.lastIndexOf(tag);
      if (i < 0) return;
      this.#stack.length = i;
      if (tag === "tools") this.#toolIds = undefined;
      return;
    }
    if (tools) {
      if (!this.#openInTools(out, tag, attrs)) return this.#fail(out, true);
    } else if (tag === "tools" && !this.#inTools()) {
      this.#toolIds = [...headerIds];
    }
    this.#stack.push(tag);
  }

  #endTurn(): void {
    this.#ended = true;
    this.#stack.length = 0;
  }

  /** An element opening inside the tools channel; false when the form does not allow it. */
  #openInTools(out: ReplyEvent[], tag: string, attrs: Map<string, string>): boolean {
    const top = this.#stack[this.#stack.length - 1];
    if (tag === "call" && top === "tools") {
      const name = attrs.get("tool");
      if (name === undefined || name === "") return false;
      const index = this.#callCount++;
      const id = (this.#opts.callId ?? randomCallId)(index);
      this.#call = { index, id, name, arguments: "", args: 0 };
      out.push({ type: "call", index, id, name });
      return true;
    }
    const call = this.#call;
    if (top !== "call" || !call) return false;
    if (tag === "argument") {
      const key = attrs.get("key");
      if (key === undefined || call.args === "json") return false;
      const type = attrs.get("type") ?? "string";
      if (!["string", "number", "integer", "boolean", "object", "array", "null"].includes(type)) return false;
      this.#args(out, (call.args === 0 ? "{" : ",") + JSON.stringify(key) + ":" + (type === "string" ? '"' : ""));
      call.args++;
      this.#value = { type, text: "" };
      return true;
    }
    if (tag === "json") {
      if (call.args !== 0) return false;
      call.args = "json";
      this.#value = { type: "json", text: "" };
      return true;
    }
    return false;
  }

  /** An element closing inside the tools channel; false when the form does not allow it. */
  #closeInTools(out: ReplyEvent[], tag: string): boolean {
    const top = this.#stack[this.#stack.length - 1];
    if (tag !== top) return false;
    const call = this.#call;
    if (tag === "argument" || tag === "json") {
      const v = this.#value!;
      this.#value = undefined;
      if (v.type === "string") return this.#args(out, '"'), true;
      const text = v.text.trim();
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch {
        return false;
      }
      if (!typeMatches(v.type, value)) return false;
      this.#args(out, text);
      return true;
    }
    if (tag === "call") {
      if (!call) return false;
      this.#args(out, call.args === 0 ? "{}" : call.args === "json" ? "" : "}");
      this.#calls.push({ id: call.id, name: call.name, arguments: call.arguments });
      this.#call = undefined;
      return true;
    }
    return tag === "tools";
  }

  /** Ends the reply (generation stopped): the text still held. A reply cut by the token
   * limit inside its tools channel keeps its complete calls and drops an unfinished one:
   * the channel's markup never becomes content (a call announced in a stream stays a
   * call, and the finish reason says the reply was cut). */
  finish(): ReplyEvent[] {
    const out: ReplyEvent[] = [];
    if (this.#ended) return out;
    if (this.#inTools() && this.#opts.tools && !this.#raw) {
      this.#header = undefined;
      this.#call = undefined;
      this.#value = undefined;
      this.#toolIds = undefined;
      return out;
    }
    this.#flushText(out);
    if (this.#header) this.#headerAsText(out);
    return out;
  }
}

/** Whether a parsed JSON value has the type an argument element names. */
function typeMatches(type: string, v: unknown): boolean {
  switch (type) {
    case "json":
    case "object":
      return typeof v === "object" && v !== null && !Array.isArray(v);
    case "number":
      return typeof v === "number";
    case "integer":
      return Number.isInteger(v);
    case "boolean":
      return typeof v === "boolean";
    case "array":
      return Array.isArray(v);
    case "null":
      return v === null;
  }
  return false;
}

/** A whole reply read at once: what a non-streamed answer holds. */
export interface Reply {
  /** Think-channel text. */
  reasoning: string;
  /** Response-channel text. */
  content: string;
  /** The tool calls (none when malformed). */
  calls: readonly ToolCall[];
  /** Whether the tools channel was malformed (kept as content). */
  malformed: boolean;
  /** Whether the turn ended (at `<|close|>message<|sep|>`, `<|end_of_msg|>` or `[EOS]`). */
  ended: boolean;
}

/** Reads a whole reply (the same reader, fed every id, then finished). */
export function readReply(tok: Tokenizer, ids: readonly number[], opts: ReplyOptions): Reply {
  const r = new ReplyReader(tok, opts);
  for (const id of ids) r.push(id);
  r.finish();
  return { reasoning: r.reasoning, content: r.content, calls: r.calls, malformed: r.malformed, ended: r.ended };
}
