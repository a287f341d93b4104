/**
 * One draw for every mode, end to end (issue 35): a seeded, sampled request constrained
 * by `response_format` gets the same answer from `k3 serve` with `logprobs` (and
 * `top_logprobs`) on or off, thinking included.
 *
 * @module
 */

import assert from "node:assert/strict";
import { serveTiny } from "../helpers.ts";

const SCHEMA = {
  type: "object",
  properties: { city: { type: "string", maxLength: 12 }, n: { type: "integer" } },
  required: ["city", "n"],
};

Deno.test("serve: a seeded constrained request answers the same with logprobs on or off", async () => {
  const server = await serveTiny([]);
  try {
    const ask = async (extra: Record<string, unknown>) => {
      const res = await fetch(`${server.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          messages: [{ role: "user", content: "Name a city." }],
          max_tokens: 40,
          temperature: 1,
          seed: 7,
          response_format: { type: "json_schema", json_schema: { name: "c", schema: SCHEMA } },
          ...extra,
        }),
      });
      const body = await res.json();
      assert.equal(res.status, 200, JSON.stringify(body));
      const m = body.choices[0].message;
      return { content: m.content, reasoning: m.reasoning_content ?? null, tokens: body.usage.completion_tokens };
    };
    const plain = await ask({});
    for (const extra of [{ logprobs: true }, { logprobs: true, top_logprobs: 3 }]) {
      assert.deepEqual(await ask(extra), plain, JSON.stringify(extra));
    }
  } finally {
    await server.stop();
  }
});
