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
import { jsonIds, k3, ROOT, tempDir, TINY } from "../helpers.ts";
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
        const value = JSON.parse(s.generated_text.replace(/\[EOS\]$/, ""));
        assert.ok(ajv.validate(schema, value), `${s.generated_text}: ${ajv.errorsText()}`);
        validated++;
      }
    }
  }
  assert.ok(validated >= 2, `only ${validated} of 4 runs finished within 300 tokens`);
});

Deno.test("k3 run: a schema outside the subset is a usage error naming the keyword (exit 2)", async () => {
  await using dir = await tempDir();
  const file = `${dir.path}/s.json`;
  await Deno.writeTextFile(file, JSON.stringify({ type: "string", pattern: "^a+$" }));
  const r = await k3(["run", TINY, "--prompt", "x", "--json-schema", file]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /^k3: --json-schema .*s\.json: 'pattern': the keyword "pattern" is refused/m);
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
              schema: { type: "object", properties: { a: { type: "string", format: "email" } } },
            },
          },
        }),
        (e: { status: number; param?: string; message: string }) =>
          e.status === 400 && e.param === "response_format.json_schema.schema.properties.a.format" &&
          /"format" is not supported/.test(e.message),
      );
    } finally {
      child.kill("SIGTERM");
      while (!(await reader.read()).done);
      await child.status;
    }
  },
});
