/**
 * Structured output through the commands on the tiny model: `k3 run --json-schema` and
 * `--grammar json` give the same tokens resident and at the floor budget, on 1 and 2
 * threads; `k3 batch` OpenAI lines with response_format give the same replies alone and
 * 8 at a time; `k3 serve` answers response_format through the official openai SDK; every
 * finished reply validates against its schema (ajv).
 */

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import OpenAI from "openai";
import { jsonIds, k3, ROOT, serveTiny, tempDir, TINY } from "../helpers.ts";
import { K3_PERMISSIONS } from "../../cli/permissions.ts";

const ajv = new Ajv({ strict: false });
const FLOOR = ["--trunk-gb", "0.0003", "--cache-gb", "0.0001"];

const SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 6 },
    n: { type: "integer" },
    tags: { type: "array", items: { enum: ["a", "b", "c"] }, maxItems: 3 },
    ok: { type: ["boolean", "null"] },
  },
  required: ["name", "n", "tags"],
  additionalProperties: false,
};

/** The run's summary (last stdout line of --json). */
function summary(stdout: string): { generated_ids: number[]; generated_text: string; finish_reason: string } {
  const lines = stdout.trimEnd().split("\n");
  return JSON.parse(lines[lines.length - 1]);
}

Deno.test("k3 run --json-schema / --grammar json: same tokens resident and at the floor, 1 and 2 threads; output validates", async () => {
  await using dir = await tempDir();
  const schemaFile = `${dir.path}/schema.json`;
  await Deno.writeTextFile(schemaFile, JSON.stringify(SCHEMA));
  let validated = 0;
  for (const [grammar, schema] of [[["--json-schema", schemaFile], SCHEMA], [["--grammar", "json"], true]] as const) {
    for (const sampling of [[], ["--temperature", "1", "--seed", "7"]]) {
      const base = ["run", TINY, "--prompt", "Once upon a time", "--gen", "300", "--json", ...grammar, ...sampling];
      const runs = await Promise.all([
        k3([...base, "--threads", "1"]),
        k3([...base, "--threads", "2"]),
        k3([...base, ...FLOOR, "--threads", "1"]),
        k3([...base, ...FLOOR, "--threads", "2"]),
      ]);
      for (const r of runs) assert.equal(r.code, 0, r.stderr);
      const ids = runs.map((r) => jsonIds(r.stdout));
      for (const other of ids.slice(1)) assert.deepEqual(other, ids[0]);
      const s = summary(runs[0].stdout);
      if (s.finish_reason === "stop") {
        // The end id ends the text without being part of it.
        const value = JSON.parse(s.generated_text);
        assert.ok(ajv.validate(schema, value), `${s.generated_text}: ${ajv.errorsText()}`);
        validated++;
      }
    }
  }
  assert.ok(validated >= 2, `only ${validated} of 4 runs finished within 300 tokens`);
  // Plain text output: the value, a newline, no end id.
  const plain = await k3(["run", TINY, "--prompt", "x", "--gen", "300", "--grammar", "json"]);
  assert.equal(plain.code, 0, plain.stderr);
  assert.doesNotMatch(plain.stdout, /\[EOS\]|<\|end_of_msg\|>/);
  JSON.parse(plain.stdout);
});

Deno.test("k3 run: a schema outside the subset is a usage error naming the keyword (exit 2)", async () => {
  await using dir = await tempDir();
  const file = `${dir.path}/s.json`;
  await Deno.writeTextFile(file, JSON.stringify({ type: "string", pattern: "^(a)\\1$" }));
  const r = await k3(["run", TINY, "--prompt", "x", "--json-schema", file]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /^k3: --json-schema .*s\.json: 'pattern': the escape \\1 .* is not supported/m);
  const g = await k3(["run", TINY, "--prompt", "x", "--grammar", "yaml"]);
  assert.equal(g.code, 2);
  assert.match(g.stderr, /--grammar must be json/);
});

