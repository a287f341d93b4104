/**
 * One draw for every mode, end to end (issue 35): a seeded, sampled request constrained
 * by `response_format` (or `--json-schema`) gets the same answer with `logprobs` (and
 * `top_logprobs`) on or off and speculation on or off, thinking included: from
 * `k3 serve`, from `k3 batch` and from `k3 run`.
 *
 * @module
 */

import assert from "node:assert/strict";
import { jsonIds, k3, serveTiny, tempDir, TINY } from "../helpers.ts";

const SCHEMA = {
  type: "object",
  properties: { city: { type: "string", maxLength: 12 }, n: { type: "integer" } },
  required: ["city", "n"],
};

/** The chat body every request sends, `extra` merged in. */
const batchBody = (extra: Record<string, unknown>) => ({
  messages: [{ role: "user", content: "Name a city." }],
  max_tokens: 40,
  temperature: 1,
  seed: 7,
  response_format: { type: "json_schema", json_schema: { name: "c", schema: SCHEMA } },
  ...extra,
});

Deno.test("serve: a seeded constrained request answers the same with logprobs or speculation on or off", async () => {
  const answers: unknown[] = [];
  for (const draft of ["suffix", "off"]) {
    const server = await serveTiny(["--draft", draft]);
    try {
      for (const extra of [{}, { logprobs: true }, { logprobs: true, top_logprobs: 3 }]) {
        const res = await fetch(`${server.url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(batchBody(extra)),
        });
        const body = await res.json();
        assert.equal(res.status, 200, JSON.stringify(body));
        const m = body.choices[0].message;
        answers.push({
          content: m.content,
          reasoning: m.reasoning_content ?? null,
          tokens: body.usage.completion_tokens,
        });
      }
    } finally {
      await server.stop();
    }
  }
  assert.equal(answers.length, 6);
  for (const a of answers) assert.deepEqual(a, answers[0]);
});

Deno.test("batch: seeded constrained lines answer the same with logprobs or speculation on or off", async () => {
  await using dir = await tempDir();
  const modes: Record<string, Record<string, unknown>> = {
    plain: {},
    logprobs: { logprobs: true },
    top: { logprobs: true, top_logprobs: 3 },
  };
  const input = `${dir.path}/in.jsonl`;
  await Deno.writeTextFile(
    input,
    Object.entries(modes).map(([id, extra]) =>
      JSON.stringify({ custom_id: id, method: "POST", url: "/v1/chat/completions", body: batchBody(extra) })
    ).join("\n") + "\n",
  );
  const answers: Record<string, unknown>[] = [];
  for (const draft of ["suffix", "off"]) {
    const output = `${dir.path}/out-${draft}.jsonl`;
    const res = await k3(["batch", TINY, "--input", input, "--output", output, "--parallel", "3", "--draft", draft]);
    assert.equal(res.code, 0, res.stderr);
    const lines = (await Deno.readTextFile(output)).trim().split("\n").map((l) => JSON.parse(l));
    for (const line of lines) {
      const body = line.response.body;
      assert.equal(line.response.status_code, 200, JSON.stringify(body));
      const m = body.choices[0].message;
      answers.push({
        content: m.content,
        reasoning: m.reasoning_content ?? null,
        tokens: body.usage.completion_tokens,
      });
    }
  }
  assert.equal(answers.length, 6);
  for (const a of answers) assert.deepEqual(a, answers[0]);
});

Deno.test("run: a seeded constrained run gives the same tokens with --json or not and speculation on or off", async () => {
  await using dir = await tempDir();
  const schema = `${dir.path}/schema.json`;
  await Deno.writeTextFile(schema, JSON.stringify(SCHEMA));
  const base = ["run", TINY, "--prompt", "Name a city.", "--gen", "30", "--temperature", "1", "--seed", "7"];
  const runs: { ids: number[]; text: string }[] = [];
  for (const draft of ["suffix", "off"]) {
    const json = await k3([...base, "--json-schema", schema, "--draft", draft, "--json"]);
    assert.equal(json.code, 0, json.stderr);
    const summary = JSON.parse(json.stdout.trimEnd().split("\n").at(-1)!);
    runs.push({ ids: jsonIds(json.stdout), text: summary.generated_text });
    const text = await k3([...base, "--json-schema", schema, "--draft", draft]);
    assert.equal(text.code, 0, text.stderr);
    assert.equal(text.stdout.trimEnd(), summary.generated_text.trimEnd(), `--draft ${draft}: the text of the ids`);
  }
  assert.deepEqual(runs[1], runs[0]);
  assert.ok(runs[0].ids.length > 0);
});
