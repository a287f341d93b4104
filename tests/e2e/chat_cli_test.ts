/**
 * `k3 chat` driven from stdin: several turns with the state kept give exactly the tokens
 * of one run over the whole conversation; history and state files continue a session;
 * a bad history is refused and left alone.
 *
 * @module
 */

import assert from "node:assert/strict";
import { chatPrompt } from "../../engine/text/chat.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { jsonIds, k3, tempDir, TINY } from "../helpers.ts";

const tiny = Tokenizer.load(TINY);

interface Turn {
  prompt_ids: number[];
  prefilled_tokens: number;
  generated_ids: number[];
  finish_reason: string;
  reasoning: string;
  content: string;
}

async function chat(args: string[], lines: string[], out: string): Promise<Turn[]> {
  const res = await k3(["chat", TINY, "--gen", "5", "--temperature", "0", "--out", out, ...args], {
    stdin: lines.join("\n") + "\n",
  });
  assert.equal(res.code, 0, res.stderr);
  return JSON.parse(await Deno.readTextFile(out)).turns;
}

Deno.test("chat: three turns from stdin equal one run over the whole conversation; only new turns are prefilled", async () => {
  await using d = await tempDir();
  const history = `${d.path}/h.jsonl`;
  const turns = await chat(
    ["--system", "Be brief.", "--history", history],
    ["Hello there", "What next?", "And then?"],
    `${d.path}/r.json`,
  );
  assert.equal(turns.length, 3);
  assert.deepEqual(
    turns[0].prompt_ids,
    chatPrompt(tiny, [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello there" }]),
  );
  for (let i = 1; i < 3; i++) {
    const prev = [...turns[i - 1].prompt_ids, ...turns[i - 1].generated_ids];
    assert.deepEqual(turns[i].prompt_ids.slice(0, prev.length), prev, "the conversation only grows");
    assert.equal(turns[i].prefilled_tokens, turns[i].prompt_ids.length - prev.length + 1, "the new turn only");
  }
  for (const t of turns) {
    const run = await k3(["run", TINY, "--ids", t.prompt_ids.join(","), "--gen", "5", "--json"]);
    assert.deepEqual(jsonIds(run.stdout), t.generated_ids);
    assert.equal(t.finish_reason, "length");
  }
  const saved = (await Deno.readTextFile(history)).trimEnd().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(saved.map((m) => m.role), ["system", "user", "assistant", "user", "assistant", "user", "assistant"]);
  assert.deepEqual(saved.filter((m) => m.role === "assistant").map((m) => m.reasoning), turns.map((t) => t.reasoning));
});

Deno.test("chat: --state continues a session exactly; --history alone re-prefills it; --no-think", async () => {
  await using d = await tempDir();
  const [h, s] = [`${d.path}/h.jsonl`, `${d.path}/c.k3state`];
  const all = await chat([], ["one", "two", "three"], `${d.path}/all.json`);
  await chat(["--history", h, "--state", s], ["one", "two"], `${d.path}/a.json`);
  const res = await k3(
    ["chat", TINY, "--gen", "5", "--temperature", "0", "--history", h, "--state", s, "--out", `${d.path}/b.json`],
    { stdin: "three\n" },
  );
  assert.match(res.stderr, /continuing .*c\.k3state: 4 messages/);
  const third = JSON.parse(await Deno.readTextFile(`${d.path}/b.json`)).turns[0];
  assert.deepEqual(third.prompt_ids, all[2].prompt_ids);
  assert.deepEqual(third.generated_ids, all[2].generated_ids);
  // The history alone: the conversation is rendered from its messages and prefilled.
  const msgs = (await Deno.readTextFile(h)).trimEnd().split("\n").map((l) => JSON.parse(l));
  const re = await chat(["--history", h], ["four"], `${d.path}/c.json`);
  assert.deepEqual(re[0].prompt_ids, chatPrompt(tiny, [...msgs, { role: "user", content: "four" }]));
  assert.equal(re[0].prefilled_tokens, re[0].prompt_ids.length);
  // A state of another conversation is not used.
  const other = await k3(["chat", TINY, "--gen", "2", "--temperature", "0", "--state", s, "--system", "x"], {
    stdin: "hi\n",
  });
  assert.equal(other.code, 0, other.stderr);
  assert.match(other.stderr, /holds another conversation; prefilling the history instead/);
  // --no-think: straight to the response channel, no reasoning kept.
  const nt = await chat(["--no-think", "--history", `${d.path}/nt.jsonl`], ["hi"], `${d.path}/nt.json`);
  assert.deepEqual(nt[0].prompt_ids, chatPrompt(tiny, [{ role: "user", content: "hi" }], { thinking: false }));
  const line = JSON.parse((await Deno.readTextFile(`${d.path}/nt.jsonl`)).split("\n")[1]);
  assert.equal(line.reasoning, undefined);
  assert.equal(line.content, nt[0].content);
});

Deno.test("chat: a history that does not parse is refused (exit 2, FILE:LINE) and never overwritten", async () => {
  await using d = await tempDir();
  const h = `${d.path}/h.jsonl`;
  const bad = '{"role":"user","content":"hi"}\n{"role":"assistant","content":"x","extra":1}\n';
  await Deno.writeTextFile(h, bad);
  const res = await k3(["chat", TINY, "--history", h], { stdin: "hello\n" });
  assert.equal(res.code, 2);
  assert.match(res.stderr, /^k3: .*h\.jsonl:2: unknown field "extra"/m);
  assert.equal(await Deno.readTextFile(h), bad);
  await Deno.writeTextFile(h, '{"role":"user","content":"hi"}\n');
  const sys = await k3(["chat", TINY, "--history", h, "--system", "x"], { stdin: "hello\n" });
  assert.equal(sys.code, 2);
  assert.match(sys.stderr, /--system: .* already holds a conversation/);
  const eff = await k3(["chat", TINY, "--thinking-effort", "medium"], { stdin: "" });
  assert.equal(eff.code, 2);
});

Deno.test("chat: sampling by default (temperature 1, top-p 0.95), the same seed the same replies; /reset", async () => {
  await using d = await tempDir();
  const run = async (seed: string, out: string) => {
    const res = await k3(["chat", TINY, "--gen", "6", "--seed", seed, "--out", out], { stdin: "hi\n/reset\nhi\n" });
    assert.equal(res.code, 0, res.stderr);
    return JSON.parse(await Deno.readTextFile(out));
  };
  const a = await run("3", `${d.path}/a.json`), b = await run("3", `${d.path}/b.json`);
  assert.deepEqual(a.sampling, { temperature: 1, top_p: 0.95, top_k: 0, min_p: 0, seed: 3 });
  assert.deepEqual(a.turns.map((t: Turn) => t.generated_ids), b.turns.map((t: Turn) => t.generated_ids));
  // After /reset the conversation starts over (same prompt), the generator continues.
  assert.deepEqual(a.turns[1].prompt_ids, a.turns[0].prompt_ids);
  const c = await run("4", `${d.path}/c.json`);
  assert.notDeepEqual(c.turns[0].generated_ids, a.turns[0].generated_ids);
});
