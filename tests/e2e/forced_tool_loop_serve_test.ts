/**
 * A multi-step forced-tool loop through the openai SDK against a `k3 serve` process on the
 * tiny model, thinking on (the default budget closes each reply's think channel): every
 * step's `cached_tokens` covers all of the previous step's messages, so only the new
 * messages (the reply sent back and its result), the tool-choice note and the generation
 * prompt are prefilled; every call validates (ajv).
 */

import assert from "node:assert/strict";
import { Ajv } from "ajv";
import OpenAI from "openai";
import { serveTiny, TINY } from "../helpers.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { chatPromptParts } from "../../engine/text/chat.ts";
import { parseChatRequest } from "../../cli/openai.ts";
import { chatOptions } from "../../cli/request.ts";

const tok = Tokenizer.load(TINY);
const PARAMS = {
  type: "object",
  properties: { q: { type: "string", maxLength: 8 } },
  required: ["q"],
  additionalProperties: false,
};
const TOOLS: OpenAI.Chat.Completions.ChatCompletionTool[] = [
  { type: "function", function: { name: "lookup", parameters: PARAMS } },
];

Deno.test({
  name: "k3 serve: a forced-tool loop with thinking on reuses all but each step's new messages (cached_tokens)",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const server = await serveTiny(["--context", "4096"]);
    try {
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
      const messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [
        { role: "user", content: "Look three things up, one at a time." },
      ];
      let previousEnd = 0;
      for (let step = 1; step <= 3; step++) {
        const body = {
          model: "tiny",
          messages,
          tools: TOOLS,
          tool_choice: "required" as const,
          parallel_tool_calls: false,
          max_tokens: 500,
          temperature: 0,
        };
        const r = await client.chat.completions.create(body);
        const request = parseChatRequest(JSON.parse(JSON.stringify(body)));
        const { ids, messages: span } = chatPromptParts(tok, request.messages, chatOptions(request));
        assert.equal(r.usage?.prompt_tokens, ids.length, `step ${step}: the prompt rendered here`);
        if (step > 1) assert.equal(r.usage?.prompt_tokens_details?.cached_tokens, previousEnd, `step ${step}`);
        previousEnd = span!.end;
        const choice = r.choices[0];
        assert.equal(choice.finish_reason, "tool_calls", `step ${step}`);
        assert.ok(((choice.message as { reasoning_content?: string }).reasoning_content ?? "") !== "", "thinking on");
        const call = choice.message.tool_calls![0] as OpenAI.Chat.Completions.ChatCompletionMessageFunctionToolCall;
        assert.ok(new Ajv().validate(PARAMS, JSON.parse(call.function.arguments)), call.function.arguments);
        // The reply goes back as the SDK hands it over (reasoning_content included), then its result.
        messages.push(choice.message, { role: "tool", tool_call_id: call.id, content: `result ${step}` });
      }
    } finally {
      await server.stop();
    }
  },
});
