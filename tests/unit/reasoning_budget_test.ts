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
import { chatOptions } from "../../cli/chat/options.ts";
import { K3Error } from "../../engine/errors.ts";
import { ApiError } from "../../cli/openai_error.ts";

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

Deno.test("reasoning budget: --reasoning-budget of k3 serve, k3 batch and k3 chat; a bad value is a usage error", () => {
  assert.equal(serveOptions(["tests/fixtures/tiny", "--reasoning-budget", "64"])!.reasoningBudget, 64);
  assert.equal(chatOptions(["tests/fixtures/tiny", "--reasoning-budget", "4"])!.reasoningBudget, 4);
  assert.equal(chatOptions(["tests/fixtures/tiny"])!.reasoningBudget, undefined);
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
    for (const options of [serveOptions, chatOptions]) {
      assert.throws(
        () => options(["tests/fixtures/tiny", "--reasoning-budget", bad]),
        (e) => e instanceof K3Error && e.exitCode === 2 && /--reasoning-budget/.test(e.message),
      );
    }
  }
});

Deno.test("reasoning budget: chat's max_reasoning_tokens or reasoning.max_tokens; /v1/responses takes both and chat_template_kwargs", () => {
  const chatBudget = (body: Record<string, unknown>) => task({ max_tokens: 64, ...body }).reasoningBudget;
  assert.equal(chatBudget({ reasoning: { max_tokens: 7 } }), 7);
  assert.equal(chatBudget({ max_reasoning_tokens: 5, reasoning: { max_tokens: 7 } }), 5, "the top-level field wins");
  assert.equal(chatBudget({ reasoning: { effort: "low", max_tokens: 0 } }), 0);
  assert.equal(
    task({ reasoning: { effort: "low" } }).promptIds.length,
    task({ reasoning_effort: "low" }).promptIds.length,
  );
  assert.equal(
    parseChatRequest({ messages: [{ role: "user", content: "x" }], reasoning: { effort: "none" } }).thinking,
    false,
  );
  // Another `reasoning` value in a chat request is ignored, as unknown fields are.
  assert.equal(chatBudget({ reasoning: "on" }), undefined);

  const responses = (body: Record<string, unknown>) => {
    const r = parseChatRequest(chatBodyOfResponses({ input: "Weather in Paris?", max_output_tokens: 64, ...body }));
    return openaiTask(r, { tokenizer: tok, seed: 0, capacity: 1024 });
  };
  assert.equal(responses({ max_reasoning_tokens: 9 }).reasoningBudget, 9);
  assert.equal(responses({ reasoning: { effort: "low", max_tokens: 6 } }).reasoningBudget, 6);
  const off = responses({ chat_template_kwargs: { thinking: false }, max_reasoning_tokens: 9 });
  assert.equal(off.chat!.thinking, false);
  assert.equal(off.reasoningBudget, undefined, "no think channel, no budget");

  for (
    const [body, param] of [
      [{ reasoning: { max_tokens: -1 } }, "reasoning.max_tokens"],
      [{ reasoning: { effort: "extreme" } }, "reasoning.effort"],
      [{ max_reasoning_tokens: 1.5 }, "max_reasoning_tokens"],
    ] as const
  ) {
    for (const parse of [(b: object) => chatBodyOfResponses({ input: "x", ...b }), (b: object) => b]) {
      assert.throws(
        () => parseChatRequest({ messages: [{ role: "user", content: "x" }], ...parse(body) }),
        (e) => e instanceof ApiError && e.status === 400 && e.param === param,
        JSON.stringify(body),
      );
    }
  }
});
