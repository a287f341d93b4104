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
 * allowed name whose arguments follow that tool's parameters schema, then the end of the
 * message and an end id.
 *
 * @module
 */

import type { Tokenizer } from "../../text/tokenizer.ts";
import {
  Choice,
  End,
  type Frame,
  FreeText,
  type GNode,
  Lit,
  push,
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

/** HTML-escapes an attribute value, as the tools channel's markup quotes it. */
export function escapeAttribute(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);
}

/** The markup of a chat reply's channels and tool calls (the released chat format's XTML). */
export const TOOL_MARKUP = {
  closeThink: "<|close|>think<|sep|>",
  openResponse: "<|open|>response<|sep|>",
  closeResponse: "<|close|>response<|sep|>",
  openTools: "<|open|>tools<|sep|>",
  /** Opens call `index` of tool `name` and its JSON arguments. */
  openCall: (name: string, index: number) =>
    `<|open|>call tool="${escapeAttribute(name)}" index="${index}"<|sep|><|open|>json type="object"<|sep|>`,
  closeCall: "<|close|>json<|sep|><|close|>call<|sep|>",
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
  const lit = (text: string) => new Lit(markupSyms(tok, text));
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
  const calls = (index: number): Frame =>
    new Choice((below) => {
      const out: Stack[] = [];
      if (index > 0) out.push(tail!);
      if (index === 0 || (spec.parallel && index < MAX_CALLS)) {
        for (const t of spec.tools) {
          out.push(
            sequence(
              [lit(m.openCall(t.name, index)), new Value(t.args), new Ws(), lit(m.closeCall)],
              push(calls(index + 1), below),
            )!,
          );
        }
      }
      return out;
    });
  const frames: Frame[] = [];
  if (spec.reply === "think") {
    frames.push(new FreeText(close), lit(m.closeThink.slice("<|close|>".length)));
    // An empty response channel may stand between the reasoning and the calls.
    frames.push(new Choice((below) => [sequence([lit(m.openResponse + m.closeResponse)], below)!, below!]));
  } else frames.push(lit(m.closeResponse));
  frames.push(lit(m.openTools), calls(0));
  return [sequence(frames)!];
}
