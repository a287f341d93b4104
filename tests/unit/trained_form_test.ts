/**
 * Forced tool calls in the trained form: the grammar of `tool_choice` required / named
 * accepts exactly the calls the released encoder renders in a history (argument elements
 * with 1-based indexes, strings raw, other values as JSON with at most one space per gap),
 * one call for a named choice, and undeclared keys only where the schema allows them
 * (OpenAI's strict semantics by default).
 */

import assert from "node:assert/strict";
import { TINY } from "../helpers.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { accepts, DONE, type State } from "../../engine/generate/grammar/automaton.ts";
import { markupSyms, startState } from "../../engine/generate/grammar/forms.ts";
import { parseChatRequest } from "../../cli/openai.ts";
import { chatGrammar } from "../../cli/structured.ts";
import { chatSegments, segmentsText } from "../../engine/text/chat.ts";

const tok = Tokenizer.load(TINY);
const EOS = tok.specialId("[EOS]");

const WEATHER = {
  type: "function",
  function: {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string" },
        days: { type: "integer" },
        tags: { type: "array", items: { type: "integer" } },
        unit: { enum: ["c", "f"] },
      },
      required: ["city"],
    },
  },
};
const OPEN = { type: "function", function: { name: "open_tool", parameters: { type: "object" } } };

function start(choice: unknown, parallel = true): State {
  const r = parseChatRequest({
    messages: [{ role: "user", content: "x" }],
    tools: [WEATHER, OPEN],
    tool_choice: choice,
    parallel_tool_calls: parallel,
    chat_template_kwargs: { thinking: false },
  });
  return startState(chatGrammar(r)!, tok, [EOS]);
}

/** Whether the forced reply `calls` (the tools channel's calls) is accepted whole. */
function accepted(state: State, calls: string): boolean {
  const text = `<|close|>response<|sep|><|open|>tools<|sep|>${calls}<|close|>tools<|sep|><|close|>message<|sep|>[EOS]`;
  return accepts(state, markupSyms(tok, text)).some((s) => s === DONE);
}

const call = (name: string, index: number, args: string) =>
  `<|open|>call tool="${name}" index="${index}"<|sep|>${args}<|close|>call<|sep|>`;
const arg = (key: string, type: string, value: string) =>
  `<|open|>argument key="${key}" type="${type}"<|sep|>${value}<|close|>argument<|sep|>`;

Deno.test("trained form: the encoder's rendering of a call is what the grammar accepts", () => {
  const s = start("required");
  const args = arg("city", "string", 'Paris "16e" & <b>\nnew line') + arg("days", "number", "3") +
    arg("tags", "array", "[1, 2]") + arg("unit", "string", "c");
  assert.ok(accepted(s, call("get_weather", 1, args)));
  // The history renders the same call the same way: the model is asked for what it reads.
  const history = segmentsText(chatSegments([{
    role: "assistant",
    content: "",
    toolCalls: [{
      name: "get_weather",
      arguments: JSON.stringify({ city: 'Paris "16e" & <b>\nnew line', days: 3, tags: [1, 2], unit: "c" }).replace(
        "[1,2]",
        "[1, 2]",
      ),
    }],
  }], { thinking: false, effort: null, addGenerationPrompt: false }));
  assert.ok(history.includes(call("get_weather", 1, args)), history);
  // Keys in any order; optional ones may be left out; several calls numbered from 1.
  assert.ok(accepted(s, call("get_weather", 1, arg("unit", "string", "f") + arg("city", "string", "x"))));
  assert.ok(accepted(s, call("get_weather", 1, arg("city", "string", "a")) + call("open_tool", 2, "")));
});

Deno.test("trained form: the fallback json element, index 0 and out-of-order indexes are refused", () => {
  const s = start("required");
  assert.ok(!accepted(s, call("get_weather", 1, '<|open|>json type="object"<|sep|>{"city":"x"}<|close|>json<|sep|>')));
  assert.ok(!accepted(s, call("get_weather", 0, arg("city", "string", "x"))));
  assert.ok(!accepted(s, call("get_weather", 1, arg("city", "string", "x")) + call("open_tool", 3, "")));
  // A required key missing, a key twice, a wrong type attribute, an integer written as a fraction.
  assert.ok(!accepted(s, call("get_weather", 1, arg("days", "number", "3"))));
  assert.ok(!accepted(s, call("get_weather", 1, arg("city", "string", "x") + arg("city", "string", "y"))));
  assert.ok(!accepted(s, call("get_weather", 1, arg("city", "string", "x") + arg("days", "integer", "3"))));
  assert.ok(!accepted(s, call("get_weather", 1, arg("city", "string", "x") + arg("days", "number", "3.5"))));
  assert.ok(!accepted(s, call("get_weather", 1, arg("city", "string", "x") + arg("unit", "string", "k"))));
});

Deno.test("trained form: whitespace at most one space per gap, none before a value", () => {
  const s = start("required");
  const withTags = (tags: string) => call("get_weather", 1, arg("city", "string", "x") + arg("tags", "array", tags));
  assert.ok(accepted(s, withTags("[1,2]")));
  assert.ok(accepted(s, withTags("[1, 2]")));
  assert.ok(!accepted(s, withTags("[1,  2]")));
  assert.ok(!accepted(s, withTags("[1,\n2]")));
  assert.ok(!accepted(s, withTags(" [1, 2]")));
  assert.ok(!accepted(s, call("get_weather", 1, arg("city", "string", "x") + arg("days", "number", " 3"))));
});

Deno.test("trained form: a named choice is one call; undeclared keys only where the schema allows them", () => {
  const named = start({ type: "function", function: { name: "get_weather" } });
  const one = call("get_weather", 1, arg("city", "string", "x"));
  assert.ok(accepted(named, one));
  assert.ok(!accepted(named, one + call("get_weather", 2, arg("city", "string", "y"))));
  assert.ok(!accepted(named, call("open_tool", 1, "")));
  // "required" with parallel calls: one or more.
  assert.ok(accepted(start("required"), one + call("get_weather", 2, arg("city", "string", "y"))));
  assert.ok(!accepted(start("required", false), one + call("get_weather", 2, arg("city", "string", "y"))));
  // Declared properties, nothing said of additionalProperties: OpenAI's strict default.
  assert.ok(
    !accepted(start("required"), call("get_weather", 1, arg("city", "string", "x") + arg("extra", "number", "1"))),
  );
  // No properties declared: any keys, any types.
  const open = start({ type: "function", function: { name: "open_tool" } });
  assert.ok(accepted(open, call("open_tool", 1, arg("anything", "number", "1") + arg("s", "string", 'raw "text"'))));
  assert.ok(accepted(open, call("open_tool", 1, "")));
});
