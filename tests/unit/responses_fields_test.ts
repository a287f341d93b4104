/**
 * `/v1/responses` refuses a field named like an Object prototype member (`constructor`,
 * `toString`, `__proto__`) as it refuses any unknown field (issue 35).
 */

import assert from "node:assert/strict";
import { chatBodyOfResponses } from "../../cli/server/responses.ts";
import { ApiError } from "../../cli/openai_error.ts";

Deno.test("responses: prototype-named fields are unknown fields (400, unknown_parameter, param named)", () => {
  for (const key of ["constructor", "toString", "__proto__", "hasOwnProperty", "valueOf"]) {
    const body = JSON.parse(`{"input":"hi",${JSON.stringify(key)}:1}`);
    assert.throws(() => chatBodyOfResponses(body), (e: unknown) => {
      assert.ok(e instanceof ApiError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.code, "unknown_parameter");
      assert.equal(e.param, key);
      return true;
    }, key);
  }
  assert.equal(
    (chatBodyOfResponses({ input: "hi", max_output_tokens: 5 }) as Record<string, unknown>)
      .max_completion_tokens,
    5,
  );
});
