/**
 * k3's chat prompt against Kimi K3's released encoder (`encoding_k3.py` with
 * `tokenization_kimi.py`): golden prompts from public material that reproduces the
 * released files, each case naming its source in tests/fixtures/encoder/goldens.json:
 * - lablup/mlxcel tests/fixtures/kimi_k3/xtml/*.json (commits a41a0944, 8a720af2,
 *   d64c73af), made by running the released tokenizer's apply_chat_template;
 * - ZiAn-Su/harness-viz tests/fixtures/template-preview/rendered/kimi-k3-*.txt (commit
 *   1a68f261), made by running encoding_k3.py of moonshotai/Kimi-K3 at
 *   f831ab66814297da540d832a5235f8e904f29d06;
 * - vllm-project/vllm tests/tokenizers_/test_kimi_k3.py (commit 2ec5134c).
 * The text is compared exactly. The goldens' ids are in the released vocabulary, which
 * the bundled tiny model does not have: the control ids (and so the structure) are
 * compared, and the segment-by-segment rule is checked on the tiny vocabulary (the ids
 * are the concatenation of the segments' own encodings, which differs from encoding the
 * text whole where a segment boundary cuts a BPE run).
 */

import assert from "node:assert/strict";
import { ROOT, TINY } from "../helpers.ts";
import { referenceChunks, Tokenizer } from "../../engine/text/tokenizer.ts";
import {
  argumentElements,
  type ChatMessage,
  chatPrompt,
  chatSegments,
  encodeSegments,
  segmentsText,
} from "../../engine/text/chat.ts";
import { renderChatBody } from "../../cli/chat_render.ts";
import { parseChatRequest } from "../../cli/openai.ts";
import { ApiError } from "../../cli/openai_error.ts";

const tok = Tokenizer.load(TINY);

interface Golden {
  name: string;
  source: string;
  request: Record<string, unknown>;
  text: string;
  ids?: number[];
}
const goldens: Golden[] = JSON.parse(await Deno.readTextFile(`${ROOT}/tests/fixtures/encoder/goldens.json`)).cases;

/** The released vocabulary's control ids. */
const RELEASED_CONTROL: Record<number, string> = {
  163586: "<|end_of_msg|>",
  163587: "<|open|>",
  163588: "<|close|>",
  163589: "<|sep|>",
};

for (const g of goldens) {
  Deno.test(`encoder parity: ${g.name} (${g.source.split(" ")[0]})`, () => {
    const rendered = renderChatBody(tok, g.request);
    assert.equal(rendered.text, g.text);
    assert.deepEqual(rendered.ids, encodeSegments(tok, rendered.segments));
    assert.equal(tok.decode(rendered.ids), g.text);
    if (g.ids) {
      const controls = (ids: number[], name: (id: number) => string | undefined) =>
        ids.map(name).filter((x) => x !== undefined);
      assert.deepEqual(
        controls(rendered.ids, (id) => tok.isAdded(id) ? tok.decode([id]) : undefined),
        controls(g.ids, (id) => RELEASED_CONTROL[id]),
      );
    }
  });
}

Deno.test("encoder parity: each segment is encoded on its own (attributes as four segments, content parts apart)", () => {
  const messages: ChatMessage[] = [
    { role: "user", content: "first part second part", parts: ["first part ", "second part"], name: "bob." },
  ];
  const segments = chatSegments(messages, { effort: null });
  const texts = segments.map((s) => s.text);
  const at = texts.indexOf(" name");
  assert.deepEqual(texts.slice(at, at + 4), [" name", '="', "bob.", '"']);
  assert.deepEqual(texts.slice(texts.indexOf("first part "), texts.indexOf("first part ") + 2), [
    "first part ",
    "second part",
  ]);
  const ids = chatPrompt(tok, messages, { effort: null });
  assert.deepEqual(ids, segments.flatMap((s) => tok.encode(s.text, { allowSpecial: s.control })));
  // On this vocabulary the boundaries change the ids: encoding the text whole differs.
  assert.notDeepEqual(ids, tok.encode(segmentsText(segments), { allowSpecial: true }));
});

Deno.test("encoder parity: the effort defaults to max in thinking mode, is ignored with thinking off", () => {
  const m: ChatMessage[] = [{ role: "user", content: "hi" }];
  const text = (o: Parameters<typeof chatSegments>[1]) => segmentsText(chatSegments(m, o));
  assert.match(text({}), /thinking_effort=max`\./);
  assert.match(text({ effort: "low" }), /thinking_effort=low`\./);
  assert.doesNotMatch(text({ effort: null }), /thinking-effort/);
  assert.doesNotMatch(text({ thinking: false, effort: "medium" }), /thinking-effort/);
  assert.throws(() => text({ effort: "medium" }), /thinking effort must be one of low, high, max/);
});

Deno.test("encoder parity: argument literals kept byte for byte, strings decoded", () => {
  assert.deepEqual(argumentElements('{"n":1e2, "t": [1,2 ,3], "o": {"b":1,"2":2}, "s": "a\\"b"} trailing'), [
    { key: "n", type: "number", text: "1e2" },
    { key: "t", type: "array", text: "[1,2 ,3]" },
    { key: "o", type: "object", text: '{"b":1,"2":2}' },
    { key: "s", type: "string", text: 'a"b' },
  ]);
  assert.deepEqual(argumentElements(""), []);
  assert.deepEqual(argumentElements(" {} "), []);
  for (const notObject of ["[1]", "1", "not json", '{"a":}', '{"a":1', "   "]) {
    assert.equal(argumentElements(notObject), undefined, notObject);
  }
});

