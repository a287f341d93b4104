/**
 * Batch line formats: chat messages, per-line sampling, seeds and stops, and the OpenAI
 * Batch API in and out; seeded sampling independent of batch composition.
 *
 * @module
 */

import assert from "node:assert/strict";
import { chatPrompt } from "../../engine/text/chat.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { jsonIds, k3, tempDir, TINY } from "../helpers.ts";

const tiny = Tokenizer.load(TINY);

// deno-lint-ignore no-explicit-any
type Line = any;

async function batch(
  dir: string,
  lines: unknown[],
  args: string[] = [],
): Promise<{ code: number; stderr: string; out: Line[] }> {
  const input = `${dir}/in.jsonl`, output = `${dir}/out.jsonl`;
  await Deno.writeTextFile(input, lines.map((l) => typeof l === "string" ? l : JSON.stringify(l)).join("\n") + "\n");
  const res = await k3(["batch", TINY, "--input", input, "--output", output, ...args]);
  const text = await Deno.readTextFile(output).catch(() => "");
  return {
    code: res.code,
    stderr: res.stderr,
    out: text.trimEnd().split("\n").filter((l) => l).map((l) => JSON.parse(l)),
  };
}

const byId = (out: Line[]) => new Map(out.map((r) => [r.custom_id ?? r.id, r]));

Deno.test("batch: a line's seed gives the same tokens alone or among others, and as k3 run", async () => {
  const line = { id: "s", ids: [5, 17, 300, 42], gen: 8, seed: 9, temperature: 0.8, top_p: 0.9 };
  const others = [1, 2, 3].map((i) => ({ id: `o${i}`, ids: [i, i + 1], gen: 3 + i, seed: i, temperature: 1 }));
  await using a = await tempDir();
  await using b = await tempDir();
  const alone = await batch(a.path, [line], ["--parallel", "1"]);
  const mixed = await batch(b.path, [...others.slice(0, 2), line, others[2]], ["--parallel", "4"]);
  assert.equal(alone.code, 0, alone.stderr);
  assert.equal(mixed.code, 0, mixed.stderr);
  const s1 = byId(alone.out).get("s"), s2 = byId(mixed.out).get("s");
  assert.deepEqual(s2.generated_ids, s1.generated_ids);
  const run = await k3([
    "run",
    TINY,
    "--ids",
    "5,17,300,42",
    "--gen",
    "8",
    "--seed",
    "9",
    "--temperature",
    "0.8",
    "--top-p",
    "0.9",
    "--json",
  ]);
  assert.deepEqual(jsonIds(run.stdout), s1.generated_ids);
  assert.equal(s1.settings.sampling.temperature, 0, "settings record the flags' sampling");
  // The flags' sampling applies to lines without their own.
  await using c = await tempDir();
  const flags = await batch(c.path, [{ id: 1, ids: [5, 17, 300, 42], gen: 8 }], [
    "--temperature",
    "0.8",
    "--top-p",
    "0.9",
    "--seed",
    "9",
  ]);
  assert.deepEqual(flags.out[0].generated_ids, s1.generated_ids);
});

Deno.test("batch: messages lines render the chat template; stop strings cut; bad fields refused per line", async () => {
  await using d = await tempDir();
  const msgs = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }];
  const res = await batch(d.path, [
    { id: "c", messages: msgs, gen: 6 },
    { id: "n", messages: msgs, gen: 6, thinking: false },
    { id: "bad1", messages: [{ role: "bot", content: "x" }] },
    { id: "bad2", ids: [1], thinking: true },
    { id: "bad3", ids: [1], temperature: -1 },
    { id: "bad4", ids: [1], stop: [""] },
  ]);
  assert.equal(res.code, 1);
  assert.match(res.stderr, /in\.jsonl:3: "messages": message 1: "role"/);
  assert.match(res.stderr, /in\.jsonl:4: "thinking" and "effort" go with "messages"/);
  assert.match(res.stderr, /in\.jsonl:5: .*temperature/);
  assert.match(res.stderr, /in\.jsonl:6: "stop" must be/);
  const out = byId(res.out);
  const c = out.get("c"), n = out.get("n");
  assert.deepEqual(c.prompt_ids, chatPrompt(tiny, msgs as never));
  assert.deepEqual(n.prompt_ids, chatPrompt(tiny, msgs as never, { thinking: false }));
  const run = await k3(["run", TINY, "--ids", c.prompt_ids.join(","), "--gen", "6", "--json"]);
  assert.deepEqual(jsonIds(run.stdout), c.generated_ids);
  assert.equal(typeof c.reasoning, "string");
  assert.equal(c.content, "");
  assert.equal(n.reasoning, "");
  assert.equal(n.content, n.generated_text);
  // A stop string taken from a greedy line's text cuts it there.
  const whole = n.generated_text as string;
  const stop = whole.slice(2, 4);
  await using e = await tempDir();
  const cut = await batch(e.path, [{ id: "n", messages: msgs, gen: 6, thinking: false, stop }]);
  assert.equal(cut.out[0].generated_text, whole.slice(0, whole.indexOf(stop)));
  assert.equal(cut.out[0].finish_reason, "stop");
});

