/**
 * `--draft lookup|suffix|off` on `k3 batch` and `k3 serve`: speculation never changes a
 * token or a logit (greedy and seeded, several sequences sharing passes), and a bad value
 * is one line, exit 2, before anything loads or listens.
 */

import assert from "node:assert/strict";
import { k3, serveTiny, tempDir, TINY, TINY_EN } from "../helpers.ts";

/** Prompts whose text repeats (so suffix and lookup drafts exist on the trained tiny
 * model), greedy and seeded. */
function workload(): string {
  const texts = [
    "Once upon a time there was a little girl. Once upon a time there was",
    "The cat sat on the mat. The cat sat on the",
    "One, two, three. One, two, three. One, two,",
  ];
  const lines = [];
  for (let i = 0; i < 6; i++) {
    const sampling = i % 2 ? { temperature: 0.9, seed: 100 + i } : {};
    lines.push(JSON.stringify({ id: `p${i}`, prompt: texts[i % 3], gen: 40, ...sampling }));
  }
  return lines.join("\n") + "\n";
}

Deno.test("batch --draft: off, lookup and suffix give the same tokens (greedy and seeded, 3 at a time)", async () => {
  await using dir = await tempDir();
  const input = `${dir.path}/p.jsonl`;
  await Deno.writeTextFile(input, workload());
  const ids: Record<string, string[]> = {};
  for (const mode of ["off", "lookup", "suffix"]) {
    const out = `${dir.path}/${mode}.jsonl`;
    const r = await k3(["batch", TINY_EN, "--input", input, "--output", out, "--parallel", "3", "--draft", mode]);
    assert.equal(r.code, 0, r.stderr);
    const m = r.stderr.match(/speculation \((\w+)\): (\d+) of (\d+) draft tokens accepted/);
    assert.ok(m, r.stderr);
    assert.equal(m[1], mode);
    if (mode === "off") assert.equal(m[3], "0");
    else assert.ok(Number(m[3]) > 0, `${mode}: no draft token was run (${r.stderr})`);
    ids[mode] = (await Deno.readTextFile(out)).trimEnd().split("\n").map((l) => {
      const j = JSON.parse(l);
      return `${j.id}:${j.generated_ids.join(",")}`;
    }).sort();
  }
  assert.equal(ids.off.length, 6);
  assert.deepEqual(ids.lookup, ids.off);
  assert.deepEqual(ids.suffix, ids.off);
});

Deno.test("--draft: a bad value is one line and exit 2 (batch, serve, run)", async () => {
  await using dir = await tempDir();
  const input = `${dir.path}/p.jsonl`;
  await Deno.writeTextFile(input, '{"id": 1, "ids": [1]}\n');
  for (
    const args of [
      ["batch", TINY, "--input", input, "--output", `${dir.path}/r.jsonl`, "--draft", "yes"],
      ["serve", TINY, "--port", "0", "--draft", "yes"],
      ["run", TINY, "--ids", "1", "--draft", "yes"],
    ]
  ) {
    const r = await k3(args);
    assert.equal(r.code, 2, `${args[0]}: ${r.stderr}`);
    assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
    assert.match(r.stderr, /--draft: expected one of lookup, suffix, off, got "yes"/);
  }
  const serveBadParallel = await k3(["serve", TINY, "--port", "0", "--parallel", "many"]);
  assert.equal(serveBadParallel.code, 2, serveBadParallel.stderr);
  assert.match(serveBadParallel.stderr, /--parallel/);
});

/** One completion's tokens and logprobs (the logits' log-softmax at each chosen token). */
async function complete(url: string, body: Record<string, unknown>): Promise<unknown> {
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ max_tokens: 32, logprobs: 3, ...body }),
  });
  assert.equal(r.status, 200);
  const j = await r.json();
  return { text: j.choices[0].text, logprobs: j.choices[0].logprobs };
}

Deno.test({
  name: "serve --draft: off and suffix answer with the same tokens and logprobs, alone and side by side",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const prompts = ["abc abc abc abc ab", "the cat the cat the cat the", "1 2 3 1 2 3 1 2"];
    const answers: Record<string, unknown[]> = {};
    for (const mode of ["off", "suffix"]) {
      const server = await serveTiny(["--draft", mode, "--parallel", "3"]);
      try {
        // Three at once (their passes shared), then the same again with a seed.
        const greedy = await Promise.all(prompts.map((prompt) => complete(server.url, { prompt, temperature: 0 })));
        const seeded = await Promise.all(
          prompts.map((prompt, i) => complete(server.url, { prompt, temperature: 0.8, seed: 7 + i })),
        );
        answers[mode] = [...greedy, ...seeded];
      } finally {
        assert.equal((await server.stop()).code, 0);
      }
    }
    assert.deepEqual(answers.suffix, answers.off);
  },
});
