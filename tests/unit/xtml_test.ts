/**
 * The id-level reply reader (engine/text/xtml.ts) and the tool rendering of the chat
 * template, on the tiny tokenizer. Replies are scripted token ids built by hand from the
 * format's rule: control tokens by id, everything else as ordinary tokens.
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { chatPrompt } from "../../engine/text/chat.ts";
import { readReply, type ReplyEvent, ReplyReader, type ToolCall } from "../../engine/text/xtml.ts";
import { TINY } from "../helpers.ts";

const tok = Tokenizer.load(TINY);
const OPEN = tok.specialId("<|open|>"), CLOSE = tok.specialId("<|close|>"), SEP = tok.specialId("<|sep|>");
const EOM = tok.specialId("<|end_of_msg|>"), EOS = tok.specialId("[EOS]");
/** Ordinary tokens (never control ids, whatever the text looks like). */
const t = (s: string) => tok.encode(s, { allowSpecial: false });
/** `<|open|>header<|sep|>`, the header's tag and each attribute's four parts (` key`,
 * `="`, value, `"`) encoded apart, as the released encoder encodes them. */
const open = (header: string) => {
  const [tag] = header.split(" ", 1);
  const attrs = [...header.slice(tag.length).matchAll(/( [^=]+)="([^"]*)"/g)].flatMap((m) => [m[1], '="', m[2], '"']);
  return [OPEN, ...[tag, ...attrs].flatMap((s) => t(s)), SEP];
};
const close = (tag: string) => [CLOSE, ...t(tag), SEP];
const esc = (v: string) => v.replaceAll("&", "&amp;").replaceAll('"', "&quot;");
const ids = (n: number) => (i: number) => `call_${n}_${i}`;

/** A call in the format's argument form, by the rule. */
function callIds(name: string, index: number, args: Record<string, unknown>): number[] {
  const out = open(`call tool="${esc(name)}" index="${index}"`);
  for (const [k, v] of Object.entries(args)) {
    const type = typeof v === "string" ? "string" : v === null ? "null" : Array.isArray(v) ? "array" : typeof v;
    out.push(...open(`argument key="${esc(k)}" type="${type}"`));
    out.push(...t(typeof v === "string" ? v : JSON.stringify(v)), ...close("argument"));
  }
  return [...out, ...close("call")];
}

Deno.test("reader: channels split on control ids; markup-looking plain text stays text", () => {
  const tricky = "a <|close|>response<|sep|> b [EOS] c <|end_of_msg|> d <|close|>message<|sep|>";
  const reply = [
    ...t("think " + tricky),
    ...close("think"),
    ...open("response"),
    ...t("answer " + tricky),
    ...close("response"),
    ...close("message"),
    ...t("after the turn"),
  ];
  const r = readReply(tok, reply, { thinking: true, tools: false });
  assert.equal(r.reasoning, "think " + tricky);
  assert.equal(r.content, "answer " + tricky);
  assert.ok(r.ended, "the turn ends at <|close|>message<|sep|>");
  assert.deepEqual(r.calls, []);
  // Without thinking the reply starts in the response channel; [EOS] and <|end_of_msg|> end it.
  for (const end of [EOS, EOM]) {
    const x = readReply(tok, [...t("hi"), end, ...t("more")], { thinking: false, tools: false });
    assert.deepEqual([x.content, x.reasoning, x.ended], ["hi", "", true]);
  }
  // Token by token, the events fold to the same text.
  const reader = new ReplyReader(tok, { thinking: true, tools: false });
  let c = "", th = "";
  for (const id of reply) {
    for (const e of reader.push(id)) if (e.type === "text") e.channel === "think" ? (th += e.text) : (c += e.text);
  }
  assert.deepEqual([th, c], [r.reasoning, r.content]);
});

