/**
 * Log probabilities on the tiny model: `k3 run --json` gives each token's float64
 * log-softmax of the logits it dumps, with the same bits resident and at the floor
 * budget; a batch line's completions `logprobs` equal them; masked (-Infinity) logits
 * never appear among the alternatives.
 */

import assert from "node:assert/strict";
import { tokenLogprob } from "../../engine/generate/logprobs.ts";
import { floorFlags, jsonIds, k3, packedFloor, tempDir, TINY } from "../helpers.ts";

/** log-softmax in float64, written out here (not the engine's code). */
function logSoftmax(row: Float32Array, id: number): number {
  const xs = Array.from(row);
  const m = Math.max(...xs);
  let s = 0;
  for (const x of xs) s += Math.exp(x - m);
  return (row[id] - m) - Math.log(s);
}

const tokenLines = (stdout: string) =>
  stdout.trimEnd().split("\n").map((l) => JSON.parse(l)).filter((o) => o.index !== undefined && o.id !== null);

Deno.test("k3 run --json: logprob per token = float64 log-softmax of the dumped logits, same bits at the floor", async () => {
  await using d = await tempDir();
  const dump = `${d.path}/logits.f32`;
  const args = ["run", TINY, "--ids", "5,6,7,8", "--gen", "6", "--json", "--temperature", "0.9", "--seed", "3"];
  const resident = await k3([...args, "--dump-logits", dump]);
  assert.equal(resident.code, 0, resident.stderr);
  const lines = tokenLines(resident.stdout);
  const raw = await Deno.readFile(dump);
  const logits = new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
  const vocab = logits.length / lines.length;
  lines.forEach((l, i) => {
    assert.equal(l.logprob, logSoftmax(logits.subarray(i * vocab, (i + 1) * vocab), l.id), `step ${i}`);
  });
  const { floor } = await packedFloor(TINY, `${d.path}/trunk`, 4096);
  const floored = await k3([
    ...args,
    ...floorFlags(floor),
  ]);
  assert.equal(floored.code, 0, floored.stderr);
  assert.deepEqual(jsonIds(floored.stdout), jsonIds(resident.stdout));
  assert.deepEqual(tokenLines(floored.stdout).map((l) => l.logprob), lines.map((l) => l.logprob));

  // A batch line asking completions logprobs gets the same numbers, and the alternatives.
  const input = `${d.path}/in.jsonl`, output = `${d.path}/out.jsonl`;
  await Deno.writeTextFile(
    input,
    JSON.stringify({
      custom_id: "lp",
      method: "POST",
      url: "/v1/completions",
      body: { prompt: [5, 6, 7, 8], max_tokens: 6, temperature: 0.9, seed: 3, logprobs: 3 },
    }) + "\n",
  );
  const b = await k3(["batch", TINY, "--input", input, "--output", output]);
  assert.equal(b.code, 0, b.stderr);
  const body = JSON.parse((await Deno.readTextFile(output)).trim()).response.body;
  const lp = body.choices[0].logprobs;
  assert.deepEqual(lp.token_logprobs, lines.map((l) => l.logprob));
  assert.equal(lp.top_logprobs.length, lines.length);
  for (const top of lp.top_logprobs) assert.equal(Object.keys(top).length <= 3, true);
});

Deno.test("tokenLogprob: masked ids are -Infinity and never among the alternatives; ties to the lower id", () => {
  const l = new Float32Array([1, 3, -Infinity, 3, 2, -Infinity]);
  const r = tokenLogprob(l, 4, 6);
  assert.deepEqual(r.top.map((t) => t.id), [1, 3, 4, 0]);
  assert.equal(tokenLogprob(l, 2, 0).logprob, -Infinity);
  assert.equal(r.logprob, logSoftmax(l, 4));
  assert.equal(r.top[0].logprob, r.top[1].logprob);
});
