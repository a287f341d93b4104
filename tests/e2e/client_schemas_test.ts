/**
 * The schemas clients generate, through the real server and the pinned clients: zod 4
 * objects through openai-node's `chat.completions.parse` and `responses.parse` and the AI
 * SDK's `generateObject`; every object the client hands back validates with ajv against
 * the schema the client sent. Also what the clients send besides: a model alias,
 * routes without `/v1`, a body without a JSON type (415), `tool_choice` without tools
 * (400), `reasoning` beside `reasoning_content`, `n` > 1 and the penalties.
 *
 * The server is the real one on loopback (routing, validation, the schema compiler, the
 * constraint, the reply reader); its scheduler draws each token from made-up logits
 * through the request's grammar, as the engine's scheduler does, so what comes back is
 * whatever the grammar lets random logits write.
 */

import assert from "node:assert/strict";
import OpenAI from "openai";
import { zodResponseFormat, zodTextFormat } from "openai/helpers/zod";
import { generateObject } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { z } from "zod";
import { Ajv } from "ajv";
import type { SequenceRequest, SequenceResult } from "../../engine/generate/scheduler.ts";
import { argmax } from "../../engine/generate/sampling.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { TINY } from "../helpers.ts";
import { endsAt, madeUpResult, withLoopbackServer } from "../loopback_server.ts";

