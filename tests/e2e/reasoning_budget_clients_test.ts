/**
 * Forced calls and structured output with thinking on, through the pinned clients (the
 * openai SDK, the AI SDK, LangChain), against a `k3 serve` process on the tiny model.
 * The tiny model has random weights: it never closes its think channel by itself, so
 * every reply here completes only because the reasoning budget closes it (forced markup)
 * and leaves the call or the object room within the reply's tokens.
 *
 * What a client sends: nothing. A constrained reply's budget is half of its max tokens
 * unless the request (`max_reasoning_tokens`) or the server (`--reasoning-budget N`) gives
 * a smaller one; each of the three is checked, the budget by the reasoning tokens the
 * usage reports. Every call's arguments and every object validate against the schema the
 * client sent (ajv).
 */

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { LOOKUP } from "../client_schemas.ts";
import OpenAI from "openai";
import { generateObject, generateText, jsonSchema, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { ChatOpenAI } from "@langchain/openai";
import { serveTiny } from "../helpers.ts";

const ajv = new Ajv({ strict: false });

const DESCRIPTION = "Looks a word up in the dictionary.";
const PROMPT = "Look up the word 'cat' in the dictionary.";
/** The budget a reply must have spent: the request's or the server's, else half of its max tokens. */
interface Budget {
  /** Each reply's max tokens. The tiny model's vocabulary spells markup nearly byte by
   * byte: a forced call takes about 200 tokens after the reasoning (the real model's a few dozen). */
  maxTokens: number;
  /** What the reasoning tokens of each reply must be. */
  reasoning: number;
  /** Added to every request body (openai SDK, LangChain's modelKwargs, the AI SDK's fetch). */
  body: Record<string, unknown>;
}

/** Validates `value` against LOOKUP, naming `what` on failure. */
function validLookup(value: unknown, what: string): void {
  assert.ok(ajv.validate(LOOKUP, value), `${what}: ${JSON.stringify(value)}: ${ajv.errorsText()}`);
}

/** A fetch that adds `extra` to every JSON body (how an AI SDK user sends a field it has no option for). */
function addingFetch(extra: Record<string, unknown>): typeof fetch {
  return (input, init) => {
    if (Object.keys(extra).length > 0 && typeof init?.body === "string") {
      init = { ...init, body: JSON.stringify({ ...JSON.parse(init.body), ...extra }) };
    }
    return fetch(input, init);
  };
}

async function openaiSdk(url: string, b: Budget): Promise<void> {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "none", maxRetries: 0 });
  const tools: OpenAI.Chat.Completions.ChatCompletionTool[] = [
    { type: "function", function: { name: "lookup", description: DESCRIPTION, parameters: LOOKUP } },
  ];
  const choices = [{ type: "function" as const, function: { name: "lookup" } }, "required" as const];
  for (const tool_choice of choices) {
    const what = `openai SDK chat, tool_choice ${JSON.stringify(tool_choice)}`;
    const r = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: PROMPT }],
      tools,
      tool_choice,
      parallel_tool_calls: false,
      max_tokens: b.maxTokens,
      temperature: 0,
      ...b.body,
    });
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, "tool_calls", what);
    assert.equal(r.usage?.completion_tokens_details?.reasoning_tokens, b.reasoning, what);
    const reasoning = (choice.message as { reasoning_content?: string }).reasoning_content ?? "";
    assert.ok(reasoning.length > 0, `${what}: thinking was on`);
    const call = choice.message.tool_calls![0] as OpenAI.Chat.Completions.ChatCompletionMessageFunctionToolCall;
    assert.equal(call.function.name, "lookup", what);
    validLookup(JSON.parse(call.function.arguments), what);
  }
  const format = await client.chat.completions.create({
    model: "tiny",
    messages: [{ role: "user", content: PROMPT }],
    response_format: { type: "json_schema", json_schema: { name: "lookup", schema: LOOKUP, strict: true } },
    max_tokens: b.maxTokens,
    temperature: 0,
    ...b.body,
  });
  assert.equal(format.choices[0].finish_reason, "stop");
  assert.equal(format.usage?.completion_tokens_details?.reasoning_tokens, b.reasoning);
  validLookup(JSON.parse(format.choices[0].message.content!), "openai SDK chat, response_format");

  // The Responses API: a forced function call and a text format.
  const called = await client.responses.create({
    model: "tiny",
    input: PROMPT,
    tools: [{ type: "function", name: "lookup", description: DESCRIPTION, parameters: LOOKUP, strict: true }],
    tool_choice: { type: "function", name: "lookup" },
    max_output_tokens: b.maxTokens,
    temperature: 0,
    ...b.body,
  });
  assert.equal(called.status, "completed");
  assert.equal(called.usage?.output_tokens_details.reasoning_tokens, b.reasoning, "responses, forced call");
  const fc = called.output.find((o) => o.type === "function_call");
  assert.ok(fc && fc.type === "function_call" && fc.name === "lookup", JSON.stringify(called.output));
  validLookup(JSON.parse(fc.arguments), "openai SDK responses, forced call");
  const formatted = await client.responses.create({
    model: "tiny",
    input: PROMPT,
    text: { format: { type: "json_schema", name: "lookup", schema: LOOKUP, strict: true } },
    max_output_tokens: b.maxTokens,
    temperature: 0,
    ...b.body,
  });
  assert.equal(formatted.status, "completed");
  assert.equal(formatted.usage?.output_tokens_details.reasoning_tokens, b.reasoning, "responses, text format");
  validLookup(JSON.parse(formatted.output_text), "openai SDK responses, text format");
}

