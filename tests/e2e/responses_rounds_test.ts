/**
 * Responses round trips through openai-node's `responses.stream()` (its accumulator reads
 * every event): a three-turn conversation continued by `previous_response_id`, then by
 * feeding `response.output` back (reasoning items among them) with an `item_reference`;
 * stored responses are per API key and `store: false` stores nothing. The AI SDK's default
 * responses provider (store on) sends a second turn's history as `item_reference` items.
 *
 * The server is the real one on loopback; its scheduler plays scripted replies that think
 * first (the tiny model has random weights), recording each prompt.
 */

import assert from "node:assert/strict";
import OpenAI from "openai";
import { generateText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import type { SequenceRequest, SequenceResult } from "../../engine/generate/scheduler.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { TINY } from "../helpers.ts";
import { endsAt, madeUpResult, replyPieces, withLoopbackServer } from "../loopback_server.ts";

const tok = Tokenizer.load(TINY);
const { text: t, open, close } = replyPieces(tok);
const VOCAB = 1024;

/** A reply that thinks `reasoning`, then answers `text`. */
const thinkingReply = (reasoning: string, text: string) => [
  ...t(reasoning),
  ...close("think"),
  ...open("response"),
  ...t(text),
  ...close("response"),
  ...close("message"),
];

/** Plays the next script; records each prompt. */
class ScriptedScheduler {
  readonly prompts: string[] = [];
  readonly scripts: number[][] = [];
  queued = 0;
  active = 0;
  submit(req: SequenceRequest): Promise<SequenceResult> {
    this.prompts.push(tok.decode(req.prompt));
    const script = this.scripts.shift();
    if (!script) return Promise.reject(new Error("no script left"));
    const tokens: number[] = [];
    let finishReason: SequenceResult["finishReason"] = "length";
    for (const id of script) {
      tokens.push(id);
      const logits = new Float32Array(VOCAB);
      logits[id] = 1;
      if (endsAt(req, id, logits)) {
        finishReason = "stop";
        break;
      }
    }
    return madeUpResult(req, tokens, finishReason);
  }
}

Deno.test("responses.stream(): three turns by previous_response_id, then output fed back with an item_reference", async () => {
  const s = new ScriptedScheduler();
  await withLoopbackServer({ scheduler: s, tokenizer: tok, vocabSize: VOCAB }, async (origin) => {
    const baseURL = `${origin}/v1`;
    const client = new OpenAI({ baseURL, apiKey: "alice" });
    const turn = async (params: OpenAI.Responses.ResponseCreateParamsStreaming) => {
      const stream = client.responses.stream(params);
      const deltas: string[] = [];
      stream.on("response.output_text.delta", (e) => deltas.push(e.delta));
      const final = await stream.finalResponse();
      assert.equal(deltas.join(""), final.output_text);
      return final;
    };
    s.scripts.push(thinkingReply("Think one.", "Answer one."));
    const r1 = await turn({ model: "tiny", input: "Question one?", instructions: "Be brief.", stream: true });
    const reasoning = r1.output.find((i) => i.type === "reasoning") as OpenAI.Responses.ResponseReasoningItem;
    assert.deepEqual(reasoning.content, [{ type: "reasoning_text", text: "Think one." }]);
    assert.equal(r1.output_text, "Answer one.");
    assert.equal((r1 as { store?: boolean }).store, true);

    s.scripts.push(thinkingReply("Think two.", "Answer two."));
    const r2 = await turn({ model: "tiny", input: "Question two?", previous_response_id: r1.id, stream: true });
    assert.equal(r2.previous_response_id, r1.id);
    const p2 = s.prompts[1];
    for (const want of ["Question one?", "Answer one.", "Question two?"]) assert.ok(p2.includes(want), p2);
    assert.ok(!p2.includes("Be brief."), "instructions are not carried over");
    assert.ok(p2.indexOf("Answer one.") < p2.indexOf("Question two?"));

    s.scripts.push(thinkingReply("Think three.", "Answer three."));
    const message2 = r2.output.find((i) => i.type === "message")!;
    const r3 = await turn({
      model: "tiny",
      input: [
        { role: "user", content: "Question one?" },
        ...r1.output as OpenAI.Responses.ResponseInputItem[],
        { role: "user", content: "Question two?" },
        { type: "item_reference", id: message2.id! },
        { role: "user", content: "Question three?" },
      ],
      stream: true,
    });
    assert.equal(r3.output_text, "Answer three.");
    const p3 = s.prompts[2];
    for (const want of ["Question one?", "Answer one.", "Question two?", "Answer two.", "Question three?"]) {
      assert.ok(p3.includes(want), p3);
    }

    // Another key sees none of alice's responses; store: false keeps nothing.
    const bob = new OpenAI({ baseURL, apiKey: "bob" });
    await assert.rejects(
      bob.responses.create({ model: "tiny", input: "x", previous_response_id: r1.id }),
      (e: { status: number }) => e.status === 404,
    );
    await assert.rejects(
      bob.responses.create({ model: "tiny", input: [{ type: "item_reference", id: message2.id! }] }),
      (e: { status: number }) => e.status === 400,
    );
    s.scripts.push(thinkingReply("T.", "A."));
    const unstored = await client.responses.create({ model: "tiny", input: "x", store: false });
    assert.equal((unstored as { store?: boolean }).store, false);
    await assert.rejects(
      client.responses.create({ model: "tiny", input: "y", previous_response_id: unstored.id }),
      (e: { status: number }) => e.status === 404,
    );
  });
});

Deno.test("AI SDK default provider (responses): three turns, each sending the earlier output as item_reference items, resolved", async () => {
  const s = new ScriptedScheduler();
  await withLoopbackServer({ scheduler: s, tokenizer: tok, vocabSize: VOCAB }, async (origin) => {
    const bodies: Record<string, unknown>[] = [];
    const openai = createOpenAI({
      baseURL: `${origin}/v1`,
      apiKey: "none",
      fetch: (input, init) => {
        if (typeof init?.body === "string") bodies.push(JSON.parse(init.body));
        return fetch(input, init);
      },
    });
    // The provider's default model speaks the Responses API, with store on.
    const model = openai("tiny");
    s.scripts.push(thinkingReply("Think one.", "Answer one."));
    const first = await generateText({ model, prompt: "Question one?" });
    assert.equal(first.text, "Answer one.");
    s.scripts.push(thinkingReply("Think two.", "Answer two."));
    const second = await generateText({
      model,
      messages: [
        { role: "user", content: "Question one?" },
        ...first.response.messages,
        { role: "user", content: "Question two?" },
      ],
    });
    assert.equal(second.text, "Answer two.");
    s.scripts.push(thinkingReply("Think three.", "Answer three."));
    const third = await generateText({
      model,
      messages: [
        { role: "user", content: "Question one?" },
        ...first.response.messages,
        { role: "user", content: "Question two?" },
        ...second.response.messages,
        { role: "user", content: "Question three?" },
      ],
    });
    assert.equal(third.text, "Answer three.");
    for (const turn of [1, 2]) {
      const input = bodies[turn].input as { type?: string }[];
      assert.equal(input.filter((i) => i.type === "item_reference").length >= turn, true, JSON.stringify(input));
    }
    const p2 = s.prompts[1];
    for (const want of ["Question one?", "Answer one.", "Question two?"]) assert.ok(p2.includes(want), p2);
    const p3 = s.prompts[2];
    const turns = ["Question one?", "Answer one.", "Question two?", "Answer two.", "Question three?"];
    for (const want of turns) assert.ok(p3.includes(want), p3);
    const at = turns.map((t) => p3.indexOf(t));
    assert.deepEqual(at, [...at].sort((a, b) => a - b), "in conversation order");
  });
});
