/**
 * What a constrained reply looks like as a whole: a JSON value alone (`k3 run`), a JSON
 * value as a chat reply's response channel (`response_format`), or a chat reply forced into
 * the tools channel (`tool_choice` "required" or a named function). A {@link GrammarSpec}
 * says which, with no tokenizer; {@link startState} builds the automaton's first state for a
 * tokenizer's special ids.
 *
 * The tool-call markup lives here, in one place ({@link TOOL_MARKUP}); the tools channel's
 * parser reads the same elements. After the generation prompt the model is in the think
 * channel (or the response channel when thinking is off); the forced form lets reasoning
 * run freely to `<|close|>think<|sep|>`, allows an empty response channel, then requires
 * the tools channel with one call (or, when parallel calls are allowed, one or more) of an
 * allowed name, then the end of the message and an end id. Calls are in the form the model
 * was trained on, the one the released encoder renders a history's calls in: indexes from
 * 1, one argument element per argument ({@link CallArguments}).
 *
 * @module
 */

import type { Tokenizer } from "../../text/tokenizer.ts";
import { escapeAttribute } from "../../text/chat.ts";
import {
  Choice,
  DONE,
  End,
  type Frame,
  FreeText,
  type GNode,
  identity,
  Lit,
  push,
  RawStr,
  sequence,
  SPECIAL_BASE,
  type Stack,
  type State,
  Value,
  Ws,
} from "./automaton.ts";

/** The channel the generation prompt left open: the reply starts in it. */
export type ReplyChannel = "think" | "response";

/** A constrained reply, independent of the tokenizer. */
export type GrammarSpec =
  | {
    /** A JSON value of `value`. */
    kind: "value";
    /** The value's grammar (schema.ts). */
    value: GNode;
    /** A chat reply (the value is its response channel), or undefined: the value alone. */
    reply?: ReplyChannel;
  }
  | {
    /** A forced tool call. */
    kind: "tools";
    /** The tools a call may name, each with its arguments' grammar. */
    tools: readonly { name: string; args: GNode }[];
    /** More than one call allowed (OpenAI's parallel_tool_calls). */
    parallel: boolean;
    /** Where the reply starts. */
    reply: ReplyChannel;
  };

/** Calls in one forced tools channel at most, when parallel calls are allowed. */
export const MAX_CALLS = 64;

/** Characters of an undeclared argument key at most. */
export const MAX_FREE_KEY = 64;

/** The markup of a chat reply's channels and tool calls (the released chat format's XTML). */
export const TOOL_MARKUP = {
  closeThink: "<|close|>think<|sep|>",
  openResponse: "<|open|>response<|sep|>",
  closeResponse: "<|close|>response<|sep|>",
  openTools: "<|open|>tools<|sep|>",
  /** Opens call `index` (1-based in the message, as the encoder numbers calls) of tool `name`. */
  openCall: (name: string, index: number) => `<|open|>call tool="${escapeAttribute(name)}" index="${index}"<|sep|>`,
  /** Opens an argument element of `key` holding a value of `type`. */
  openArgument: (key: string, type: string) => `<|open|>argument key="${escapeAttribute(key)}" type="${type}"<|sep|>`,
  closeArgument: "<|close|>argument<|sep|>",
  closeCall: "<|close|>call<|sep|>",
  closeTools: "<|close|>tools<|sep|>",
  closeMessage: "<|close|>message<|sep|>",
} as const;

const SPECIALS = /<\|open\|>|<\|close\|>|<\|sep\|>|<\|end_of_msg\|>|\[EOS\]/g;
const utf8 = new TextEncoder();

/** The symbols of markup text: special tokens as one symbol each, the rest as bytes. */
export function markupSyms(tok: Tokenizer, text: string): number[] {
  const out: number[] = [];
  let at = 0;
  for (const m of text.matchAll(SPECIALS)) {
    out.push(...utf8.encode(text.slice(at, m.index)));
    out.push(SPECIAL_BASE + tok.specialId(m[0]));
    at = m.index + m[0].length;
  }
  out.push(...utf8.encode(text.slice(at)));
  return out;
}

/**
 * The automaton's first state for `spec`; `ends`: the ids that may end the reply (the
 * task's stop ids; at least one).
 */
