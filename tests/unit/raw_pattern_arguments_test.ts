/**
 * A forced tool call's top-level string argument is written raw (the released encoder's
 * call form), so its `pattern` and `format` hold on the raw text: quotes and backslashes
 * are plain characters there, no JSON escape is read, and the argument element's
 * `<|close|>` ends the string. Inside JSON values (nested strings) they stay JSON.
 */

import assert from "node:assert/strict";
import { TINY } from "../helpers.ts";
import { taskTokens } from "../task_tokens.ts";
import { openModel } from "../../engine/open.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { readReply } from "../../engine/text/xtml.ts";
import { DONE } from "../../engine/generate/grammar/automaton.ts";
import { startState } from "../../engine/generate/grammar/forms.ts";
import { tokenSymbols } from "../../engine/generate/grammar/mask.ts";
import { parseChatRequest } from "../../cli/openai.ts";
import { openaiTask } from "../../cli/request.ts";
import { chatGrammar } from "../../cli/structured.ts";

const tok = Tokenizer.load(TINY);
const symbols = tokenSymbols(tok, 1024);
const END = tok.specialId("<|end_of_msg|>");

const PARAMS = {
  type: "object",
  properties: {
    code: { type: "string", pattern: "^[A-Z]{2}-\\d{3}$" },
    quoted: { type: "string", pattern: '^"[a-z\\\\]{1,4}"$' },
    day: { type: "string", format: "date" },
    inner: {
      type: "object",
      properties: { tag: { type: "string", pattern: "^[a-z]{1,3}$" } },
      required: ["tag"],
    },
  },
  required: ["code", "quoted", "day"],
};
const BODY = {
  messages: [{ role: "user", content: "Stamp it." }],
  tools: [{ type: "function", function: { name: "stamp", parameters: PARAMS } }],
  tool_choice: { type: "function", function: { name: "stamp" } },
};

/** The reply text of a call of stamp with these argument elements (thinking off). */
function callText(args: [string, string, string][]): string {
  const elements = args.map(([k, type, v]) =>
    `<|open|>argument key="${k}" type="${type}"<|sep|>${v}<|close|>argument<|sep|>`
  );
  return `<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="stamp" index="1"<|sep|>${
    elements.join("")
  }<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>`;
}

Deno.test("raw pattern arguments: the pattern and format hold on the raw text; JSON escapes are not read there", () => {
  const spec = chatGrammar(parseChatRequest({ ...BODY, chat_template_kwargs: { thinking: false } }))!;
  const start = startState(spec, tok, [END]);
  const accepts = (text: string) => {
    let s = start;
    for (const id of tok.encode(text, { allowSpecial: true })) {
      s = symbols.step(s, id);
      if (s.length === 0) return false;
    }
    return s.some((x) => x === DONE);
  };
  const good: [string, string, string][] = [
    ["code", "string", "AB-123"],
    ["quoted", "string", '"a\\b"'],
    ["day", "string", "2024-02-29"],
    ["inner", "object", '{"tag": "xy"}'],
  ];
  assert.ok(accepts(callText(good)));
  assert.ok(accepts(callText([good[2], good[0], good[1]])), "any order, optional ones left out");
  const swap = (i: number, v: string) => good.map((g, j): [string, string, string] => (j === i ? [g[0], g[1], v] : g));
  for (
    const [why, text] of [
      ["the pattern fails", callText(swap(0, "AB-12"))],
      ["JSON-quoted, as a JSON string would be", callText(swap(0, '"AB-123"'))],
      ["a JSON escape is two raw characters", callText(swap(1, '\\"a\\\\b\\"'))],
      ["no such date", callText(swap(2, "2023-02-29"))],
      ["a nested string stays JSON, its pattern too", callText(swap(3, '{"tag": "xyzw"}'))],
    ] as const
  ) assert.ok(!accepts(text), why);
});

Deno.test("raw pattern arguments: forced calls on the tiny model, thinking on with a budget, match their patterns", async () => {
  const opened = await openModel(TINY, { capacity: 1024, sequences: 1 });
  try {
    for (const sampling of [{ temperature: 0 }, { temperature: 1, seed: 4 }, { temperature: 1, seed: 8 }]) {
      const t = openaiTask(parseChatRequest({ ...BODY, max_tokens: 400, max_reasoning_tokens: 6, ...sampling }), {
        tokenizer: tok,
        seed: 0,
        capacity: 1024,
      });
      const tokens = await taskTokens(opened.model, tok, t);
      const reply = readReply(tok, tokens, { thinking: true, tools: true });
      const what = `${JSON.stringify(sampling)}: ${tok.decode(tokens)}`;
      assert.ok(reply.ended, what);
      const args = JSON.parse(reply.calls[0].arguments);
      assert.match(args.code, /^[A-Z]{2}-\d{3}$/, what);
      assert.match(args.quoted, /^"[a-z\\]{1,4}"$/, what);
      assert.match(args.day, /^\d{4}-\d{2}-\d{2}$/, what);
      assert.ok(!Number.isNaN(Date.parse(args.day)), what);
    }
  } finally {
    await opened.close();
  }
});