const tok = Tokenizer.load(TINY);
const VOCAB = 1024;
const TEXT = Array.from({ length: VOCAB }, (_, id) => tok.decode([id]));
// Made-up logits lean toward tokens that close things and away from whitespace, so walks
// end; `<|close|>` leads, so a reply that starts thinking closes its think channel at once.
const CLOSE = tok.specialId("<|close|>");
const BIAS = TEXT.map((t, id) => (id === CLOSE ? 8 : /^\s+$/.test(t) ? -6 : /["\]},]/.test(t) ? 2.5 : 0));

/** A scheduler that draws every token from seeded made-up logits through the request's grammar. */
class GrammarScheduler {
  queued = 0;
  active = 0;
  seed = 1;
  readonly requests: SequenceRequest[] = [];
  submit(req: SequenceRequest): Promise<SequenceResult> {
    this.requests.push(req);
    let s = this.seed++ * 2654435761 >>> 0 || 1;
    const rand = () => {
      s ^= s << 13, s ^= s >>> 17, s ^= s << 5;
      return (s >>> 0) / 2 ** 32;
    };
    const tokens: number[] = [];
    let finishReason: SequenceResult["finishReason"] = "length";
    while (tokens.length < req.maxTokens) {
      const logits = Float32Array.from({ length: VOCAB }, (_, k) => rand() * 4 + BIAS[k]);
      const id = req.grammar ? req.grammar.pick(logits, argmax) : argmax(logits);
      tokens.push(id);
      if (endsAt(req, id, logits)) {
        finishReason = "stop";
        break;
      }
    }
    return madeUpResult(req, tokens, finishReason);
  }
}

/** Runs `fn` against a loopback server named kimi-k3 (alias moonshotai/Kimi-K3) drawing through a GrammarScheduler. */
function withServer(fn: (url: string, s: GrammarScheduler) => Promise<void>): Promise<void> {
  const scheduler = new GrammarScheduler();
  return withLoopbackServer(
    {
      scheduler,
      tokenizer: tok,
      vocabSize: VOCAB,
      capacity: 8192,
      modelName: "kimi-k3",
      modelAliases: ["moonshotai/Kimi-K3"],
    },
    (origin) => fn(origin, scheduler),
  );
}

/** What zod users write: safe integers, bounds, formats, a pattern, optionals, nullables, records, no-key objects. */
const Order = z.object({
  id: z.string().uuid(),
  count: z.number().int(),
  positive: z.number().int().positive().max(1000),
  price: z.number().min(0.5).max(10),
  email: z.string().email(),
  when: z.string().datetime(),
  code: z.string().regex(/^[A-Z]{2}-\d{3}$/),
  site: z.url(),
  note: z.string().max(8).nullable(),
  color: z.enum(["red", "green"]),
  tags: z.record(z.string(), z.number().int().min(0).max(9)),
  empty: z.object({}),
});
/** The same without the record: openai-node's strict helpers refuse records themselves. */
const StrictOrder = Order.omit({ tags: true });
const ajv = new Ajv({ strict: false, validateFormats: false });
const NO_THINK = { chat_template_kwargs: { thinking: false } } as Record<string, unknown>;

/** The JSON schema a client sent, read back from the request it made (ajv here reads draft 7). */
function sentSchema(body: Record<string, unknown>): Record<string, unknown> {
  const rf = body.response_format as { json_schema?: { schema: Record<string, unknown> } } | undefined;
  const text = body.text as { format?: { schema: Record<string, unknown> } } | undefined;
  const schema = rf?.json_schema?.schema ?? text?.format?.schema;
  assert.ok(schema, `no schema in ${JSON.stringify(body).slice(0, 200)}`);
  const { $schema: _, ...rest } = schema;
  return rest;
}

/** A fetch that records JSON bodies and asks chat requests for thinking off (the clients have no field for it). */
function recordingFetch(bodies: Record<string, unknown>[]): typeof fetch {
  return (input, init) => {
    if (typeof init?.body === "string") {
      const chat = String(input instanceof Request ? input.url : input).endsWith("/chat/completions");
      const body = { ...JSON.parse(init.body), ...(chat ? NO_THINK : {}) };
      bodies.push(body);
      init = { ...init, body: JSON.stringify(body) };
    }
    return fetch(input, init);
  };
}

Deno.test("openai SDK: zod schemas through chat.completions.parse and responses.parse; every object validates (ajv)", async () => {
  await withServer(async (url) => {
    const bodies: Record<string, unknown>[] = [];
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "none", fetch: recordingFetch(bodies) });
    for (let i = 0; i < 3; i++) {
      const chat = await client.chat.completions.parse({
        model: "kimi-k3",
        messages: [{ role: "user", content: "An order, please." }],
        response_format: zodResponseFormat(StrictOrder, "order"),
        max_completion_tokens: 4000,
      });
      const parsed = chat.choices[0].message.parsed;
      assert.ok(parsed, `finish ${chat.choices[0].finish_reason}: ${chat.choices[0].message.content}`);
      assert.ok(ajv.validate(sentSchema(bodies.at(-1)!), parsed), ajv.errorsText());
      assert.ok(StrictOrder.safeParse(parsed).success);
    }
    for (let i = 0; i < 2; i++) {
      const r = await client.responses.parse({
        model: "moonshotai/Kimi-K3",
        input: "An order, please.",
        text: { format: zodTextFormat(StrictOrder, "order") },
        max_output_tokens: 4000,
      });
      assert.ok(r.output_parsed, r.output_text);
      assert.ok(ajv.validate(sentSchema(bodies.at(-1)!), r.output_parsed), ajv.errorsText());
      assert.equal(r.model, "kimi-k3");
    }
  });
});

Deno.test("AI SDK: generateObject with a zod schema; the object validates against the schema sent (ajv)", async () => {
  await withServer(async (url) => {
    const bodies: Record<string, unknown>[] = [];
    for (const provider of ["chat", "responses"] as const) {
      const openai = createOpenAI({ baseURL: `${url}/v1`, apiKey: "none", fetch: recordingFetch(bodies) });
      const model = provider === "chat" ? openai.chat("kimi-k3") : openai.responses("kimi-k3");
      const { object } = await generateObject({
        model,
        schema: Order,
        prompt: "An order, please.",
        maxOutputTokens: 4000,
        maxRetries: 0,
      });
      assert.ok(ajv.validate(sentSchema(bodies.at(-1)!), object), `${provider}: ${ajv.errorsText()}`);
    }
  });
});

Deno.test("names and routes: aliases, routes without /v1, 415 without a JSON type, tool_choice without tools, reasoning", async () => {
  await withServer(async (url) => {
    const post = (path: string, body: unknown, type: string | null = "application/json") =>
      fetch(`${url}${path}`, {
        method: "POST",
        headers: type === null ? {} : { "content-type": type },
        body: type === null ? new Blob([JSON.stringify(body)]) : JSON.stringify(body),
      });
    const chat = { messages: [{ role: "user", content: "hi" }], max_tokens: 4 };
    for (const path of ["/v1/chat/completions", "/chat/completions"]) {
      for (const model of ["kimi-k3", "moonshotai/Kimi-K3"]) {
        const r = await post(path, { ...chat, model });
        const body = await r.json();
        assert.equal(r.status, 200, JSON.stringify(body));
        const msg = body.choices[0].message;
        assert.equal(msg.reasoning, msg.reasoning_content);
      }
    }
    const unknown = await post("/chat/completions", { ...chat, model: "gpt-4o" });
    assert.equal(unknown.status, 404);
    assert.match((await unknown.json()).error.message, /'kimi-k3', 'moonshotai\/Kimi-K3'/);
    const models = await (await fetch(`${url}/models`)).json();
    assert.deepEqual(models.data.map((m: { id: string }) => m.id), ["kimi-k3", "moonshotai/Kimi-K3"]);
    assert.equal((await fetch(`${url}/models/moonshotai%2FKimi-K3`)).status, 200);
    const completion = await post("/completions", { prompt: "hi", max_tokens: 2 });
    assert.equal(completion.status, 200, await completion.text());
    for (const type of [null, "application/x-www-form-urlencoded", "text/json"]) {
      const r = await post("/v1/chat/completions", chat, type);
      assert.equal(r.status, 415, `${type}: ${await r.text()}`);
    }
    assert.equal((await post("/v1/chat/completions", chat, "application/json; charset=utf-8")).status, 200);
    for (const choice of ["auto", "none", "required", { type: "function", function: { name: "f" } }]) {
      const r = await post("/v1/chat/completions", { ...chat, tool_choice: choice });
      const body = await r.json();
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal(body.error.param, "tool_choice");
    }
    // Streamed: every think-channel delta carries both names.
    const stream = await post("/v1/chat/completions", { ...chat, max_tokens: 6, stream: true });
    const deltas = (await stream.text()).split("\n").filter((l) => l.startsWith("data: {"))
      .map((l) => JSON.parse(l.slice(6)).choices[0]?.delta ?? {});
    const thinking = deltas.filter((d) => d.reasoning_content !== undefined);
    assert.ok(thinking.length > 0, "the reply starts in the think channel");
    for (const d of thinking) assert.equal(d.reasoning, d.reasoning_content);
  });
});

/** Logits that depend only on the prompt and the step, picked as the engine picks (the request's sampler, its filter). */
class KnobScheduler {
  queued = 0;
  active = 0;
  submit(req: SequenceRequest): Promise<SequenceResult> {
    const tokens: number[] = [];
    const choose = req.choose ?? argmax;
    let finishReason: SequenceResult["finishReason"] = "length";
    while (tokens.length < req.maxTokens) {
      const step = tokens.length, salt = req.prompt.length;
      // Printable byte tokens only (ids 40..199), so every token is text.
      const logits = Float32Array.from(
        { length: VOCAB },
        (_, k) => (k >= 40 && k < 200 ? Math.sin(k * 12.9898 + step * 78.233 + salt) * 3 : -1e9),
      );
      const id = req.grammar ? req.grammar.pick(logits, choose) : choose(logits);
      tokens.push(id);
      if (endsAt(req, id, logits)) {
        finishReason = "stop";
        break;
      }
    }
    return madeUpResult(req, tokens, finishReason);
  }
}

Deno.test("n > 1, several prompts and penalties: choice i is the single request of seed + i; runs repeat; logit_bias applies", async () => {
  await withLoopbackServer(
    { scheduler: new KnobScheduler(), tokenizer: tok, vocabSize: VOCAB, parallel: 4, maxQueue: 16 },
    async (origin) => {
      const url = `${origin}/v1/completions`;
      const complete = async (body: Record<string, unknown>) => {
        const r = await fetch(url, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ prompt: "Once upon", max_tokens: 12, temperature: 1, ...body }),
        });
        const json = await r.json();
        assert.equal(r.status, 200, JSON.stringify(json));
        return json as { choices: { index: number; text: string }[]; usage: { completion_tokens: number } };
      };
      const knobs = { presence_penalty: 0.8, frequency_penalty: 0.4, repetition_penalty: 1.3 };
      const three = await complete({ n: 3, seed: 7, ...knobs });
      assert.deepEqual(three.choices.map((c) => c.index), [0, 1, 2]);
      assert.equal(three.usage.completion_tokens, 36);
      assert.deepEqual((await complete({ n: 3, seed: 7, ...knobs })).choices, three.choices, "the same choices again");
      for (let i = 0; i < 3; i++) {
        const alone = await complete({ seed: 7 + i, ...knobs });
        assert.equal(alone.choices[0].text, three.choices[i].text, `choice ${i} is the request of seed ${7 + i}`);
      }
      assert.ok(new Set(three.choices.map((c) => c.text)).size > 1, "different seeds sample differently");
      const plain = await complete({ seed: 7 });
      assert.notEqual(plain.choices[0].text, three.choices[0].text, "the penalties change the sample");
      // Several prompts: each one's n choices, in prompt order, each equal to its request alone.
      const prompts = ["Once upon", "A long time ago in a"];
      const both = await complete({ prompt: prompts, n: 2, seed: 11 });
      assert.deepEqual(both.choices.map((c) => c.index), [0, 1, 2, 3]);
      for (const [j, p] of prompts.entries()) {
        for (let i = 0; i < 2; i++) {
          const alone = await complete({ prompt: p, seed: 11 + i });
          assert.equal(both.choices[j * 2 + i].text, alone.choices[0].text, `prompt ${j} choice ${i}`);
        }
      }
      const usage = (both as unknown as { usage: { prompt_tokens: number } }).usage;
      assert.equal(usage.prompt_tokens, tok.encode(prompts[0]).length + tok.encode(prompts[1]).length);
      // A bias of 100 on one token makes it every pick, greedy or sampled.
      const id = tok.encode("Z")[0];
      const biased = await complete({ seed: 3, logit_bias: { [String(id)]: 100 } });
      assert.equal(biased.choices[0].text, "Z".repeat(12));
      const outside = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "x", logit_bias: { [String(VOCAB)]: 1 } }),
      });
      assert.equal(outside.status, 400);
      assert.equal((await outside.json()).error.param, `logit_bias.${VOCAB}`);
    },
  );
});
