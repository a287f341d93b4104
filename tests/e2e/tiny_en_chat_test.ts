/**
 * `k3 chat` on the trained English tiny model: the chat template's added tokens are in
 * its vocabulary at K3's ids, so a turn is the template's prompt and the reply is the
 * model's greedy continuation of it (it continues text; it was never taught to answer).
 *
 * @module
 */

import assert from "node:assert/strict";
import { chatPrompt } from "../../engine/text/chat.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { jsonIds, k3, tempDir, TINY_EN } from "../helpers.ts";

Deno.test("chat on tiny-en: the template's prompt ids, a reply of words equal to run's greedy tokens", async () => {
  await using d = await tempDir();
  const out = `${d.path}/turns.json`;
  const res = await k3(["chat", TINY_EN, "--gen", "16", "--temperature", "0", "--out", out], {
    stdin: "Tell me about the weather.\n",
  });
  assert.equal(res.code, 0, res.stderr);
  const [turn] = JSON.parse(await Deno.readTextFile(out)).turns;
  const tok = Tokenizer.load(TINY_EN);
  assert.deepEqual(turn.prompt_ids, chatPrompt(tok, [{ role: "user", content: "Tell me about the weather." }]));
  assert.ok(turn.generated_ids.every((id: number) => id < 768), "only ordinary tokens: no template token is made up");
  assert.match(tok.decode(turn.generated_ids), /[a-z]+ [a-z]+/, "English-like words");
  const run = await k3(["run", TINY_EN, "--ids", turn.prompt_ids.join(","), "--gen", "16", "--json"]);
  assert.deepEqual(jsonIds(run.stdout), turn.generated_ids);
});
