/**
 * LangChain.js and the OpenAI Agents SDK for JS (pinned in package.json) against a real
 * `k3 serve` on the tiny model, as their users write them: zod 4 schemas (`.int()`,
 * `.email()`, `.min()`, `.regex()`, optionals, nullables, enums, nested arrays) through
 * LangChain's `withStructuredOutput` (its default, response_format, and function calling)
 * and the Agents SDK's `outputType` (chat completions and responses models), a tool-using
 * Agents SDK turn (a forced call whose top-level string argument has a pattern), and
 * LangChain's `useResponsesApi` second turn (the first turn's output, reasoning included,
 * fed back). Every object a client hands back validates with ajv against the schema it
 * sent (and with zod: the SDKs parsed it).
 *
 * The SDKs run in a child (tests/sdk_clients_child.ts): they read the environment and the
 * home directory, which the test permissions do not grant. The tiny model has random
 * weights: it thinks without end, so thinking is turned off the way each client can carry
 * it, and its strings and arrays go on until the grammar ends them, so the schema bounds them.
 */

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { ChatOpenAI } from "@langchain/openai";
import type { SdkResult } from "../sdk_clients_child.ts";
import { Contact } from "../client_schemas.ts";
import { ROOT, runCmd, serveTiny } from "../helpers.ts";

// Formats are checked by the patterns zod writes beside them, and by zod itself.
const ajv = new Ajv({ strict: false, validateFormats: false });

type Json = Record<string, unknown>;

/** Asserts `value` validates against the schema sent (ajv) and is a Contact (zod). */
function validates(sent: Json, value: unknown, what: string): void {
  const { $schema: _, ...schema } = sent; // ajv here reads draft 7
  assert.ok(ajv.validate(schema, value), `${what}: ${JSON.stringify(value)}: ${ajv.errorsText()}`);
  assert.ok(Contact.safeParse(value).success, `${what}: ${JSON.stringify(value)}`);
}

/** Runs `fn` with the URL of a `k3 serve` on the tiny model, then stops it. */
async function withServe(fn: (url: string) => Promise<void>): Promise<void> {
  const server = await serveTiny(["--parallel", "2", "--context", "4096"]);
  try {
    await fn(server.url);
  } finally {
    await server.stop();
  }
}

/** The results of tests/sdk_clients_child.ts for `sdk` against `url`, each checked: no error, objects validate. */
async function sdkResults(url: string, sdk: "langchain" | "agents"): Promise<SdkResult[]> {
  const out = await runCmd(Deno.execPath(), [
    "run",
    "--allow-env",
    "--allow-sys=homedir",
    "--allow-read",
    "--allow-net=127.0.0.1",
    `${ROOT}/tests/sdk_clients_child.ts`,
    url,
    sdk,
  ], { seconds: 900 });
  assert.equal(out.code, 0, out.stderr);
  const results: SdkResult[] = JSON.parse(out.stdout);
  for (const r of results) {
    assert.equal(r.error, undefined, `${r.what}: ${r.error}; the server's last answer: ${r.lastAnswer}`);
    validates(r.schema!, r.output, `${sdk} ${r.what}`);
  }
  return results;
}

const TEST = { sanitizeOps: false, sanitizeResources: false };

Deno.test({
  ...TEST,
  name: "LangChain withStructuredOutput (zod 4): response_format and function calling; objects validate (ajv)",
  fn: () =>
    withServe(async (url) => {
      const results = await sdkResults(url, "langchain");
      assert.deepEqual(results.map((r) => r.what), [
        "jsonSchema at temperature 0",
        "jsonSchema at temperature 1",
        "functionCalling at temperature 0",
        "functionCalling at temperature 1",
      ]);
      // The function-calling schema went out as a forced tool, its strings written raw.
      for (const r of results) assert.ok(JSON.stringify(r.schema).includes('"pattern"'), r.what);
    }),
});

Deno.test({
  ...TEST,
  name: "Agents SDK: outputType (zod 4) on chat completions and responses models; a tool-using turn; outputs validate",
  fn: () =>
    withServe(async (url) => {
      const results = await sdkResults(url, "agents");
      assert.deepEqual(results.map((r) => r.what), [
        "chat at temperature 0",
        "chat at temperature 1",
        "responses at temperature 0",
        "responses at temperature 1",
        "chat after the tool",
        "responses after the tool",
      ]);
      for (const r of results.filter((r) => r.tool)) {
        assert.equal(r.tool!.calls.length, 1, `${r.what}: one call of the tool`);
        const { $schema: _, ...params } = r.tool!.schema;
        assert.match(JSON.stringify(params), /"pattern"/, "the tool's string argument has a pattern");
        assert.ok(ajv.validate(params, r.tool!.calls[0]), `${r.what}: ${JSON.stringify(r.tool!.calls)}`);
      }
    }),
});

Deno.test({
  ...TEST,
  name: "LangChain useResponsesApi: a second turn feeds the first's output (reasoning included) back",
  fn: () =>
    withServe(async (url) => {
      const bodies: Json[] = [];
      const chat = new ChatOpenAI({
        model: "tiny",
        apiKey: "none",
        configuration: {
          baseURL: `${url}/v1`,
          fetch: (input, init) => {
            if (typeof init?.body === "string") bodies.push(JSON.parse(init.body));
            return fetch(input, init);
          },
        },
        useResponsesApi: true,
        maxTokens: 24,
        maxRetries: 0,
        temperature: 0,
      });
      const first = await chat.invoke("Question one?");
      const second = await chat.invoke([
        { role: "user", content: "Question one?" },
        first,
        { role: "user", content: "Question two?" },
      ]);
      // The second turn is answered (the tiny model thinks through its 24 tokens: incomplete).
      assert.equal(second.response_metadata.status, "incomplete");
      const input = bodies[1].input as { type?: string; role?: string }[];
      assert.ok(input.some((i) => i.type === "reasoning"), `the reasoning goes back: ${JSON.stringify(input)}`);
      assert.equal(input.at(-1)?.role, "user");
    }),
});