async function aiSdk(url: string, b: Budget): Promise<void> {
  const provider = createOpenAI({ baseURL: `${url}/v1`, apiKey: "none", fetch: addingFetch(b.body) });
  for (const [api, model] of [["chat", provider.chat("tiny")], ["responses", provider.responses("tiny")]] as const) {
    const common = { model, prompt: PROMPT, maxOutputTokens: b.maxTokens, temperature: 0, maxRetries: 0 };
    const called = await generateText({
      ...common,
      tools: { lookup: tool({ description: DESCRIPTION, inputSchema: jsonSchema(LOOKUP) }) },
      toolChoice: { type: "tool", toolName: "lookup" },
    });
    assert.equal(called.usage.reasoningTokens, b.reasoning, `AI SDK ${api}: generateText, a forced tool`);
    assert.equal(called.toolCalls.length, 1, `AI SDK ${api}: generateText, a forced tool`);
    assert.equal(called.toolCalls[0].toolName, "lookup");
    validLookup(called.toolCalls[0].input, `AI SDK ${api}: generateText, a forced tool`);
    const { object, usage } = await generateObject({ ...common, schema: jsonSchema(LOOKUP) });
    assert.equal(usage.reasoningTokens, b.reasoning, `AI SDK ${api}: generateObject`);
    validLookup(object, `AI SDK ${api}: generateObject`);
  }
  // Thinking off from the AI SDK's own option: the chat model sends it as reasoning_effort.
  const off = await generateObject({
    model: provider.chat("tiny"),
    prompt: PROMPT,
    maxOutputTokens: b.maxTokens,
    temperature: 0,
    maxRetries: 0,
    schema: jsonSchema(LOOKUP),
    providerOptions: { openai: { reasoningEffort: "none" } },
  });
  assert.equal(off.usage.reasoningTokens, 0, "AI SDK chat, reasoningEffort none: no think channel");
  validLookup(off.object, "AI SDK chat, reasoningEffort none");
}

async function langChain(url: string, b: Budget): Promise<void> {
  for (const useResponsesApi of [false, true]) {
    const model = new ChatOpenAI({
      model: "tiny",
      apiKey: "none",
      configuration: { baseURL: `${url}/v1` },
      temperature: 0,
      maxTokens: b.maxTokens,
      maxRetries: 0,
      useResponsesApi,
      modelKwargs: b.body,
    });
    const api = useResponsesApi ? "responses" : "chat";
    const lookupTool = {
      type: "function" as const,
      function: { name: "lookup", description: DESCRIPTION, parameters: LOOKUP },
    };
    // LangChain 1.6's Responses path drops a string tool_choice ("any" is sent as no
    // tool_choice at all): only a named choice forces a call there (docs/clients.md).
    for (const tool_choice of useResponsesApi ? ["lookup"] : ["lookup", "any"]) {
      const what = `LangChain ${api}: bindTools, tool_choice ${tool_choice}`;
      const m = await model.bindTools([lookupTool], { tool_choice, parallel_tool_calls: false }).invoke(PROMPT);
      assert.equal(m.usage_metadata?.output_token_details?.reasoning, b.reasoning, what);
      assert.equal(m.tool_calls?.length, 1, what);
      assert.equal(m.tool_calls![0].name, "lookup", what);
      validLookup(m.tool_calls![0].args, what);
    }
    for (const method of ["jsonSchema", "functionCalling"] as const) {
      const what = `LangChain ${api}: withStructuredOutput, ${method}`;
      const { raw, parsed } = await model
        .withStructuredOutput({ title: "lookup", description: DESCRIPTION, ...LOOKUP }, { method, includeRaw: true })
        .invoke(PROMPT);
      assert.equal(
        (raw as { usage_metadata?: { output_token_details?: { reasoning?: number } } }).usage_metadata
          ?.output_token_details?.reasoning,
        b.reasoning,
        what,
      );
      validLookup(parsed, what);
    }
  }
}

/** Runs every client's requests against a tiny server started with `flags`. */
async function allClients(flags: string[], b: Budget): Promise<void> {
  const server = await serveTiny(["--context", "2048", ...flags]);
  try {
    await openaiSdk(server.url, b);
    await aiSdk(server.url, b);
    await langChain(server.url, b);
  } finally {
    await server.stop();
  }
}

const serverTest = { sanitizeOps: false, sanitizeResources: false };

Deno.test({
  ...serverTest,
  name:
    "thinking on, nothing sent: forced calls and objects complete through every client (budget: half of max_tokens)",
  fn: () => allClients([], { maxTokens: 600, reasoning: 300, body: {} }),
});

Deno.test({
  ...serverTest,
  name: "thinking on, k3 serve --reasoning-budget 16: forced calls and objects complete after 16 reasoning tokens",
  fn: () => allClients(["--reasoning-budget", "16"], { maxTokens: 400, reasoning: 16, body: {} }),
});

Deno.test({
  ...serverTest,
  name: "thinking on, max_reasoning_tokens 8 in each client's body: forced calls and objects complete after 8",
  fn: () =>
    allClients(["--reasoning-budget", "16"], { maxTokens: 400, reasoning: 8, body: { max_reasoning_tokens: 8 } }),
});
