/**
 * Tool calls and log probabilities through `k3 serve`, driven by real clients: the
 * official `openai` package (a two-step tool loop, streamed tool calls assembled by the
 * SDK, logprobs) and the Vercel AI SDK's `generateText` with tools.
 *
 * The server is the real one (routing, validation, the chat template, the reply reader,
 * SSE) on loopback; its scheduler plays scripted token ids (the tiny model has random
 * weights, so a real model would never write a tool call), with logits made up so the
 * scripted token is the most likely: the log probabilities are checked against a float64
 * log-softmax computed here.
 */

import assert from "node:assert/strict";
import OpenAI from "openai";
import { generateText, jsonSchema, stepCountIs, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import type { SequenceRequest, SequenceResult } from "../../engine/generate/scheduler.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { TINY } from "../helpers.ts";
import { endsAt, madeUpResult, replyPieces, withLoopbackServer } from "../loopback_server.ts";

const tok = Tokenizer.load(TINY);
const { text: t, open, close } = replyPieces(tok);
const VOCAB = 1024;

/** A reply calling get_weather(city), by the format's rule (thinking off). */
const callReply = (city: string) => [
  ...close("response"),
  ...open("tools"),
  ...open('call tool="get_weather" index="1"'),
  ...open('argument key="city" type="string"'),
  ...t(city),
  ...close("argument"),
  ...close("call"),
  ...close("tools"),
  ...close("message"),
];
const answerReply = (text: string) => [...t(text), ...close("response"), ...close("message")];

/** Logits of step `i` of a script: made-up values, the scripted token the largest. */
function logitsFor(token: number, i: number): Float32Array {
  const l = new Float32Array(VOCAB);
  for (let k = 0; k < VOCAB; k++) l[k] = Math.sin(k * 12.9898 + i * 78.233) * 4;
  l[token] = 9;
  return l;
}

/** A scheduler that plays the next script, recording each request's prompt. */
class ScriptedScheduler {
  readonly prompts: number[][] = [];
  readonly scripts: number[][] = [];
  queued = 0;
  active = 0;
  submit(req: SequenceRequest): Promise<SequenceResult> {
    this.prompts.push(req.prompt);
    const script = this.scripts.shift();
    if (!script) return Promise.reject(new Error("no script left"));
    const tokens: number[] = [];
    let finishReason: SequenceResult["finishReason"] = "length";
    for (const [i, id] of script.entries()) {
      if (tokens.length >= req.maxTokens) break;
      tokens.push(id);
      if (endsAt(req, id, logitsFor(id, i))) {
        finishReason = "stop";
        break;
      }
    }
    return madeUpResult(req, tokens, finishReason);
  }
}

/** Runs `fn` with the `/v1` base URL of a loopback server playing a fresh ScriptedScheduler. */
function withServer(fn: (url: string, s: ScriptedScheduler) => Promise<void>): Promise<void> {
  const scheduler = new ScriptedScheduler();
  return withLoopbackServer({ scheduler, tokenizer: tok, vocabSize: VOCAB }, (origin) => fn(`${origin}/v1`, scheduler));
}

const TOOLS: OpenAI.Chat.Completions.ChatCompletionTool[] = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];
const NO_THINK = { chat_template_kwargs: { thinking: false } } as Record<string, unknown>;

Deno.test("openai SDK: a two-step tool loop (call, result, answer) and streamed tool calls", async () => {
  await withServer(async (baseURL, s) => {
    const client = new OpenAI({ baseURL, apiKey: "none" });
    s.scripts.push(callReply('Zürich "Alt" <|sep|>'), answerReply("Sunny, 20 C."));
    const messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [
      { role: "user", content: "Weather in Zürich?" },
    ];
    const first = await client.chat.completions.create({
      model: "tiny",
      messages,
      tools: TOOLS,
      tool_choice: { type: "function", function: { name: "get_weather" } },
      ...NO_THINK,
    });
    const choice = first.choices[0];
    assert.equal(choice.finish_reason, "tool_calls");
    assert.equal(choice.message.content, null);
    const call = choice.message.tool_calls![0] as OpenAI.Chat.Completions.ChatCompletionMessageFunctionToolCall;
    assert.equal(call.function.name, "get_weather");
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Zürich "Alt" <|sep|>' });
    assert.match(call.id, /^call_/);
    // The declaration went into the prompt, as data.
    const prompt1 = tok.decode(s.prompts[0]);
    assert.ok(prompt1.includes('<|open|>message role="system" type="tool-declare"<|sep|># Tools'));
    assert.ok(prompt1.includes('"name":"get_weather"'));

    messages.push(choice.message, { role: "tool", tool_call_id: call.id, content: "sunny, 20 C" });
    const second = await client.chat.completions.create({ model: "tiny", messages, tools: TOOLS, ...NO_THINK });
    assert.equal(second.choices[0].finish_reason, "stop");
    assert.equal(second.choices[0].message.content, "Sunny, 20 C.");
    const prompt2 = tok.decode(s.prompts[1]);
    assert.ok(
      prompt2.includes('<|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" type="string"'),
    );
    assert.ok(prompt2.includes('<|open|>message role="tool" tool="get_weather" index="1"<|sep|>sunny, 20 C'));

    // Streamed: the SDK assembles the call from the deltas.
    s.scripts.push(callReply("Paris"));
    const stream = client.chat.completions.stream({
      model: "tiny",
      messages: messages.slice(0, 1),
      tools: TOOLS,
      ...NO_THINK,
    });
    const done = await stream.finalChatCompletion();
    const sc = done.choices[0];
    assert.equal(sc.finish_reason, "tool_calls");
    const streamed = sc.message.tool_calls![0] as OpenAI.Chat.Completions.ChatCompletionMessageFunctionToolCall;
    assert.equal(streamed.function.name, "get_weather");
    assert.deepEqual(JSON.parse(streamed.function.arguments), { city: "Paris" });
    assert.ok(!(sc.message.content ?? "").includes("<|"), "markup never reaches content");
  });
});

