/**
 * `k3 serve` from the AI SDK's default OpenAI provider, which speaks the Responses API
 * (`POST /v1/responses`): `generateText` and `streamText` against a `k3 serve` process on
 * the tiny model give the text the same greedy request gets from /v1/chat/completions.
 * The packages (`ai`, `@ai-sdk/openai`) are test-only; where they are not installed the
 * test is reported as ignored, never passed.
 */

import assert from "node:assert/strict";
import OpenAI from "openai";
import { serveTiny } from "../helpers.ts";

/** The AI SDK, when installed. */
async function aiSdk() {
  try {
    const [ai, provider] = await Promise.all([import("ai"), import("@ai-sdk/openai")]);
    return { ...ai, createOpenAI: provider.createOpenAI };
  } catch (e) {
    // Not installed: ignored. Anything else (a permission missing) fails the file.
    if (/not found|cannot find|could not (find|resolve)/i.test(String(e))) return undefined;
    throw e;
  }
}
const sdk = await aiSdk();

Deno.test({
  name: "the AI SDK's default provider (Responses API): generateText and streamText equal the chat answer",
  ignore: sdk === undefined,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { generateText, streamText, createOpenAI } = sdk!;
    const KEY = "ai-sdk-key";
    const server = await serveTiny(["--context", "1024"], { env: { K3_API_KEY: KEY } });
    const url = server.url;
    try {
      const prompt = "What is the capital of France?";
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEY, maxRetries: 0 });
      const chat = await client.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: prompt }],
        max_tokens: 24,
        temperature: 0,
      });
      const openai = createOpenAI({ baseURL: `${url}/v1`, apiKey: KEY });
      const opts = { model: openai("tiny"), prompt, maxOutputTokens: 24, temperature: 0, maxRetries: 0 };
      const whole = await generateText(opts);
      assert.equal(whole.text, chat.choices[0].message.content);
      assert.equal(whole.usage.outputTokens, chat.usage?.completion_tokens);
      let text = "";
      for await (const piece of streamText(opts).textStream) text += piece;
      assert.equal(text, chat.choices[0].message.content);
    } finally {
      await server.stop();
    }
  },
});
