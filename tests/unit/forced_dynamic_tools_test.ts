/**
 * Forcing a tool declared only mid-conversation (the released encoder's dynamic
 * declaration: a system or developer message carrying `tools`): `tool_choice` may name it
 * or require a call, the grammar forces a call of it with its own parameters, the reply
 * reader reads the tools channel, and a schema outside the subset is a 400 naming the
 * message that declares it.
 */

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { TINY } from "../helpers.ts";
import { taskTokens } from "../task_tokens.ts";
import { openModel } from "../../engine/open.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { readReply } from "../../engine/text/xtml.ts";
import { offeredTools, parseChatRequest } from "../../cli/openai.ts";
import { ApiError } from "../../cli/openai_error.ts";
import { openaiTask } from "../../cli/request.ts";

const tok = Tokenizer.load(TINY);
const ajv = new Ajv({ strict: false });

const CLOCK = {
  type: "function",
  function: {
    name: "get_time",
    parameters: { type: "object", properties: { zone: { enum: ["UTC", "CET"] } }, required: ["zone"] },
  },
};
const LOOKUP = (schema: Record<string, unknown>) => ({
  type: "function",
  function: { name: "lookup", parameters: schema },
});
const LOOKUP_SCHEMA = {
  type: "object",
  properties: { word: { type: "string", maxLength: 6 }, limit: { type: "integer", minimum: 1, maximum: 9 } },
  required: ["word", "limit"],
};

/** A conversation whose second system message (a developer message) declares `tools`. */
function body(tools: unknown[], extra: Record<string, unknown>): Record<string, unknown> {
  return {
    messages: [
      { role: "user", content: "Hello." },
      { role: "assistant", content: "Hi." },
      { role: "developer", content: "", tools },
      { role: "user", content: "Look up 'cat'." },
    ],
    max_tokens: 200,
    temperature: 0,
    ...extra,
  };
}

Deno.test("forced calls of tools declared mid-conversation: named and required, thinking on and off", async () => {
  const opened = await openModel(TINY, { capacity: 1024, sequences: 1 });
  try {
    const cases: [string, Record<string, unknown>][] = [
      ["named, thinking off", {
        tool_choice: { type: "function", function: { name: "lookup" } },
        chat_template_kwargs: { thinking: false },
      }],
      ["named, thinking on, a budget", {
        tool_choice: { type: "function", function: { name: "lookup" } },
        max_reasoning_tokens: 6,
      }],
      ["required, only dynamic tools", {
        tool_choice: "required",
        parallel_tool_calls: false,
        chat_template_kwargs: { thinking: false },
      }],
    ];
    for (const [name, extra] of cases) {
      const t = openaiTask(parseChatRequest(body([LOOKUP(LOOKUP_SCHEMA)], extra)), {
        tokenizer: tok,
        seed: 0,
        capacity: 1024,
      });
      assert.ok(t.grammar?.kind === "tools", name);
      assert.equal(t.chat!.tools, true, `${name}: the reply reader reads the tools channel`);
      const tokens = await taskTokens(opened.model, tok, t);
      const reply = readReply(tok, tokens, { thinking: t.chat!.thinking, tools: true });
      assert.ok(reply.ended, `${name}: the call completes within max_tokens`);
      assert.equal(reply.calls.length, 1, name);
      assert.equal(reply.calls[0].name, "lookup", name);
      const args = JSON.parse(reply.calls[0].arguments);
      assert.ok(ajv.validate(LOOKUP_SCHEMA, args), `${name}: ${reply.calls[0].arguments}`);
    }
  } finally {
    await opened.close();
  }
});

Deno.test("tools declared mid-conversation: the latest declaration of a name wins; bad choices and schemas are 400s naming them", () => {
  // `tools` declares lookup with a string limit; the developer message declares it again.
  const both = parseChatRequest({
    ...body([LOOKUP(LOOKUP_SCHEMA)], { tool_choice: "required" }),
    tools: [CLOCK, LOOKUP({ type: "object", properties: { limit: { type: "string" } } })],
  });
  assert.deepEqual(
    offeredTools(both).map((o) => [o.tool.name, o.param]),
    [["get_time", "tools[0]"], ["lookup", "messages[2].tools[0]"]],
  );
  assert.deepEqual(offeredTools(both)[1].tool.parameters, LOOKUP_SCHEMA);

  const rejects = (b: Record<string, unknown>, param: string, message: RegExp) =>
    assert.throws(
      () => openaiTask(parseChatRequest(b), { tokenizer: tok, seed: 0, capacity: 1024 }),
      (e) => e instanceof ApiError && e.status === 400 && e.param === param && message.test(e.message),
    );
  rejects(
    body([LOOKUP(LOOKUP_SCHEMA)], { tool_choice: { type: "function", function: { name: "get_time" } } }),
    "tool_choice",
    /"get_time", which neither 'tools' nor a system message's 'tools' declares/,
  );
  rejects(
    body([LOOKUP({ type: "object", properties: { word: { type: "string", format: "hostname" } } })], {
      tool_choice: { type: "function", function: { name: "lookup" } },
    }),
    "messages[2].tools[0].function.parameters.properties.word.format",
    /hostname/,
  );
  // A tool offered by a user message is no declaration: user messages take no tools.
  rejects(
    {
      messages: [{ role: "user", content: "x", tools: [CLOCK] }],
      tool_choice: "required",
    },
    "tool_choice",
    /declares none/,
  );
});