Deno.test("openai SDK: logprobs equal a float64 log-softmax of the logits, streamed and not", async () => {
  await withServer(async (baseURL, s) => {
    const client = new OpenAI({ baseURL, apiKey: "none" });
    const script = answerReply("Hello there");
    const content = t("Hello there");
    s.scripts.push(script, script);
    const r = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "hi" }],
      logprobs: true,
      top_logprobs: 3,
      ...NO_THINK,
    });
    const lp = r.choices[0].logprobs!.content!;
    assert.equal(lp.length, content.length);
    lp.forEach((e, i) => {
      const l = logitsFor(content[i], i);
      let m = -Infinity;
      for (const x of l) m = Math.max(m, x);
      let sum = 0;
      for (const x of l) sum += Math.exp(x - m);
      assert.equal(e.logprob, (l[content[i]] - m) - Math.log(sum));
      assert.deepEqual(e.bytes, Array.from(tok.decodeBytes([content[i]])));
      assert.equal(e.top_logprobs.length, 3);
      assert.equal(e.top_logprobs[0].logprob, e.logprob, "the scripted token is the most likely");
      assert.ok(e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob);
    });
    const st = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "hi" }],
      logprobs: true,
      top_logprobs: 3,
      stream: true,
      ...NO_THINK,
    });
    const streamed: unknown[] = [];
    for await (const c of st) streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
    assert.deepEqual(streamed, lp);
  });
});

Deno.test("Vercel AI SDK: generateText with tools runs the tool and answers", async () => {
  await withServer(async (baseURL, s) => {
    // The AI SDK sends no chat_template_kwargs: the reply starts in the think channel.
    const think = [...t("Let me check."), ...close("think"), ...open("response")];
    s.scripts.push([...think, ...callReply("Rome")], [...think, ...answerReply("It is sunny in Rome.")]);
    const provider = createOpenAI({ baseURL, apiKey: "none" });
    const seen: string[] = [];
    const result = await generateText({
      model: provider.chat("tiny"),
      prompt: "Weather in Rome?",
      tools: {
        get_weather: tool({
          description: "The weather in a city.",
          inputSchema: jsonSchema<{ city: string }>({
            type: "object",
            properties: { city: { type: "string" } },
            required: ["city"],
          }),
          execute: ({ city }) => (seen.push(city), Promise.resolve(`sunny in ${city}`)),
        }),
      },
      stopWhen: stepCountIs(3),
    });
    assert.deepEqual(seen, ["Rome"]);
    assert.equal(result.text, "It is sunny in Rome.");
    assert.ok(tok.decode(s.prompts[1]).includes('role="tool" tool="get_weather" index="1"<|sep|>'));
  });
});

