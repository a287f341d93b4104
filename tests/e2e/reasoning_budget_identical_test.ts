/**
 * Forced calls and constrained output, thinking on with a reasoning budget (and off), are
 * the same replies at every memory budget, thread count, batch size and kernel build (ISA),
 * with speculation on and off: `k3 batch` runs the same OpenAI chat lines on the trained
 * tiny model (tests/fixtures/tiny-en, whose repeated text lets drafts be accepted) every
 * way and every reply equals the first run's. Each reply completes and validates (ajv).
 */

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { LOOKUP } from "../client_schemas.ts";
import { floorFlags, k3, packedFloor, ROOT, tempDir, TINY_EN } from "../helpers.ts";
import { probeCpuFlags } from "../../engine/native/libpath.ts";

const ajv = new Ajv({ strict: false });

const TOOLS = [
  { type: "function", function: { name: "lookup", parameters: LOOKUP } },
  {
    type: "function",
    function: {
      name: "get_time",
      parameters: { type: "object", properties: { zone: { enum: ["UTC", "CET"] } }, required: ["zone"] },
    },
  },
];
const SCHEMAS: Record<string, object> = {
  lookup: LOOKUP,
  get_time: TOOLS[1].function.parameters,
};
const NAMED = { type: "function", function: { name: "lookup" } };
const FORMAT = { type: "json_schema", json_schema: { name: "lookup", schema: LOOKUP, strict: true } };
const SEEDED = { temperature: 1, seed: 5 };

/** The lines: forced calls and formats, thinking on (budgets given and the default) and off. */
const BODIES: Record<string, Record<string, unknown>> = {
  named: { tools: TOOLS, tool_choice: NAMED, max_reasoning_tokens: 6, temperature: 0 },
  required: { tools: TOOLS, tool_choice: "required", parallel_tool_calls: false, max_reasoning_tokens: 10, ...SEEDED },
  format: { response_format: FORMAT, max_reasoning_tokens: 4, temperature: 0 },
  format_default_budget: { response_format: FORMAT, ...SEEDED },
  format_budget_0: { response_format: FORMAT, max_reasoning_tokens: 0, ...SEEDED, seed: 9 },
  named_thinking_off: { tools: TOOLS, tool_choice: NAMED, chat_template_kwargs: { thinking: false }, ...SEEDED },
};

function lines(): string {
  return Object.entries(BODIES).map(([id, body]) =>
    JSON.stringify({
      custom_id: id,
      method: "POST",
      url: "/v1/chat/completions",
      body: {
        messages: [{ role: "user", content: "Once upon a time there was a cat. Look up the word cat." }],
        max_tokens: 400,
        ...body,
      },
    })
  ).join("\n") + "\n";
}

interface Choice {
  message: { content: string | null; reasoning_content?: string; tool_calls?: { id?: string; function: unknown }[] };
  finish_reason: string;
}

/** Runs the lines with `flags` (and `env`): each line's choice (call ids, which are random,
 * left out) and usage, by custom_id; and the speculation summary's draft tokens run. */
async function run(dir: string, name: string, flags: string[], env?: Record<string, string>) {
  const out = `${dir}/${name}.jsonl`;
  const r = await k3(["batch", TINY_EN, "--input", `${dir}/in.jsonl`, "--output", out, ...flags], { env });
  assert.equal(r.code, 0, `${name}: ${r.stderr}`);
  const drafted = Number(/speculation \(\w+\): \d+ of (\d+) draft tokens accepted/.exec(r.stderr)?.[1]);
  const replies = new Map<string, { choice: Choice; usage: unknown }>();
  for (const l of (await Deno.readTextFile(out)).trim().split("\n")) {
    const line = JSON.parse(l);
    const body = line.response.body;
    const choice: Choice = body.choices[0];
    for (const c of choice.message.tool_calls ?? []) delete c.id;
    replies.set(line.custom_id, { choice, usage: body.usage });
  }
  return { replies, drafted };
}

Deno.test("forced calls and formats, thinking on with a budget: the same replies at every budget, thread count, ISA, draft mode", async () => {
  await using d = await tempDir();
  await Deno.writeTextFile(`${d.path}/in.jsonl`, lines());
  const { floor } = await packedFloor(TINY_EN, `${d.path}/trunk`);
  const want = await run(d.path, "reference", ["--parallel", "1", "--threads", "1", "--draft", "off"]);

  // Every reply completes (the budget leaves the constrained part room) and validates.
  assert.equal(want.replies.size, Object.keys(BODIES).length);
  for (const [id, { choice }] of want.replies) {
    const calls = choice.message.tool_calls as { function: { name: string; arguments: string } }[] | undefined;
    if (id.startsWith("named") || id === "required") {
      assert.equal(choice.finish_reason, "tool_calls", id);
      assert.equal(calls!.length, 1, id);
      const { name, arguments: args } = calls![0].function;
      if (id.startsWith("named")) assert.equal(name, "lookup", id);
      assert.ok(ajv.validate(SCHEMAS[name], JSON.parse(args)), `${id}: ${args}`);
    } else {
      assert.equal(choice.finish_reason, "stop", id);
      assert.ok(ajv.validate(LOOKUP, JSON.parse(choice.message.content!)), `${id}: ${choice.message.content}`);
    }
    // A budget of 0 closes the think channel before its first token.
    const reasons = id !== "named_thinking_off" && id !== "format_budget_0";
    assert.equal((choice.message.reasoning_content ?? "") !== "", reasons, id);
  }

  const ways: [string, string[], Record<string, string>?][] = [
    ["6 at a time, 2 threads, suffix drafts", ["--parallel", "6", "--threads", "2", "--draft", "suffix"]],
    ["3 at a time, lookup drafts", ["--parallel", "3", "--threads", "1", "--draft", "lookup"]],
    ["the floor budget, 2 threads, suffix drafts", [...floorFlags(floor), "--parallel", "6", "--threads", "2"]],
  ];
  const cpu = probeCpuFlags(`${ROOT}/kernels/build/libk3.so`);
  for (const isa of ["scalar", "avx2", "avx512"]) {
    if (isa === "avx2" && !cpu.has("avx2")) continue;
    if (isa === "avx512" && !cpu.has("avx512bw")) continue;
    ways.push([`the ${isa} build, 2 threads, suffix drafts`, ["--parallel", "6", "--threads", "2"], {
      K3_LIB: `${ROOT}/kernels/build/libk3-${isa}.so`,
    }]);
  }
  let drafted = 0;
  for (const [i, [name, flags, env]] of ways.entries()) {
    const got = await run(d.path, `way${i}`, flags, env);
    for (const [id, reply] of want.replies) assert.deepEqual(got.replies.get(id), reply, `${name}: ${id}`);
    drafted += got.drafted;
  }
  assert.ok(drafted > 0, "speculation ran draft tokens");
});
