/**
 * `n` > 1 through `k3 serve` on the tiny model, the state cache off: the prompt of P ids is
 * prefilled once, P rows (from /metrics), for all its choices, and choice i is the single
 * request of seed + i; streamed (chat and completions SSE, openai-node's accumulator) the
 * choices come interleaved, told apart by index, each with its own finish_reason, and the
 * usage chunk adds them up; several prompts stream too. The sampling knobs (penalties,
 * logit_bias) with `n` > 1 give the same choices alone and beside other requests, resident
 * and at the floor budget.
 */

import assert from "node:assert/strict";
import OpenAI from "openai";
import { floorFlags, packedFloor, serveTiny, tempDir, TINY } from "../helpers.ts";

type Json = Record<string, unknown>;
interface Choice {
  index: number;
  text?: string;
  message?: { content: string | null; reasoning_content: string | null };
  finish_reason: string;
}
interface Body {
  choices: Choice[];
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}

/** POSTs `body` to `url`'s `path`; the JSON answer (200 asserted). */
async function post(url: string, path: string, body: Json): Promise<Body> {
  const r = await fetch(`${url}/v1/${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const json = await r.json();
  assert.equal(r.status, 200, JSON.stringify(json));
  return json;
}

/** POSTs a streamed request; every `data:` chunk before [DONE] (asserted last). */
async function events(url: string, path: string, body: Json): Promise<Json[]> {
  const r = await fetch(`${url}/v1/${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(r.status, 200);
  const data = (await r.text()).split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6));
  assert.equal(data.at(-1), "[DONE]");
  return data.slice(0, -1).map((d) => JSON.parse(d));
}

/** The prefill rows the server has run so far (k3_pass_rows_total{kind="prefill"}). */
async function prefillRows(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = /^k3_pass_rows_total\{kind="prefill"\} (\d+)$/m.exec(text);
  assert.ok(m, text);
  return Number(m[1]);
}

/** A choice's text and reasoning: a completion's text, or a chat message's content and reasoning. */
const said = (c: Choice) => ({
  text: c.text ?? c.message!.content ?? "",
  reasoning: c.message?.reasoning_content ?? "",
});

/** The choices of a stream, put together by index: text, reasoning, finish reasons; the order indexes came in. */
function assemble(chunks: Json[]) {
  const byIndex = new Map<number, { text: string; reasoning: string; finishes: string[] }>();
  const order: number[] = [];
  let usage: Body["usage"] | undefined;
  for (const chunk of chunks) {
    if (chunk.usage) usage = chunk.usage as Body["usage"];
    for (const c of chunk.choices as (Choice & { delta?: Json })[]) {
      order.push(c.index);
      const e = byIndex.get(c.index) ?? { text: "", reasoning: "", finishes: [] };
      const d = c.delta as { content?: string; reasoning_content?: string } | undefined;
      e.text += c.text ?? d?.content ?? "";
      e.reasoning += d?.reasoning_content ?? "";
      if (c.finish_reason) e.finishes.push(c.finish_reason);
      byIndex.set(c.index, e);
    }
  }
  return { byIndex, order, usage };
}

Deno.test({
  name: "n > 1 without the state cache: the prompt prefilled once (P rows); choice i is the request of seed + i",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const server = await serveTiny(["--state-cache-gb", "0", "--parallel", "4", "--draft", "off"]);
    try {
      const ask = { prompt: "Once upon a time there was a", max_tokens: 8, temperature: 1 };
      const before = await prefillRows(server.url);
      const four = await post(server.url, "completions", { ...ask, n: 4, seed: 5 });
      const P = four.usage.prompt_tokens;
      assert.equal(await prefillRows(server.url) - before, P, "the prompt once, not once per choice");
      assert.deepEqual(four.choices.map((c) => c.index), [0, 1, 2, 3]);
      for (let i = 0; i < 4; i++) {
        const alone = await post(server.url, "completions", { ...ask, seed: 5 + i });
        assert.equal(alone.choices[0].text, four.choices[i].text, `choice ${i}`);
        assert.equal(alone.choices[0].finish_reason, four.choices[i].finish_reason, `choice ${i}`);
      }
      assert.ok(new Set(four.choices.map((c) => c.text)).size > 1, "the seeds sample differently");
      const sum = four.usage.completion_tokens;
      assert.equal(four.usage.total_tokens, P + sum);
    } finally {
      await server.stop();
    }
  },
});