export function startState(spec: GrammarSpec, tok: Tokenizer, ends: readonly number[]): State {
  if (ends.length === 0) throw new Error("structured output needs an end id to finish on");
  // One Lit per text, so equal states have equal frames (the state table merges them).
  const lits = new Map<string, Lit>();
  const lit = (text: string) => {
    let l = lits.get(text);
    if (l === undefined) lits.set(text, l = new Lit(markupSyms(tok, text)));
    return l;
  };
  const endSyms = ends.map((id) => SPECIAL_BASE + id);
  // A bare value may trail whitespace before its end id; a chat reply ends right after its markup.
  const end = new End(endSyms, 0, spec.kind === "value" && spec.reply === undefined);
  const close = SPECIAL_BASE + tok.specialId("<|close|>");
  const m = TOOL_MARKUP;
  if (spec.kind === "value") {
    if (spec.reply === undefined) return [sequence([new Value(spec.value), end])!];
    const frames: Frame[] = [];
    if (spec.reply === "think") {
      frames.push(new FreeText(close), lit(m.closeThink.slice("<|close|>".length) + m.openResponse));
    }
    frames.push(new Value(spec.value), new Ws(), lit(m.closeResponse + m.closeMessage), end);
    return [sequence(frames)!];
  }
  const tail = sequence([lit(m.closeTools + m.closeMessage), end]);
  const args = spec.tools.map((t) => new CallArguments(t.args, lit, close));
  const calls = (index: number): Frame =>
    new Choice((below) => {
      const out: Stack[] = [];
      if (index > 1) out.push(tail!);
      if (index === 1 || (spec.parallel && index <= MAX_CALLS)) {
        spec.tools.forEach((t, i) => {
          out.push(
            sequence(
              [lit(m.openCall(t.name, index)), args[i].frame(""), lit(m.closeCall)],
              push(calls(index + 1), below),
            )!,
          );
        });
      }
      return out;
    });
  const frames: Frame[] = [];
  if (spec.reply === "think") {
    frames.push(new FreeText(close), lit(m.closeThink.slice("<|close|>".length)));
    // An empty response channel may stand between the reasoning and the calls.
    frames.push(new Choice((below) => [sequence([lit(m.openResponse + m.closeResponse)], below)!, below!]));
  } else frames.push(lit(m.closeResponse));
  frames.push(lit(m.openTools), calls(1));
  return [sequence(frames)!];
}

/** One way a value of a schema is written in an argument element: its `type` attribute and
 * the frames of its text up to and including `<|close|>argument<|sep|>`. */
interface ArgumentForm {
  type: string;
  frames: () => Frame[];
}

/**
 * The argument elements of one tool's call, in the form the released encoder renders
 * calls: `<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>` per
 * argument, a string VALUE raw and any other as JSON (tight whitespace), T the JSON type
 * (`number` for integers too). Declared keys come in any order, each at most once, the
 * required ones all before the call closes; undeclared keys only when the parameters
 * schema allows them.
 */
class CallArguments {
  readonly #forms: ArgumentForm[][];
  readonly #free: ArgumentForm[];
  readonly #choices = new Map<string, Choice>();
  constructor(
    readonly node: GNode,
    readonly lit: (text: string) => Lit,
    readonly close: number,
  ) {
    const obj = resolved(node);
    this.#forms = obj?.k === "obj" ? obj.props.map((p) => this.forms(p.value)) : [];
    const additional = obj?.k === "obj" ? obj.additional : null;
    this.#free = additional === null ? [] : this.forms(additional);
  }

