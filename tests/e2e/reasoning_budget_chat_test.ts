/**
 * `k3 chat --reasoning-budget N` on the tiny model: every reply's think channel is closed
 * with forced markup after N tokens (the random-weight model never closes it by itself),
 * turn after turn in the kept state, and the reply goes on in its response channel.
 *
 * @module
 */

import assert from "node:assert/strict";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { k3, tempDir, TINY } from "../helpers.ts";

const tok = Tokenizer.load(TINY);
const CLOSING = tok.encode("<|close|>think<|sep|><|open|>response<|sep|>", { allowSpecial: true });

interface Turn {
  generated_ids: number[];
  reasoning: string;
  content: string;
}

async function turns(args: string[], out: string): Promise<Turn[]> {
  const res = await k3(["chat", TINY, "--gen", "24", "--temperature", "0", "--out", out, ...args], {
    stdin: "Hello there\nAnd then?\n",
  });
  assert.equal(res.code, 0, res.stderr);
  return JSON.parse(await Deno.readTextFile(out)).turns;
}

Deno.test("chat --reasoning-budget: each turn's think channel closes after N tokens; the reply goes on in its response", async () => {
  await using d = await tempDir();
  const BUDGET = 5;
  const budgeted = await turns(["--reasoning-budget", String(BUDGET)], `${d.path}/budget.json`);
  const free = await turns([], `${d.path}/free.json`);
  assert.equal(budgeted.length, 2);
  for (const [i, t] of budgeted.entries()) {
    assert.deepEqual(t.generated_ids.slice(BUDGET, BUDGET + CLOSING.length), CLOSING, `turn ${i + 1}`);
    assert.equal(t.reasoning, tok.decode(t.generated_ids.slice(0, BUDGET)), `turn ${i + 1}`);
    assert.ok(t.generated_ids.length > BUDGET + CLOSING.length, `turn ${i + 1}: a response follows`);
    // Without the budget the same model is still reasoning there.
    assert.notDeepEqual(free[i].generated_ids.slice(BUDGET, BUDGET + CLOSING.length), CLOSING);
  }
  // The first reply's tokens before the budget ran out are the free reply's (greedy, same prompt).
  assert.deepEqual(budgeted[0].generated_ids.slice(0, BUDGET), free[0].generated_ids.slice(0, BUDGET));
  // --no-think: no think channel, nothing to close.
  const plain = await turns(["--no-think"], `${d.path}/plain.json`);
  const noThink = await turns(["--no-think", "--reasoning-budget", "0"], `${d.path}/nothink.json`);
  assert.deepEqual(noThink.map((t) => t.generated_ids), plain.map((t) => t.generated_ids));

  const bad = await k3(["chat", TINY, "--reasoning-budget", "-3"], { stdin: "" });
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /--reasoning-budget: expected a whole number of tokens, got "-3"/);
});