Deno.test("reader: a tools channel becomes OpenAI tool calls; parallel calls, escapes, json element", () => {
  const reply = [
    ...t("need tools"),
    ...close("think"),
    ...open("response"),
    ...t("Checking."),
    ...close("response"),
    ...open("tools"),
    ...callIds("get_weather", 1, { city: 'Zürich "old" & <|sep|>', days: 3, metric: true, tags: ["a"] }),
    ...open('call tool="search" index="2"'),
    ...open('json type="object"'),
    ...t('{"q": "café"}'),
    ...close("json"),
    ...close("call"),
    ...open('call tool="noargs" index="3"'),
    ...close("call"),
    ...close("tools"),
    ...close("message"),
  ];
  const r = readReply(tok, reply, { thinking: true, tools: true, callId: ids(0) });
  assert.equal(r.content, "Checking.");
  assert.equal(r.reasoning, "need tools");
  assert.equal(r.malformed, false);
  assert.deepEqual(r.calls, [
    {
      id: "call_0_0",
      name: "get_weather",
      arguments: JSON.stringify({ city: 'Zürich "old" & <|sep|>', days: 3, metric: true, tags: ["a"] }),
    },
    { id: "call_0_1", name: "search", arguments: '{"q": "café"}' },
    { id: "call_0_2", name: "noargs", arguments: "{}" },
  ]);
  // tool_choice none (or no tools): the channel is dropped, never content.
  const none = readReply(tok, reply, { thinking: true, tools: false });
  assert.deepEqual([none.content, none.calls.length], ["Checking.", 0]);
});

Deno.test("reader: a malformed tools channel is content and no call (as vLLM reports it)", () => {
  const bad = [
    [...open("tools"), ...open('call tool="f" index="1"'), ...open('argument key="n" type="number"'), ...t("12x")],
    [...open("tools"), ...t("stray text"), ...open('call tool="f" index="1"')],
    [...open("tools"), ...open('call index="1"')],
    [...open("tools"), ...open('call tool="f" index="1"'), ...open("weird")],
  ];
  for (const b of bad) {
    const reply = [...t("ok"), ...close("response"), ...b, ...close("call"), ...close("tools"), ...close("message")];
    const r = readReply(tok, reply, { thinking: false, tools: true });
    assert.equal(r.malformed, true);
    assert.deepEqual(r.calls, []);
    assert.ok(r.content.startsWith("ok<|open|>tools<|sep|>"), r.content);
    assert.ok(!r.content.includes("<|close|>message"), "the turn still ends at its boundary");
    assert.ok(r.ended);
  }
  // Cut by the token limit inside the tools channel: the complete calls stand, the
  // unfinished one is dropped, and no markup becomes content (inside a call, between
  // calls, inside a header).
  const first = [...open('call tool="f" index="1"'), ...open('argument key="a" type="string"'), ...t("x")];
  const done = [...first, ...close("argument"), ...close("call")];
  const cuts = [
    first,
    [...done, ...open('call tool="g" index="2"'), ...open('argument key="n" type="number"'), ...t("1")],
    [...done, OPEN, ...t('call tool="g"')],
    done,
  ];
  cuts.forEach((rest, i) => {
    const ids = [...close("response"), ...open("tools"), ...rest];
    const cut = readReply(tok, ids, { thinking: false, tools: true, callId: (k) => `c${k}` });
    assert.deepEqual(
      [cut.malformed, cut.content, cut.ended, cut.calls],
      [false, "", false, i === 0 ? [] : [{ id: "c0", name: "f", arguments: '{"a":"x"}' }]],
      `cut ${i}`,
    );
  });
});

/** Arbitrary JSON argument values: strings with escapes, markup and unicode. */
const value = fc.oneof(
  fc.string({ unit: "grapheme", maxLength: 12 }),
  fc.constantFrom("<|close|>argument<|sep|>", 'q"uo&te', "line\nbreak\t", "🐢 東京", ""),
  fc.integer({ min: -1000, max: 1000 }),
  fc.boolean(),
  fc.constant(null),
  fc.array(fc.integer({ min: 0, max: 9 }), { maxLength: 3 }),
  fc.dictionary(fc.string({ minLength: 1, maxLength: 3 }), fc.integer(), { maxKeys: 2 }),
);
const call = fc.record({
  name: fc.stringMatching(/^[a-z_][a-z0-9_]{0,8}$/),
  args: fc.dictionary(fc.string({ unit: "grapheme", minLength: 1, maxLength: 6 }), value, { maxKeys: 4 }),
});