  /** The frame of the arguments still to come, `seen` marking ('1') the declared ones given. */
  frame(seen: string): Choice {
    let c = this.#choices.get(seen);
    if (c !== undefined) return c;
    const obj = resolved(this.node) as Extract<GNode, { k: "obj" }>;
    const m = TOOL_MARKUP;
    c = new Choice((below) => {
      const out: Stack[] = [];
      if (obj.props.every((p, i) => !p.required || seen[i] === "1")) out.push(below ?? DONE);
      obj.props.forEach((p, i) => {
        if (seen[i] === "1") return;
        const full = seen.padEnd(obj.props.length, "0");
        const next = push(this.frame(full.slice(0, i) + "1" + full.slice(i + 1)), below);
        for (const f of this.#forms[i]) {
          out.push(sequence([this.lit(m.openArgument(p.name, f.type)), ...f.frames()], next)!);
        }
      });
      if (this.#free.length > 0) {
        const next = push(this.frame(seen), below);
        const key = new FreeKey(this.#free.map((f) => this.lit(`" type="${f.type}"<|sep|>`)), this.#free, 0);
        out.push(sequence([this.lit('<|open|>argument key="'), key], next)!);
      }
      return out;
    });
    this.#choices.set(seen, c);
    return c;
  }

  /** The ways a value of `node` is written, by type. */
  forms(node: GNode): ArgumentForm[] {
    const n = resolved(node);
    if (n === undefined) return [];
    const closeArgument = () => this.lit(TOOL_MARKUP.closeArgument);
    const json = (type: string): ArgumentForm[] => [{
      type,
      // No whitespace before the value; one space at most in each gap inside it.
      frames: () => [new Value(tighten(n), 1), closeArgument()],
    }];
    switch (n.k) {
      case "alt":
        return n.of.flatMap((x) => this.forms(x));
      case "str":
        return [{
          type: "string",
          frames:
            () => [new RawStr(this.close, n.min, n.max), this.lit(TOOL_MARKUP.closeArgument.slice("<|close|>".length))],
        }];
      case "num":
        return json("number");
      case "obj":
        return json("object");
      case "arr":
        return json("array");
      case "ext": {
        // A bounded number is JSON; a patterned string is raw, its pattern walked as it is written.
        if (n.type === "number") return json("number");
        const rest = this.lit(TOOL_MARKUP.closeArgument.slice("<|close|>".length));
        return n.raw?.(this.close) ? [{ type: "string", frames: () => [n.raw!(this.close)!, rest] }] : [];
      }
      case "lit": {
        const v = JSON.parse(new TextDecoder().decode(Uint8Array.from(n.syms)));
        const text = typeof v === "string" ? v : String.fromCharCode(...n.syms);
        const type = v === null ? "null" : Array.isArray(v) ? "array" : typeof v === "object" ? "object" : typeof v;
        return [{ type, frames: () => [this.lit(text + TOOL_MARKUP.closeArgument)] }];
      }
      default:
        return [];
    }
  }
}

/** `node` with references followed (undefined: an unresolved one). */
function resolved(node: GNode): GNode | undefined {
  let n: GNode | null = node;
  for (let hops = 0; n !== null && n.k === "ref" && hops < 64; hops++) n = n.target;
  return n === null || n.k === "ref" ? undefined : n;
}

const tightened = new WeakMap<GNode, GNode>();

/** `node` and everything in it with tight whitespace (cycles of references kept). */
function tighten(node: GNode): GNode {
  const hit = tightened.get(node);
  if (hit !== undefined) return hit;
  switch (node.k) {
    case "ref": {
      const copy = { k: "ref" as const, target: null as GNode | null, name: node.name, tight: true };
      tightened.set(node, copy);
      copy.target = node.target === null ? null : tighten(node.target);
      return copy;
    }
    case "obj": {
      const copy = { k: "obj" as const, props: [] as GNode[] as never, additional: null as GNode | null, tight: true };
      tightened.set(node, copy);
      copy.props = node.props.map((p) => ({ ...p, value: tighten(p.value) })) as never;
      copy.additional = node.additional === null ? null : tighten(node.additional);
      return copy;
    }
    case "arr": {
      const copy = { ...node, tight: true };
      tightened.set(node, copy);
      copy.items = tighten(node.items);
      return copy;
    }
    case "alt": {
      const copy = { ...node, of: [] as GNode[], tight: true };
      tightened.set(node, copy);
      copy.of = node.of.map(tighten);
      return copy;
    }
    default: {
      const copy = { ...node, tight: true };
      tightened.set(node, copy);
      return copy;
    }
  }
}

/** Characters of an undeclared argument key: letters, digits, `_`, `-`, `.`, `$`. */
function isKeyChar(b: number): boolean {
  return (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || b === 0x5f ||
    b === 0x2d || b === 0x2e || b === 0x24;
}

/** An undeclared argument's key (1..{@link MAX_FREE_KEY} key characters), then its type
 * attribute and value in one of `forms` (`heads[i]`: the rest of the header of form i). */
class FreeKey implements Frame {
  constructor(readonly heads: readonly Lit[], readonly forms: readonly ArgumentForm[], readonly n: number) {}
  step(sym: number, below: Stack | null, out: Stack[]): void {
    if (isKeyChar(sym) && this.n < MAX_FREE_KEY) out.push(push(new FreeKey(this.heads, this.forms, this.n + 1), below));
    if (this.n === 0) return;
    this.heads.forEach((head, i) => head.step(sym, sequence(this.forms[i].frames(), below), out));
  }
  signature(): string {
    return `K${identity(this.forms)},${Math.min(this.n, 1)},${MAX_FREE_KEY - this.n}`;
  }
}
