/**
 * tool_choice "required" and a named function on the tiny model: every finished reply is
 * a tools channel of allowed calls whose arguments validate (ajv), one call when
 * parallel_tool_calls is false, and the tokens are the same alone and 8 at a time.
 */

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { forcedCalls, TINY } from "../helpers.ts";
import { openModel } from "../../engine/open.ts";
import { Scheduler, type SequenceRequest } from "../../engine/generate/scheduler.ts";
import { makeSampler } from "../../engine/generate/sampling.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { chatPrompt, stopIds } from "../../engine/text/chat.ts";
import { TOOL_MARKUP } from "../../engine/generate/grammar/forms.ts";
import { parseChatRequest } from "../../cli/openai.ts";
import { chatGrammar, sequenceConstraint } from "../../cli/structured.ts";

const ajv = new Ajv({ strict: false });
const tok = Tokenizer.load(TINY);
const ends = stopIds(tok);

const TOOLS = [
  {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: { city: { type: "string", maxLength: 8 }, unit: { enum: ["c", "f"] } },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
  {
    name: "add",
    parameters: {
      type: "object",
      properties: { a: { type: "integer" }, b: { type: "integer" } },
      required: ["a", "b"],
      additionalProperties: false,
    },
  },
];

interface Case {
  choice: "required" | { name: string };
  parallel: boolean;
  temperature: number;
  seed: number;
}

const CASES: Case[] = [
  { choice: "required", parallel: true, temperature: 0, seed: 0 },
  { choice: "required", parallel: false, temperature: 0, seed: 0 },
  { choice: { name: "add" }, parallel: true, temperature: 0, seed: 0 },
  { choice: { name: "get_weather" }, parallel: false, temperature: 1, seed: 3 },
  { choice: "required", parallel: true, temperature: 1, seed: 11 },
  { choice: "required", parallel: false, temperature: 1, seed: 12 },
  { choice: { name: "add" }, parallel: false, temperature: 1, seed: 13 },
  { choice: { name: "get_weather" }, parallel: true, temperature: 0.7, seed: 14 },
];

function request(c: Case, i: number, vocab: number, out: number[][]): SequenceRequest {
  const r = {
    ...parseChatRequest({
      messages: [{ role: "user", content: `Call a tool, case ${i}.` }],
      chat_template_kwargs: { thinking: false },
    }),
    tools: TOOLS,
    toolChoice: c.choice,
    parallelToolCalls: c.parallel,
  };
  const spec = chatGrammar(r)!;
  return {
    prompt: chatPrompt(tok, r.messages, { thinking: false }),
    maxTokens: 400,
    stopIds: ends,
    choose: makeSampler({ temperature: c.temperature, topP: 0.95, topK: 0, minP: 0, seed: c.seed }),
    grammar: sequenceConstraint(spec, tok, vocab, ends),
    onToken: (t) => void out[i].push(t),
  };
}

Deno.test("tool_choice required / named: calls of allowed names with valid arguments, alone and 8 at a time", async () => {
  const opened = await openModel(TINY, { capacity: 512, sequences: 8 });
  try {
    const vocab = opened.model.cfg.vocabSize;
    const solo: number[][] = CASES.map(() => []);
    for (let i = 0; i < CASES.length; i++) await new Scheduler(opened.model).submit(request(CASES[i], i, vocab, solo));
    const together: number[][] = CASES.map(() => []);
    const s = new Scheduler(opened.model, { maxSequences: 8 });
    await Promise.all(CASES.map((c, i) => s.submit(request(c, i, vocab, together))));
    assert.deepEqual(together, solo);
    let finished = 0;
    CASES.forEach((c, i) => {
      const ids = solo[i];
      if (!ends.includes(ids[ids.length - 1])) return;
      finished++;
      const text = tok.decode(ids);
      assert.ok(text.startsWith(TOOL_MARKUP.closeResponse + TOOL_MARKUP.openTools), text);
      const calls = forcedCalls(text);
      // A named choice is exactly one call; "required" one or more (one without parallel calls).
      assert.ok(calls.length >= 1 && ((c.parallel && c.choice === "required") || calls.length === 1), text);
      calls.forEach((call, k) => {
        assert.equal(call.index, k + 1);
        const tool = TOOLS.find((t) => t.name === call.name);
        assert.ok(tool && (c.choice === "required" || c.choice.name === tool.name), call.name);
        assert.ok(ajv.validate(tool.parameters, call.args), `${JSON.stringify(call.args)}: ${ajv.errorsText()}`);
      });
      assert.match(text, /<\|close\|>tools<\|sep\|><\|close\|>message<\|sep\|>(<\|end_of_msg\|>|\[EOS\])$/);
    });
    assert.ok(finished >= 4, `only ${finished} of ${CASES.length} replies finished`);
  } finally {
    await opened.close();
  }
});