Deno.test("encoder parity: tool results in call order only when every result matches; index is the ordinal", () => {
  const calls = [{ id: "a", name: "f", arguments: "{}" }, { id: "b", name: "g", arguments: "{}" }, {
    id: "c",
    name: "h",
    arguments: "{}",
  }];
  const text = (results: ChatMessage[]) =>
    segmentsText(
      chatSegments([{ role: "user", content: "x" }, { role: "assistant", content: "", toolCalls: calls }, ...results], {
        effort: null,
        addGenerationPrompt: false,
      }),
    ).split("<|end_of_msg|>").filter((s) => s.includes('role="tool"'));
  // All matched: sorted by call, the matched call's name wins over the client's.
  assert.deepEqual(
    text([
      { role: "tool", toolCallId: "c", content: "C", name: "wrong" },
      { role: "tool", toolCallId: "a", content: "A" },
    ]),
    [
      '<|open|>message role="tool" tool="f" index="1"<|sep|>A<|close|>message<|sep|>',
      '<|open|>message role="tool" tool="h" index="2"<|sep|>C<|close|>message<|sep|>',
    ],
  );
  // One unmatched: the run stays as written; names from the message, else the call at that place.
  assert.deepEqual(
    text([
      { role: "tool", toolCallId: "c", content: "C" },
      { role: "tool", toolCallId: "zz", content: "Z" },
    ]),
    [
      '<|open|>message role="tool" tool="f" index="1"<|sep|>C<|close|>message<|sep|>',
      '<|open|>message role="tool" tool="g" index="2"<|sep|>Z<|close|>message<|sep|>',
    ],
  );
});

Deno.test("encoder parity: dynamic tool declaration, assistant name, reasoning alias, whitespace reasoning", () => {
  const r = parseChatRequest({
    messages: [
      { role: "user", content: "x" },
      { role: "developer", content: "dropped", tools: [{ type: "function", function: { name: "late_tool" } }] },
      { role: "assistant", name: "k", content: "y", reasoning_content: "", reasoning: "alias" },
      { role: "assistant", content: "z", reasoning_content: "  " },
    ],
  });
  const text = segmentsText(chatSegments(r.messages, { effort: null, addGenerationPrompt: false }));
  assert.ok(text.includes(
    '<|open|>message role="system" type="tool-declare"<|sep|>## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n' +
      'You have access to all existing and extended tools.\nHere are the specs for the extended tools.\n\n```json\n[{"function":{"name":"late_tool"},"type":"function"}]\n```',
  ));
  assert.ok(!text.includes("dropped"));
  assert.ok(
    text.includes('<|open|>message role="assistant" name="k"<|sep|><|open|>think<|sep|>alias<|close|>think<|sep|>'),
  );
  assert.ok(text.includes("<|open|>think<|sep|>  <|close|>think<|sep|>"));
});

Deno.test("encoder parity: a named tool_choice renders no note", () => {
  const body = {
    messages: [{ role: "user", content: "x" }],
    tools: [{ type: "function", function: { name: "f" } }],
    tool_choice: { type: "function", function: { name: "f" } },
  };
  assert.doesNotMatch(renderChatBody(tok, body).text, /tool-choice/);
});

Deno.test("encoder parity: a run over 25,000 characters is cut before BPE as the released tokenizer cuts it", () => {
  // "x" + "ab" x 15000 is one run: the cut after 25,000 characters falls between an "a"
  // and its "b", which encoding the run whole would merge.
  const ab = tok.encode("ab")[0], a = tok.encode("a")[0], b = tok.encode("b")[0];
  assert.deepEqual(tok.encode("ab".repeat(3)), [ab, ab, ab]);
  const ids = tok.encode("x" + "ab".repeat(15000));
  assert.deepEqual(ids, [
    ...tok.encode("x"),
    ...Array(12499).fill(ab),
    a,
    b,
    ...Array(2500).fill(ab),
  ]);
  const lengths = (s: string) => referenceChunks(s).map((c) => Array.from(c).length);
  // Code points, as Python counts them; whitespace as Python's str.isspace (U+001C is).
  assert.deepEqual(lengths("😀".repeat(30000)), [25000, 5000]);
  assert.deepEqual(lengths("😀".repeat(20000)), [20000]);
  assert.deepEqual(lengths(" ".repeat(25001) + "b"), [25000, 2]);
  assert.deepEqual(lengths("\x1c".repeat(25001) + "b"), [25000, 2]);
});

Deno.test("encoder parity: reasoning_effort takes OpenAI's values", () => {
  const req = (extra: Record<string, unknown>) =>
    parseChatRequest({ messages: [{ role: "user", content: "x" }], ...extra });
  assert.equal(req({ reasoning_effort: "none" }).thinking, false);
  assert.equal(req({ reasoning_effort: "minimal" }).thinking, false);
  assert.equal(req({ reasoning_effort: "low" }).effort, "low");
  assert.equal(req({ reasoning_effort: "medium" }).effort, "high");
  assert.equal(req({ reasoning_effort: "high" }).effort, "high");
  assert.equal(req({ reasoning_effort: "max" }).effort, "max");
  assert.equal(req({}).effort, undefined);
  assert.equal(req({ chat_template_kwargs: { thinking_effort: null } }).effort, null);
  // K3's own switches win.
  const native = req({ reasoning_effort: "none", chat_template_kwargs: { thinking: true, thinking_effort: "low" } });
  assert.equal(native.thinking, true);
  assert.equal(native.effort, "low");
  assert.throws(() => req({ reasoning_effort: "huge" }), ApiError);
  assert.throws(() => req({ chat_template_kwargs: { thinking_effort: "medium" } }), ApiError);
});
