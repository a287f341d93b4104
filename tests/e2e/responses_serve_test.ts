/**
 * Three-turn Responses conversations against a real `k3 serve` on the tiny model: through
 * openai-node's `responses.stream()` (continued by `previous_response_id`, then by feeding
 * `response.output` back, reasoning items included) and through the AI SDK's default
 * provider (the Responses API, store on: earlier output sent as `item_reference` items).
 * Each turn's streamed text equals its final response, and each turn reads the whole
 * conversation (its input tokens grow). The scripted-reply versions of these rounds, which
 * check what each prompt holds, are in responses_rounds_test.ts.
 */

import assert from "node:assert/strict";
import OpenAI from "openai";
import { generateText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { serveTiny } from "../helpers.ts";

Deno.test({
  name: "responses.stream() and the AI SDK's default provider: three turns each against k3 serve",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const server = await serveTiny(["--context", "2048"]);
    try {
      const baseURL = `${server.url}/v1`;
      const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0 });
      const turn = async (params: Omit<OpenAI.Responses.ResponseCreateParamsStreaming, "model" | "stream">) => {
        const stream = client.responses.stream({
          model: "tiny",
          max_output_tokens: 24,
          temperature: 0,
          ...params,
          stream: true,
        });
        const deltas: string[] = [];
        stream.on("response.output_text.delta", (e) => deltas.push(e.delta));
        const final = await stream.finalResponse();
        assert.equal(deltas.join(""), final.output_text);
        return final;
      };
      // Thinking on (the tiny model thinks through its 24 tokens), then off, so both kinds of output go back.
      const r1 = await turn({ input: "Question one?" });
      assert.ok(r1.output.some((i) => i.type === "reasoning"), JSON.stringify(r1.output));
      const r2 = await turn({ input: "Question two?", previous_response_id: r1.id, reasoning: { effort: "none" } });
      const r3 = await turn({
        input: [
          { role: "user", content: "Question one?" },
          ...r1.output as OpenAI.Responses.ResponseInputItem[],
          { role: "user", content: "Question two?" },
          ...r2.output as OpenAI.Responses.ResponseInputItem[],
          { role: "user", content: "Question three?" },
        ],
        reasoning: { effort: "none" },
      });
      // Turns 2 and 3 read the conversation: more than the question alone (thinking off, as they are).
      const alone = await turn({ input: "Question two?", reasoning: { effort: "none" }, store: false });
      const read = [alone, r2, r3].map((r) => r.usage!.input_tokens);
      assert.ok(read[0] < read[1] && read[1] < read[2], `input tokens ${read}`);

      const bodies: Record<string, unknown>[] = [];
      const openai = createOpenAI({
        baseURL,
        apiKey: "none",
        fetch: (input, init) => {
          if (typeof init?.body === "string") bodies.push(JSON.parse(init.body));
          return fetch(input, init);
        },
      });
      const opts = { model: openai("tiny"), maxOutputTokens: 24, temperature: 0, maxRetries: 0 };
      const messages: Parameters<typeof generateText>[0]["messages"] & object = [];
      const inputs: number[] = [];
      for (const question of ["Question one?", "Question two?", "Question three?"]) {
        messages.push({ role: "user", content: question });
        const result = await generateText({ ...opts, messages });
        messages.push(...result.response.messages);
        inputs.push(result.usage.inputTokens!);
      }
      assert.ok(inputs[0] < inputs[1] && inputs[1] < inputs[2], `input tokens ${inputs}`);
      const refs = bodies.map((b) =>
        (b.input as { type?: string }[]).filter((i) => i.type === "item_reference").length
      );
      assert.equal(refs[0], 0);
      assert.ok(refs[1] > 0 && refs[2] > refs[1], `item_reference items per turn: ${refs}`);
    } finally {
      await server.stop();
    }
  },
});