Deno.test("serve: a malformed call is content with finish stop; tool_choice none drops the channel; streamed = whole", async () => {
  await withServer(async (baseURL, s) => {
    const post = async (body: Record<string, unknown>) =>
      await (await fetch(`${baseURL}/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "tiny", messages: [{ role: "user", content: "x" }], ...NO_THINK, ...body }),
      })).json();
    const malformed = [
      ...t("ok"),
      ...close("response"),
      ...open("tools"),
      ...open('call tool="get_weather" index="1"'),
      ...open('argument key="n" type="number"'),
      ...t("twelve"),
      ...close("argument"),
      ...close("call"),
      ...close("tools"),
      ...close("message"),
    ];
    s.scripts.push(malformed);
    const bad = (await post({ tools: TOOLS })).choices[0];
    assert.equal(bad.finish_reason, "stop");
    assert.equal(bad.message.tool_calls, undefined);
    assert.ok(bad.message.content.startsWith("ok<|open|>tools<|sep|>"), bad.message.content);

    s.scripts.push(callReply("Oslo"));
    const none = (await post({ tools: TOOLS, tool_choice: "none" })).choices[0];
    assert.deepEqual([none.finish_reason, none.message.content, none.message.tool_calls], ["stop", "", undefined]);
    assert.ok(tok.decode(s.prompts[1]).includes("The system is invoked with `tool_choice=none`."));

    // Two parallel calls, streamed: the deltas add up to the unstreamed answer's calls.
    const two = [...callReply("A").slice(0, -close("message").length - close("tools").length)];
    const parallel = [
      ...two,
      ...open('call tool="get_weather" index="2"'),
      ...open('argument key="city" type="string"'),
      ...t('B "q" é'),
      ...close("argument"),
      ...close("call"),
      ...close("tools"),
      ...close("message"),
    ];
    s.scripts.push(parallel, parallel);
    const whole = (await post({ tools: TOOLS })).choices[0];
    const res = await fetch(`${baseURL}/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "tiny",
        messages: [{ role: "user", content: "x" }],
        tools: TOOLS,
        stream: true,
        ...NO_THINK,
      }),
    });
    const calls: { name: string; arguments: string }[] = [];
    let finish = "";
    for (const line of (await res.text()).split("\n")) {
      if (!line.startsWith("data: {")) continue;
      const c = JSON.parse(line.slice(6)).choices[0];
      for (const d of c?.delta?.tool_calls ?? []) {
        calls[d.index] ??= { name: "", arguments: "" };
        if (d.function.name) calls[d.index].name = d.function.name;
        calls[d.index].arguments += d.function.arguments;
      }
      if (c?.finish_reason) finish = c.finish_reason;
    }
    assert.equal(finish, "tool_calls");
    assert.deepEqual(calls, whole.message.tool_calls.map((c: { function: unknown }) => c.function));
    assert.deepEqual(calls.map((c) => JSON.parse(c.arguments).city), ["A", 'B "q" é']);
  });
});

Deno.test("openai SDK responses.create: function tools, a function_call item, its output answered, streamed alike", async () => {
  await withServer(async (baseURL, s) => {
    const client = new OpenAI({ baseURL, apiKey: "none" });
    const thinkThen = (reply: number[]) => [...t("Look it up."), ...close("think"), ...open("response"), ...reply];
    s.scripts.push(thinkThen(callReply("Oslo")), thinkThen(answerReply("Cold, 2 C.")), thinkThen(callReply("Oslo")));
    const tools: OpenAI.Responses.FunctionTool[] = [{
      type: "function",
      name: "get_weather",
      description: "The weather in a city.",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
      strict: true,
    }];
    const first = await client.responses.create({
      model: "tiny",
      input: "Weather in Oslo?",
      tools,
      tool_choice: "required",
    });
    assert.equal(first.status, "completed");
    assert.deepEqual(first.output.map((o) => o.type), ["reasoning", "function_call"]);
    const call = first.output[1] as OpenAI.Responses.ResponseFunctionToolCall;
    assert.equal(call.name, "get_weather");
    assert.deepEqual(JSON.parse(call.arguments), { city: "Oslo" });
    assert.match(call.call_id, /^call_/);
    assert.ok(tok.decode(s.prompts[0]).includes('"name":"get_weather"'), "the declaration is in the prompt");

    const second = await client.responses.create({
      model: "tiny",
      tools,
      input: [
        { role: "user", content: "Weather in Oslo?" },
        { type: "function_call", call_id: call.call_id, name: call.name, arguments: call.arguments },
        { type: "function_call_output", call_id: call.call_id, output: "cold, 2 C" },
      ],
    });
    assert.equal(second.output_text, "Cold, 2 C.");
    // The call went back as the assistant's tools channel, the output as the tool's message.
    const prompt2 = tok.decode(s.prompts[1]);
    assert.ok(prompt2.includes('<|open|>call tool="get_weather" index="1"<|sep|>'), prompt2);
    assert.ok(prompt2.includes('<|open|>message role="tool" tool="get_weather" index="1"<|sep|>cold, 2 C'), prompt2);

    // Streamed: a function_call item added, its arguments as deltas, the same final output.
    const stream = await client.responses.create({
      model: "tiny",
      input: "Weather in Oslo?",
      tools,
      tool_choice: { type: "function", name: "get_weather" },
      stream: true,
    });
    let args = "", added = 0, final: OpenAI.Responses.Response | undefined;
    for await (const e of stream) {
      if (e.type === "response.output_item.added" && e.item.type === "function_call") added++;
      if (e.type === "response.function_call_arguments.delta") args += e.delta;
      if (e.type === "response.completed") final = e.response;
    }
    assert.equal(added, 1);
    assert.deepEqual(JSON.parse(args), { city: "Oslo" });
    assert.deepEqual(final!.output.map((o) => o.type), ["reasoning", "function_call"]);
    assert.equal((final!.output[1] as OpenAI.Responses.ResponseFunctionToolCall).arguments, args);
  });
});