Deno.test("batch: OpenAI Batch API lines in, Batch output lines out; 400s answered; resume by custom_id", async () => {
  await using d = await tempDir();
  const lines = [
    {
      custom_id: "chat-1",
      method: "POST",
      url: "/v1/chat/completions",
      body: { model: "kimi-k3", messages: [{ role: "user", content: "Hi" }], max_tokens: 5, temperature: 0 },
    },
    {
      custom_id: "cmpl-1",
      method: "POST",
      url: "/v1/completions",
      body: { model: "kimi-k3", prompt: "Once upon a time", max_tokens: 4, temperature: 0, stop: ["never-here"] },
    },
    { custom_id: "bad-body", method: "POST", url: "/v1/chat/completions", body: { messages: [] } },
    { custom_id: "bad-url", method: "POST", url: "/v1/embeddings", body: {} },
    {
      custom_id: "nothink",
      method: "POST",
      url: "/v1/chat/completions",
      body: {
        messages: [{ role: "user", content: "Hi" }],
        max_completion_tokens: 3,
        seed: 4,
        chat_template_kwargs: { thinking: false },
      },
    },
  ];
  const res = await batch(d.path, lines);
  assert.equal(res.code, 1, "the bad url line is malformed");
  assert.match(res.stderr, /in\.jsonl:4: "url" must be one of/);
  const out = byId(res.out);
  assert.deepEqual([...out.keys()].sort(), ["bad-body", "chat-1", "cmpl-1", "nothink"]);
  for (const r of out.values()) {
    assert.match(r.id, /^batch_req_/);
    assert.equal(r.error, null);
    assert.equal(typeof r.response.request_id, "string");
  }
  const bad = out.get("bad-body").response;
  assert.equal(bad.status_code, 400);
  assert.equal(bad.body.error.param, "messages");
  const chat = out.get("chat-1").response;
  assert.equal(chat.status_code, 200);
  assert.equal(chat.body.object, "chat.completion");
  assert.equal(chat.body.model, "kimi-k3");
  const prompt = chatPrompt(tiny, [{ role: "user", content: "Hi" }]);
  assert.deepEqual(chat.body.usage, {
    prompt_tokens: prompt.length,
    completion_tokens: 5,
    total_tokens: prompt.length + 5,
    prompt_tokens_details: { cached_tokens: 0 },
  });
  assert.equal(chat.body.choices[0].finish_reason, "length");
  const ids = jsonIds((await k3(["run", TINY, "--ids", prompt.join(","), "--gen", "5", "--json"])).stdout);
  assert.equal(chat.body.choices[0].message.reasoning_content, tiny.decode(ids), "greedy: the same tokens as k3 run");
  const cmpl = out.get("cmpl-1").response.body;
  assert.equal(cmpl.object, "text_completion");
  const ref = await k3(["run", TINY, "--prompt", "Once upon a time", "--gen", "4", "--json"]);
  const refText = JSON.parse(ref.stdout.trimEnd().split("\n").at(-1)!).generated_text;
  assert.equal(cmpl.choices[0].text, refText);
  const nt = out.get("nothink").response.body;
  assert.equal(nt.choices[0].message.reasoning_content, null);
  assert.equal(nt.usage.completion_tokens, 3);
  // A rerun skips every custom_id already answered.
  const again = await batch(d.path, lines);
  assert.match(again.stderr, /4 already in/);
  assert.equal(again.out.length, 4);
});
