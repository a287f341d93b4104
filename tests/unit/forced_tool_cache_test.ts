/**
 * The state cache across a forced-tool loop, through serve's task path on the tiny model:
 * with `tool_choice` required the tool-choice note is rendered after the messages, so the
 * state after the note is never a prefix of the next step; the state at the end of the
 * messages is, and each step reuses everything but its new messages (the reply sent back
 * and the tool results), its note and its generation prompt.
 */

import assert from "node:assert/strict";
import { TINY } from "../helpers.ts";
import { openModel } from "../../engine/open.ts";
import { Scheduler } from "../../engine/generate/scheduler.ts";
import { chatCachePoints, StateCache } from "../../engine/generate/state_cache.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { chatPromptParts, messageBoundaries } from "../../engine/text/chat.ts";
import { parseChatRequest } from "../../cli/openai.ts";
import { chatOptions } from "../../cli/request.ts";
import { runTask, serveTask } from "../../cli/server/tasks.ts";

const tok = Tokenizer.load(TINY);
const CAPACITY = 2048;
const TOOLS = [{
  type: "function",
  function: {
    name: "lookup",
    parameters: {
      type: "object",
      properties: { q: { type: "string", maxLength: 8 } },
      required: ["q"],
    },
  },
}];

Deno.test("forced-tool loop: each step's cached tokens cover all but its new messages", async () => {
  const opened = await openModel(TINY, { capacity: CAPACITY, sequences: 2 });
  try {
    const cache = new StateCache(opened.model, { ramBytes: 1e9 });
    const engine = {
      scheduler: new Scheduler(opened.model, { maxSequences: 2, cache }),
      tokenizer: tok,
      capacity: CAPACITY,
      vocabSize: opened.model.cfg.vocabSize,
      bytesRead: () => 0,
      stateCache: cache,
    };
    const messages: Record<string, unknown>[] = [{ role: "user", content: "Look three things up, one at a time." }];
    let previousEnd = 0, previousIds: number[] = [];
    for (let step = 0; step < 3; step++) {
      const body = {
        messages,
        tools: TOOLS,
        tool_choice: "required",
        parallel_tool_calls: false,
        max_tokens: 300,
        temperature: 0,
        chat_template_kwargs: { thinking: false },
      };
      const { task } = serveTask(engine, "chat", body, ["tiny"]);
      const { ids, messages: span } = chatPromptParts(
        tok,
        parseChatRequest(body).messages,
        chatOptions(parseChatRequest(body)),
      );
      assert.deepEqual(task.promptIds, ids);
      assert.deepEqual(task.messages, span);
      const messagesEnd = span.end;
      // The note and the generation prompt come after the messages.
      assert.ok(tok.decode(ids.slice(messagesEnd)).startsWith('<|open|>message role="system" type="tool-choice"'));
      const o = await runTask(engine, task, new AbortController().signal, () => {}, () => {});
      if (step > 0) {
        // Everything up to the previous step's messages was kept: only the new messages
        // (the reply and its result), the note and the generation prompt are prefilled.
        assert.equal(o.result.cachedTokens, previousEnd, `step ${step + 1}`);
        assert.deepEqual(task.promptIds.slice(0, previousEnd), previousIds.slice(0, previousEnd));
      }
      previousEnd = messagesEnd;
      previousIds = ids;
      const calls = o.reply.calls;
      assert.equal(calls.length, 1, `step ${step + 1}: ${o.text}`);
      messages.push(
        {
          role: "assistant",
          content: null,
          tool_calls: calls.map((c) => ({
            id: c.id,
            type: "function",
            function: { name: c.name, arguments: c.arguments },
          })),
        },
        { role: "tool", tool_call_id: calls[0].id, content: `result ${step + 1}` },
      );
    }
  } finally {
    await opened.close();
  }
});

Deno.test("state cache points: after the first message (not the notes before it), at the end of the messages", () => {
  const body = {
    messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }],
    tools: TOOLS,
    tool_choice: "required",
  };
  const r = parseChatRequest(body);
  const { ids, messages } = chatPromptParts(tok, r.messages, chatOptions(r));
  const bounds = messageBoundaries(tok, ids);
  // The tool declaration, the effort note, the system and user messages, the tool-choice note.
  assert.equal(bounds.length, 5);
  assert.deepEqual(messages, { start: bounds[1], end: bounds[3] });
  const points = chatCachePoints(tok, ids, { thinking: true }, undefined, messages);
  assert.deepEqual(points.cacheAt, [bounds[2], bounds[3], bounds[4]]);
});
