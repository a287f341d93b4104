/**
 * The OpenAI wire format of `k3 serve` without a server: request validation (every bad
 * field a 400 naming it; fuzzed bodies only ever valid or an ApiError in OpenAI's shape).
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { parseChatRequest, parseCompletionRequest } from "../../cli/openai.ts";
import { ApiError, errorBody } from "../../cli/openai_error.ts";

const MSG = [{ role: "user", content: "hi" }];

function rejects(
  body: unknown,
  param: string | null,
  pattern: RegExp,
  parse: (b: unknown, vocab: number) => unknown = parseChatRequest,
): void {
  assert.throws(() => parse(body, 1024), (e: unknown) => {
    assert.ok(e instanceof ApiError, `ApiError for ${JSON.stringify(body)}, got ${e}`);
    assert.equal(e.status, 400, JSON.stringify(body));
    assert.equal(e.param, param, `param of ${JSON.stringify(body)}: ${e.message}`);
    assert.match(e.message, pattern);
    return true;
  });
}

Deno.test("chat request: defaults, field mapping, unknown fields ignored", () => {
  const r = parseChatRequest({ model: "m", messages: MSG, whatever: { x: 1 } });
  assert.equal(r.kind, "chat");
  assert.equal(r.model, "m");
  assert.equal(r.maxTokens, undefined);
  assert.deepEqual(r.sampling, {
    temperature: undefined,
    topP: undefined,
    topK: undefined,
    minP: undefined,
    seed: undefined,
  });
  assert.deepEqual(r.stop, []);
  assert.equal(r.stream, false);
  assert.equal(r.thinking, true);
  const s = parseChatRequest({
    messages: [
      { role: "developer", content: [{ type: "text", text: "be " }, { type: "text", text: "brief" }] },
      { role: "user", content: "q" },
      { role: "assistant", content: null, reasoning_content: "r" },
    ],
    max_tokens: 5,
    max_completion_tokens: 7,
    temperature: 0,
    top_p: 0.5,
    top_k: -1,
    min_p: 0.1,
    seed: 3,
    stop: "x",
    stream: true,
    stream_options: { include_usage: true },
    chat_template_kwargs: { thinking: false, thinking_effort: "low" },
    logprobs: false,
    n: 1,
  });
  assert.deepEqual(s.messages, [
    { role: "system", content: "be brief", parts: ["be ", "brief"] },
    { role: "user", content: "q" },
    { role: "assistant", content: "", reasoning: "r" },
  ]);
  assert.equal(s.maxTokens, 7);
  assert.equal(s.maxTokensParam, "max_completion_tokens");
  assert.deepEqual(s.sampling, { temperature: 0, topP: 0.5, topK: 0, minP: 0.1, seed: 3 });
  assert.deepEqual(s.stop, ["x"]);
  assert.equal(s.includeUsage, true);
  assert.equal(s.thinking, false);
  assert.equal(s.effort, "low");
});

Deno.test("chat request: each bad field is a 400 naming it", () => {
  rejects([], null, /JSON object/);
  rejects({}, "messages", /required/);
  rejects({ messages: [] }, "messages", /empty/);
  rejects({ messages: "hi" }, "messages", /array/);
  rejects({ messages: [1] }, "messages[0]", /object/);
  rejects({ messages: [{ content: "x" }] }, "messages[0].role", /required/);
  rejects({ messages: [{ role: "robot", content: "x" }] }, "messages[0].role", /one of/);
  rejects({ messages: [{ role: "tool", content: "x" }] }, "messages[0].tool_call_id", /required/);
  rejects({ messages: [{ role: "function", content: "x" }] }, "messages[0].role", /deprecated/);
  rejects({ messages: [{ role: "user" }] }, "messages[0].content", /required/);
  rejects({ messages: [{ role: "user", content: 5 }] }, "messages[0].content", /string or an array/);
  rejects(
    { messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] },
    "messages[0].content[0]",
    /image/,
  );
  rejects({ messages: [{ role: "user", content: [{ type: "text" }] }] }, "messages[0].content[0].text", /string/);
  assert.equal(parseChatRequest({ messages: MSG, n: 2, stream: true }).n, 2, "streamed choices are served");
  rejects({ messages: MSG, n: 129 }, "n", /1\.\.128/);
  assert.equal(parseChatRequest({ messages: MSG, n: 3 }).n, 3);
  rejects({ messages: MSG, n: 1.5 }, "n", /integer/);
  rejects({ messages: MSG, max_tokens: 0 }, "max_tokens", /integer >= 1,/);
  rejects({ messages: MSG, max_tokens: "5" }, "max_tokens", /integer/);
  rejects({ messages: MSG, max_completion_tokens: -1 }, "max_completion_tokens", /integer >= 1,/);
  rejects({ messages: MSG, temperature: 3 }, "temperature", /\[0, 2\]/);
  rejects({ messages: MSG, temperature: "hot" }, "temperature", /number/);
  rejects({ messages: MSG, top_p: 0 }, "top_p", /\(0, 1\]/);
  rejects({ messages: MSG, min_p: 1 }, "min_p", /must be a number in \[0, 0\.9/);
  rejects({ messages: MSG, seed: -1 }, "seed", /integer >= 0,/);
  rejects({ messages: MSG, top_k: 0.5 }, "top_k", /integer/);
  rejects({ messages: MSG, seed: 1e300 }, "seed", /integer/);
  rejects({ messages: MSG, stop: 5 }, "stop", /string or an array/);
  rejects({ messages: MSG, stop: ["a", 1] }, "stop[1]", /string/);
  rejects({ messages: MSG, stop: [""] }, "stop[0]", /empty/);
  rejects({ messages: MSG, stop: Array(17).fill("a") }, "stop", /at most 16/);
  rejects({ messages: MSG, stream: "yes" }, "stream", /boolean/);
  rejects({ messages: MSG, stream_options: { include_usage: true } }, "stream_options", /only allowed when/);
  rejects(
    { messages: MSG, stream: true, stream_options: { include_usage: 1 } },
    "stream_options.include_usage",
    /boolean/,
  );
  rejects({ messages: MSG, tools: [{ type: "function" }] }, "tools[0].function", /required/);
  rejects(
    { messages: MSG, tools: [{ type: "function", function: { name: "a b" } }] },
    "tools[0].function.name",
    /letters/,
  );
  rejects({ messages: MSG, tool_choice: "required" }, "tool_choice", /declares none/);
  rejects({ messages: MSG, tool_choice: "sometimes" }, "tool_choice", /must be/);
  rejects({ messages: MSG, logprobs: "yes" }, "logprobs", /boolean/);
  rejects({ messages: MSG, top_logprobs: 3 }, "top_logprobs", /needs 'logprobs'/);
  rejects({ messages: MSG, logprobs: true, top_logprobs: 21 }, "top_logprobs", /integer in 0\.\.20,/);
  rejects({ messages: MSG, presence_penalty: 2.5 }, "presence_penalty", /-2, 2/);
  rejects({ messages: MSG, tool_choice: "auto" }, "tool_choice", /declares none/);
  rejects({ messages: MSG, response_format: { type: "json_schema" } }, "response_format.json_schema", /required/);
  rejects({ messages: MSG, chat_template_kwargs: { thinking: "on" } }, "chat_template_kwargs.thinking", /boolean/);
  rejects(
    { messages: MSG, chat_template_kwargs: { thinking_effort: "medium" } },
    "chat_template_kwargs.thinking_effort",
    /one of low, high, max/,
  );
  rejects({ messages: MSG, model: 3 }, "model", /string/);
});

Deno.test("completion request: text or ids, one prompt only, legacy fields refused", () => {
  const parse = parseCompletionRequest;
  assert.equal(parse({ prompt: "hi" }, 1024).prompt, "hi");
  assert.deepEqual(parse({ prompt: [1, 2, 3] }, 1024).prompt, [1, 2, 3]);
  assert.deepEqual(parse({ prompt: [[4, 5]] }, 1024).prompt, [4, 5]);
  assert.equal(parse({ prompt: ["one"] }, 1024).prompt, "one");
  rejects({}, "prompt", /required/, parse);
  rejects({ prompt: "" }, "prompt", /empty/, parse);
  rejects({ prompt: [] }, "prompt", /empty/, parse);
  rejects({ prompt: ["a", "b"] }, "prompt", /2 prompts/, parse);
  rejects({ prompt: [1, 1024] }, "prompt[1]", /token id in 0\.\.1023,/, parse);
  rejects({ prompt: [1, -1] }, "prompt[1]", /token id/, parse);
  rejects({ prompt: [1, "2"] }, "prompt[1]", /token id/, parse);
  rejects({ prompt: 7 }, "prompt", /string or an array/, parse);
  rejects({ prompt: "x", echo: true }, "echo", /not supported/, parse);
  rejects({ prompt: "x", best_of: 2 }, "best_of", /must be 1/, parse);
  rejects({ prompt: "x", logprobs: 21 }, "logprobs", /integer in 0\.\.20,/, parse);
  assert.equal(parse({ prompt: "x", logprobs: 2 }, 1024).topLogprobs, 2);
  assert.equal(parse({ prompt: "x", n: 3, stream: true }, 1024).n, 3, "streamed choices are served");
});

Deno.test("fuzz: any JSON body is either a valid request or a 400 ApiError in OpenAI's shape", () => {
  const field = fc.constantFrom(
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "chat_template_kwargs",
    "n",
    "tools",
    "logprobs",
    "echo",
  );
  const body = fc.oneof(
    fc.anything(),
    fc.dictionary(field, fc.anything()),
    fc.record({ messages: fc.array(fc.record({ role: fc.string(), content: fc.anything() })) }),
    fc.tuple(field, fc.jsonValue()).map(([k, v]) => ({ messages: MSG, prompt: "p", [k]: v })),
  );
  fc.assert(
    fc.property(body, (b) => {
      for (const parse of [parseChatRequest, (x: unknown) => parseCompletionRequest(x, 1024)]) {
        try {
          const r = parse(b);
          const t = r.sampling.temperature;
          assert.ok(t === undefined || (t >= 0 && t <= 2));
          assert.ok(r.maxTokens === undefined || (Number.isSafeInteger(r.maxTokens) && r.maxTokens >= 1));
        } catch (e) {
          if (!(e instanceof ApiError)) throw e;
          assert.equal(e.status, 400);
          const { error } = JSON.parse(JSON.stringify(errorBody(e)));
          assert.equal(typeof error.message, "string");
          assert.ok(error.message.length > 0);
          assert.ok(error.param === null || typeof error.param === "string");
          assert.equal(error.type, "invalid_request_error");
        }
      }
    }),
    { numRuns: 3000, seed: 11 },
  );
});