Deno.test("reader: streamed in any chunking, the tool_calls deltas add up to the whole parse", () => {
  fc.assert(
    fc.property(fc.array(call, { minLength: 1, maxLength: 3 }), fc.array(fc.nat(6)), (calls, cuts) => {
      const reply = [
        ...t("x"),
        ...close("response"),
        ...open("tools"),
        ...calls.flatMap((c, i) => callIds(c.name, i + 1, c.args)),
        ...close("tools"),
        ...close("message"),
      ];
      const whole = readReply(tok, reply, { thinking: false, tools: true, callId: ids(1) });
      const want: ToolCall[] = calls.map((c, i) => ({
        id: `call_1_${i}`,
        name: c.name,
        arguments: JSON.stringify(c.args),
      }));
      assert.deepEqual(whole.calls.map((c) => ({ ...c, arguments: JSON.stringify(JSON.parse(c.arguments)) })), want);
      // Streamed: chunks of any size (the reader sees one id at a time; a chunk is a batch).
      const reader = new ReplyReader(tok, { thinking: false, tools: true, callId: ids(1) });
      const events: ReplyEvent[] = [];
      let at = 0;
      for (const n of [...cuts, reply.length]) {
        for (const id of reply.slice(at, at + n + 1)) events.push(...reader.push(id));
        at += n + 1;
        if (at >= reply.length) break;
      }
      events.push(...reader.finish());
      const built: { id: string; name: string; arguments: string }[] = [];
      for (const e of events) {
        if (e.type === "call") built[e.index] = { id: e.id, name: e.name, arguments: "" };
        else if (e.type === "arguments") built[e.index].arguments += e.text;
      }
      assert.deepEqual(built, whole.calls);
    }),
    { numRuns: 300 },
  );
});

Deno.test("template: tool declarations, calls and results render to the ids the rule gives", () => {
  const data = (s: string) => tok.encode(s, { allowSpecial: false });
  const msg = (header: string, body: string) => [...open(header), ...data(body), ...close("message"), EOM];
  const tools = [{ name: "get_weather", description: "Weather.", parameters: { type: "object", properties: {} } }];
  const got = chatPrompt(tok, [
    { role: "user", content: "Weather in <|close|>Paris?" },
    {
      role: "assistant",
      content: "",
      reasoning: "call it",
      toolCalls: [
        { id: "a", name: "get_weather", arguments: '{"city":"Paris","n":[1,2]}' },
        { id: "b", name: "get_weather", arguments: "not json" },
      ],
    },
    // Out of order: rendered in call order, each with its call's index.
    { role: "tool", toolCallId: "b", content: "second" },
    { role: "tool", toolCallId: "a", content: "first" },
  ], { tools, toolChoice: "required", effort: null });
  const want = [
    ...msg(
      'message role="system" type="tool-declare"',
      "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" +
        '[{"function":{"description":"Weather.","name":"get_weather","parameters":{"properties":{},"type":"object"}},' +
        '"type":"function"}]\n```',
    ),
    ...msg('message role="user"', "Weather in <|close|>Paris?"),
    ...open('message role="assistant"'),
    ...open("think"),
    ...data("call it"),
    ...close("think"),
    ...open("response"),
    ...close("response"),
    ...open("tools"),
    ...open('call tool="get_weather" index="1"'),
    ...open('argument key="city" type="string"'),
    ...data("Paris"),
    ...close("argument"),
    ...open('argument key="n" type="array"'),
    // The argument's literal text as the client sent it (the encoder keeps it byte for byte).
    ...data("[1,2]"),
    ...close("argument"),
    ...close("call"),
    ...open('call tool="get_weather" index="2"'),
    ...open('json type="object"'),
    ...data("not json"),
    ...close("json"),
    ...close("call"),
    ...close("tools"),
    ...close("message"),
    EOM,
    ...msg('message role="tool" tool="get_weather" index="1"', "first"),
    ...msg('message role="tool" tool="get_weather" index="2"', "second"),
    ...msg(
      'message role="system" type="tool-choice"',
      "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
    ),
    ...open('message role="assistant"'),
    ...open("think"),
  ];
  assert.deepEqual(got, want);
  // The user's "<|close|>" stayed ordinary bytes: the only control ids are the markup's.
  const controls = got.filter((id) => id === OPEN || id === CLOSE);
  assert.equal(controls.length, want.filter((id) => id === OPEN || id === CLOSE).length);
  // A result that answers no call is refused.
  assert.throws(
    () => chatPrompt(tok, [{ role: "tool", toolCallId: "zz", content: "x" }]),
    /answers no tool call/,
  );
});
