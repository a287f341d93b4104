/**
 * The reasoning budget on the tiny model: a thinking reply's think channel is closed with
 * forced markup after `max_reasoning_tokens` tokens (or --reasoning-budget), so a forced
 * call and a response format complete with thinking on; with a grammar and no budget,
 * half of max_tokens at most. The tokens are the same with speculation on and off.
 */

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { TINY } from "../helpers.ts";
import { openModel } from "../../engine/open.ts";
import { Scheduler } from "../../engine/generate/scheduler.ts";
import { makeSampler } from "../../engine/generate/sampling.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { readReply } from "../../engine/text/xtml.ts";
import { parseChatRequest } from "../../cli/openai.ts";
import { openaiTask, type Task } from "../../cli/request.ts";
import { taskFilter } from "../../cli/structured.ts";
import { chatBodyOfResponses } from "../../cli/server/responses.ts";
import { serveOptions } from "../../cli/serve/options.ts";
import { batchOptions } from "../../cli/batch/options.ts";
import { K3Error } from "../../engine/errors.ts";

const tok = Tokenizer.load(TINY);
const CLOSING = tok.encode("<|close|>think<|sep|><|open|>response<|sep|>", { allowSpecial: true });
const PARAMS = {
  type: "object",
  properties: { city: { type: "string", maxLength: 6 }, days: { type: "integer" } },
  required: ["city", "days"],
};
const TOOLS = [{ type: "function", function: { name: "get_weather", parameters: PARAMS } }];

function task(body: Record<string, unknown>, reasoningBudget?: number): Task {
  const r = parseChatRequest({ messages: [{ role: "user", content: "Weather in Paris, please." }], ...body });
  return openaiTask(r, { tokenizer: tok, seed: 0, capacity: 1024, reasoningBudget });
}

Deno.test("reasoning budget: the think channel closes on time; forced calls and formats complete with thinking on", async () => {
  const opened = await openModel(TINY, { capacity: 1024, sequences: 1 });
  try {
    const vocab = opened.model.cfg.vocabSize;
    const run = async (t: Task, draft: "off" | "suffix") => {
      const s = new Scheduler(opened.model, { draft: { mode: draft } });
      const r = await s.submit({
        prompt: t.promptIds,
        maxTokens: t.maxTokens,
        stopIds: t.stopIds,
        choose: makeSampler(t.sampling),
        grammar: taskFilter(t, tok, vocab, t.stopIds),
      });
      return r.tokens;
    };
    const cases: [string, Task, number][] = [
      ["plain, max_reasoning_tokens", task({ max_tokens: 24, max_reasoning_tokens: 5, temperature: 0 }), 5],
      ["plain, --reasoning-budget", task({ max_tokens: 24, temperature: 0 }, 3), 3],
      ["forced call", task({ max_tokens: 200, max_reasoning_tokens: 8, tools: TOOLS, tool_choice: "required" }), 8],
      [
        "named call, no budget: half of max_tokens",
        task({
          max_tokens: 400,
          temperature: 0,
          tools: TOOLS,
          tool_choice: { type: "function", function: { name: "get_weather" } },
        }),
        200,
      ],
      [
        "response format",
        task({
          max_tokens: 200,
          max_reasoning_tokens: 4,
          temperature: 0,
          response_format: {
            type: "json_schema",
            json_schema: { name: "w", schema: { ...PARAMS, additionalProperties: false } },
          },
        }),
        4,
      ],
    ];
    const ajv = new Ajv({ strict: false });
    for (const [name, t, budget] of cases) {
      assert.equal(t.reasoningBudget, budget, name);
      const tokens = await run(t, "off");
      assert.deepEqual(await run(t, "suffix"), tokens, `${name}: the same tokens with speculation`);
      // The random-weight model never closes its think channel by itself: the budget does.
      assert.deepEqual(tokens.slice(budget, budget + CLOSING.length), CLOSING, name);
      const reply = readReply(tok, tokens, { thinking: true, tools: t.chat!.tools });
      assert.equal(reply.reasoning, tok.decode(tokens.slice(0, budget)), name);
      if (t.grammar) {
        assert.ok(reply.ended, `${name}: the constrained reply completes within max_tokens`);
        const value = t.grammar.kind === "tools" ? JSON.parse(reply.calls[0].arguments) : JSON.parse(reply.content);
        assert.ok(ajv.validate(PARAMS, value), `${name}: ${JSON.stringify(value)}`);
      }
    }
    // No budget and no grammar: the reply reasons freely.
    assert.equal(task({ max_tokens: 24 }).reasoningBudget, undefined);
    assert.equal(task({ max_tokens: 24, chat_template_kwargs: { thinking: false } }, 3).reasoningBudget, undefined);
  } finally {
    await opened.close();
  }
});

Deno.test("reasoning switches: /v1/responses' reasoning.effort maps as chat's reasoning_effort does", () => {
  const chat = (effort: string) => parseChatRequest(chatBodyOfResponses({ input: "x", reasoning: { effort } }));
  assert.equal(chat("none").thinking, false);
  assert.equal(chat("minimal").thinking, false);
  assert.deepEqual([chat("low").thinking, chat("low").effort], [true, "low"]);
  assert.equal(chat("medium").effort, "high");
  assert.equal(chat("high").effort, "high");
});

Deno.test("reasoning budget: --reasoning-budget of k3 serve and k3 batch; a bad value is a usage error", () => {
  assert.equal(serveOptions(["tests/fixtures/tiny", "--reasoning-budget", "64"])!.reasoningBudget, 64);
  assert.equal(serveOptions(["tests/fixtures/tiny"])!.reasoningBudget, undefined);
  const batch = batchOptions([
    "tests/fixtures/tiny",
    "--input",
    "in.jsonl",
    "--output",
    "out.jsonl",
    "--reasoning-budget",
    "0",
  ]);
  assert.equal(batch!.reasoningBudget, 0);
  for (const bad of ["-1", "x", "1.5"]) {
    assert.throws(
      () => serveOptions(["tests/fixtures/tiny", "--reasoning-budget", bad]),
      (e) => e instanceof K3Error && e.exitCode === 2 && /--reasoning-budget/.test(e.message),
    );
  }
});
