/**
 * The plan by predicted tokens/s through the CLI: `k3 batch --preset auto --parallel auto`
 * on a packed trunk measures the rates, prints the prediction and the choice, and the tokens
 * are those of the resident run; `k3 serve --parallel auto` takes the plan's number.
 */

import assert from "node:assert/strict";
import { k3, K3Process, packedFloor, tempDir, TINY } from "../helpers.ts";

Deno.test("batch --preset auto --parallel auto: the plan predicts, chooses by it, and no token changes", async () => {
  await using dir = await tempDir();
  const { floor } = await packedFloor(TINY, `${dir.path}/trunk`);
  const input = `${dir.path}/p.jsonl`;
  await Deno.writeTextFile(
    input,
    Array.from({ length: 5 }, (_, i) => JSON.stringify({ id: i, ids: [1 + i, 40 + i, 7], gen: 12 })).join("\n") + "\n",
  );
  const resident = await k3(["batch", TINY, "--input", input, "--output", `${dir.path}/a.jsonl`]);
  assert.equal(resident.code, 0, resident.stderr);
  assert.doesNotMatch(resident.stderr, /predicted:/, "a resident plan reads nothing: no prediction");
  const auto = await k3(
    [
      "batch",
      TINY,
      "--input",
      input,
      "--output",
      `${dir.path}/b.jsonl`,
      "--trunk",
      floor.trunkDir,
      "--preset",
      "auto",
      "--state-cache-gb",
      "0",
    ],
    { env: { K3_MEM_AVAILABLE_GB: "0.3" } },
  );
  assert.equal(auto.code, 0, auto.stderr);
  const m = auto.stderr.match(
    /predicted: [\d.e+]+ tokens\/s with (\d+) sequences? decoding \(a pass: [\d.]+ s = max\(read/,
  );
  assert.ok(m, auto.stderr);
  assert.match(auto.stderr, /auto: 0\.30 GB available -> .*\(the split with the best predicted tokens\/s\)/);
  assert.match(auto.stderr, new RegExp(`; ${m[1]} prompts? at a time;`), "the run takes the plan's number");
  const ids = async (f: string) =>
    (await Deno.readTextFile(f)).trimEnd().split("\n").map((l) => JSON.parse(l)).map((r) => [r.id, r.generated_ids])
      .sort((a, b) => a[0] - b[0]);
  assert.deepEqual(await ids(`${dir.path}/b.jsonl`), await ids(`${dir.path}/a.jsonl`));
});

Deno.test({
  name: "serve --parallel auto: as many at once as the plan takes (resident: the most that fit, 16)",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const server = new K3Process(["serve", TINY, "--port", "0", "--parallel", "auto"]);
    try {
      await server.waitFor(/k3: ready: .*\(16 at once, 16 waiting/);
    } finally {
      server.child.kill("SIGTERM");
      assert.equal((await server.exit()).code, 0);
    }
  },
});