/** Eight OpenAI chat lines with response_format, greedy and sampled. */
function lines(): string {
  return Array.from({ length: 8 }, (_, i) =>
    JSON.stringify({
      custom_id: `r${i}`,
      method: "POST",
      url: "/v1/chat/completions",
      body: {
        messages: [{ role: "user", content: `Describe item ${i} as JSON.` }],
        chat_template_kwargs: { thinking: false },
        max_tokens: 250,
        ...(i % 2 === 0 ? { temperature: 0 } : { temperature: 1, seed: 100 + i }),
        response_format: i % 4 === 3
          ? { type: "json_object" }
          : { type: "json_schema", json_schema: { name: "item", schema: SCHEMA, strict: true } },
      },
    })).join("\n") + "\n";
}

type BatchLine = {
  custom_id: string;
  response: { body: { choices: { message: { content: string }; finish_reason: string }[] } };
};

async function batch(dir: string, name: string, extra: string[]): Promise<Map<string, BatchLine>> {
  const out = `${dir}/${name}.jsonl`;
  const r = await k3(["batch", TINY, "--input", `${dir}/in.jsonl`, "--output", out, ...extra]);
  assert.equal(r.code, 0, r.stderr);
  const parsed = (await Deno.readTextFile(out)).trim().split("\n").map((l) => JSON.parse(l) as BatchLine);
  return new Map(parsed.map((l) => [l.custom_id, l]));
}

Deno.test("k3 batch: response_format lines give the same replies alone and 8 at a time, resident and at the floor; replies validate", async () => {
  await using dir = await tempDir();
  await Deno.writeTextFile(`${dir.path}/in.jsonl`, lines());
  const alone = await batch(dir.path, "alone", ["--parallel", "1"]);
  const eight = await batch(dir.path, "eight", ["--parallel", "8"]);
  const floor = await batch(dir.path, "floor", ["--parallel", "8", ...FLOOR]);
  assert.equal(alone.size, 8);
  let validated = 0;
  for (const [id, line] of alone) {
    const choice = line.response.body.choices[0];
    assert.deepEqual(eight.get(id)!.response.body.choices[0], choice, id);
    assert.deepEqual(floor.get(id)!.response.body.choices[0], choice, id);
    if (choice.finish_reason === "stop") {
      const value = JSON.parse(choice.message.content);
      const schema = Number(id.slice(1)) % 4 === 3 ? { type: "object" } : SCHEMA;
      assert.ok(ajv.validate(schema, value), `${id}: ${choice.message.content}: ${ajv.errorsText()}`);
      validated++;
    }
  }
  assert.ok(validated >= 4, `only ${validated} of 8 replies finished`);
});

Deno.test({
  name: "k3 serve: response_format json_schema through the openai SDK validates; a refused keyword is a 400 naming it",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", ...K3_PERMISSIONS, `${ROOT}/main.ts`, "serve", TINY, "--port", "0", "--parallel", "2"],
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    let stderr = "";
    const dec = new TextDecoder();
    const reader = child.stderr.getReader();
    while (!/k3: ready: (http:\/\/127\.0\.0\.1:\d+)\/v1/.test(stderr)) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`serve ended: ${stderr}`);
      stderr += dec.decode(value, { stream: true });
    }
    const url = /k3: ready: (http:\/\/127\.0\.0\.1:\d+)\/v1/.exec(stderr)![1];
    try {
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "none", maxRetries: 0 });
      const r = await client.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: "An item as JSON." }],
        max_tokens: 250,
        temperature: 0,
        // @ts-ignore: vLLM's field, passed through
        chat_template_kwargs: { thinking: false },
        response_format: { type: "json_schema", json_schema: { name: "item", schema: SCHEMA, strict: true } },
      });
      const choice = r.choices[0];
      if (choice.finish_reason === "stop") {
        assert.ok(ajv.validate(SCHEMA, JSON.parse(choice.message.content!)), choice.message.content!);
      } else assert.equal(choice.finish_reason, "length");
      await assert.rejects(
        client.chat.completions.create({
          model: "tiny",
          messages: [{ role: "user", content: "x" }],
          response_format: {
            type: "json_schema",
            json_schema: {
              name: "x",
              schema: { type: "object", properties: { a: { type: "string", format: "hostname" } } },
            },
          },
        }),
        (e: { status: number; param?: string; message: string }) =>
          e.status === 400 && e.param === "response_format.json_schema.schema.properties.a.format" &&
          /format "hostname" is not supported/.test(e.message),
      );
    } finally {
      child.kill("SIGTERM");
      while (!(await reader.read()).done);
      await child.status;
    }
  },
});