Deno.test({
  name: "streamed n > 1: chat and completions SSE interleave the choices by index, each finishes, usage adds up",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const server = await serveTiny(["--state-cache-gb", "0", "--parallel", "4"]);
    try {
      const url = server.url;
      const cases: [string, Json][] = [
        ["completions", { prompt: "Once upon a time", max_tokens: 10, temperature: 1, seed: 3, n: 3 }],
        ["chat/completions", {
          messages: [{ role: "user", content: "Tell me a story." }],
          max_tokens: 10,
          temperature: 1,
          seed: 3,
          n: 3,
        }],
      ];
      for (const [path, body] of cases) {
        const whole = await post(url, path, body);
        const chunks = await events(url, path, { ...body, stream_options: { include_usage: true } });
        const { byIndex, order, usage } = assemble(chunks);
        assert.deepEqual([...byIndex.keys()].sort(), [0, 1, 2], path);
        for (const c of whole.choices) {
          const got = byIndex.get(c.index)!;
          assert.deepEqual(got.finishes, [c.finish_reason], `${path} choice ${c.index} finishes once`);
          assert.deepEqual({ text: got.text, reasoning: got.reasoning }, said(c), `${path} choice ${c.index}`);
        }
        // Interleaved as generated, not one choice after another.
        const firstEnd = order.lastIndexOf(0);
        assert.ok(order.slice(0, firstEnd).some((i) => i !== 0), `${path}: ${order.join(",")}`);
        assert.deepEqual(usage, whole.usage, `${path}: the usage of all choices`);
        assert.ok(chunks.at(-1)!.usage, "usage rides on the last chunk");
      }
      // openai-node's stream accumulator puts the choices together.
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "none", maxRetries: 0 });
      const [, chat] = cases;
      const final = await client.chat.completions.stream(
        { model: "tiny", ...chat[1] } as unknown as OpenAI.Chat.Completions.ChatCompletionCreateParamsStreaming,
      ).finalChatCompletion();
      const whole = await post(url, "chat/completions", chat[1]);
      assert.deepEqual(
        final.choices.map((c) => [c.index, c.message.content ?? "", c.finish_reason]),
        whole.choices.map((c) => [c.index, c.message!.content ?? "", c.finish_reason]),
      );
      // Several prompts stream too: choice i of prompt j at index j * n + i.
      const prompts = { prompt: ["Once upon", "A long time ago"], max_tokens: 6, temperature: 1, seed: 9, n: 2 };
      const both = await post(url, "completions", prompts);
      const streamed = assemble(await events(url, "completions", prompts));
      assert.deepEqual(
        [...streamed.byIndex.entries()].sort(([a], [b]) => a - b).map(([, e]) => [e.text, e.finishes]),
        both.choices.map((c) => [c.text, [c.finish_reason]]),
      );
    } finally {
      await server.stop();
    }
  },
});

Deno.test({
  name: "penalties, logit_bias and n > 1: the same choices alone and beside other requests, resident and at the floor",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    await using dir = await tempDir();
    const { floor } = await packedFloor(TINY, `${dir.path}/trunk`);
    const knobs = {
      presence_penalty: 0.7,
      frequency_penalty: 0.5,
      repetition_penalty: 1.4,
      logit_bias: { "300": 4, "301": -50 },
    };
    const asked = { prompt: "Once upon a time", max_tokens: 12, temperature: 0.9, seed: 21, n: 3, ...knobs };
    const others = [0, 1, 2].map((k) => ({
      prompt: `Another request ${k} with a longer prompt`,
      max_tokens: 10 + k,
      temperature: 1,
      seed: k,
      ...(k === 1 ? { frequency_penalty: 1.5 } : {}),
    }));
    const answers: string[][] = [];
    for (const [name, flags] of [["resident", []], ["floor", floorFlags(floor)]] as const) {
      const server = await serveTiny(["--parallel", "4", "--state-cache-gb", "0", ...flags]);
      try {
        const alone = await post(server.url, "completions", asked);
        const [batched] = await Promise.all([
          post(server.url, "completions", asked),
          ...others.map((o) => post(server.url, "completions", o)),
        ]);
        const texts = alone.choices.map((c) => c.text!);
        assert.deepEqual(batched.choices.map((c) => c.text), texts, `${name}: alone and batched`);
        answers.push(texts);
      } finally {
        await server.stop();
      }
    }
    assert.deepEqual(answers[1], answers[0], "the floor budget answers as resident");
    // The knobs matter: without them the same seed samples otherwise.
    const server = await serveTiny(["--state-cache-gb", "0"]);
    try {
      const { presence_penalty: _, frequency_penalty: __, repetition_penalty: ___, logit_bias: ____, ...plain } = asked;
      const without = await post(server.url, "completions", plain);
      assert.notDeepEqual(without.choices.map((c) => c.text), answers[0]);
    } finally {
      await server.stop();
    }
  },
});