/** A tool whose arguments the grammar bounds: every forced call fits in FORCED_MAX_TOKENS. */
const WEATHER = {
  type: "function" as const,
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", maxLength: 8 },
        unit: { enum: ["celsius", "fahrenheit"] },
        days: { type: "integer" },
      },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
};
const CLOCK = {
  type: "function" as const,
  function: {
    name: "get_time",
    parameters: {
      type: "object",
      properties: { zone: { enum: ["UTC", "CET"] } },
      required: ["zone"],
      additionalProperties: false,
    },
  },
};
/**
 * Tokens a forced call can take at most with thinking off: the markup around the call, and
 * arguments whose every part the grammar bounds (whitespace runs of 32, a string of 8
 * characters of at most 6 bytes each, 16 integer digits); each token is at least one byte
 * or one markup symbol. Well over that, so a forced call always finishes.
 */
const FORCED_MAX_TOKENS = 1200;
/** vLLM's chat_template_kwargs, which the SDK passes through (a spread: its types do not declare it). */
const THINKING_OFF: Record<string, unknown> = { chat_template_kwargs: { thinking: false } };

Deno.test({
  name:
    "k3 serve: tool_choice named and required force a call on the tiny model (thinking off); arguments validate (ajv)",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const server = await serveTiny(["--parallel", "2"]);
    try {
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
      const schemas = new Map([WEATHER, CLOCK].map((t) => [t.function.name, t.function.parameters]));
      const cases = [
        { tool_choice: { type: "function" as const, function: { name: "get_weather" } }, temperature: 0 },
        { tool_choice: { type: "function" as const, function: { name: "get_time" } }, temperature: 1, seed: 3 },
        { tool_choice: "required" as const, temperature: 0 },
        { tool_choice: "required" as const, temperature: 1, seed: 11 },
      ];
      for (const c of cases) {
        const r = await client.chat.completions.create({
          model: "tiny",
          messages: [{ role: "user", content: "What is the weather in Oslo?" }],
          tools: [WEATHER, CLOCK],
          parallel_tool_calls: false,
          max_tokens: FORCED_MAX_TOKENS,
          ...THINKING_OFF,
          ...c,
        });
        const choice = r.choices[0];
        const what = JSON.stringify(c);
        assert.equal(choice.finish_reason, "tool_calls", what);
        assert.equal(choice.message.content, null, what);
        const calls = choice.message.tool_calls!;
        assert.equal(calls.length, 1, what);
        const call = calls[0] as { id: string; function: { name: string; arguments: string } };
        if (typeof c.tool_choice === "object") assert.equal(call.function.name, c.tool_choice.function.name);
        const schema = schemas.get(call.function.name);
        assert.ok(schema, `${what}: a call of ${call.function.name}`);
        const args = JSON.parse(call.function.arguments);
        assert.ok(ajv.validate(schema, args), `${what}: ${call.function.arguments}: ${ajv.errorsText()}`);
        assert.match(call.id, /\S/);
      }
      // Streamed: the SDK assembles the same call from the deltas.
      const stream = await client.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: "What is the weather in Oslo?" }],
        tools: [WEATHER, CLOCK],
        tool_choice: { type: "function", function: { name: "get_weather" } },
        parallel_tool_calls: false,
        max_tokens: FORCED_MAX_TOKENS,
        temperature: 0,
        stream: true,
        ...THINKING_OFF,
      });
      let args = "", name = "", finish = "";
      for await (const chunk of stream) {
        const d = chunk.choices[0];
        for (const t of d?.delta.tool_calls ?? []) {
          assert.equal(t.index, 0, "one call (parallel_tool_calls false)");
          name += t.function?.name ?? "", args += t.function?.arguments ?? "";
        }
        if (d?.finish_reason) finish = d.finish_reason;
      }
      assert.equal(finish, "tool_calls");
      assert.equal(name, "get_weather");
      assert.ok(ajv.validate(WEATHER.function.parameters, JSON.parse(args)), args);
    } finally {
      await server.stop();
    }
  },
});
