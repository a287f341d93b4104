/**
 * `k3 batch`: results survive a SIGKILL mid-run and a rerun completes them (the union
 * equals an uninterrupted run), torn last lines are cut, malformed input lines are
 * reported by line number and skipped with exit 1, usage errors exit 2.
 */

import assert from "node:assert/strict";
import { jsonIds, k3, K3Process, tempDir, TINY } from "../helpers.ts";

interface Result {
  id: string | number;
  prompt_ids: number[];
  generated_ids: number[];
  generated_text: string | null;
  seconds: number;
  seconds_per_token: number;
}

/** 40 prompts of 1-5 ids and 64 generated tokens: a few seconds on the tiny model. */
function workload(n = 40): string {
  const lines = [];
  for (let i = 0; i < n; i++) {
    const ids = Array.from({ length: 1 + (i % 5) }, (_, j) => ((i * 7 + j * 13) % 1000) + 1);
    lines.push(JSON.stringify({ id: i % 2 ? i : `p${i}`, ids, gen: 64 }));
  }
  return lines.join("\n") + "\n";
}

async function results(path: string): Promise<Result[]> {
  const text = await Deno.readTextFile(path);
  assert.ok(text.endsWith("\n"), "every result line is complete");
  return text.trimEnd().split("\n").map((l) => JSON.parse(l));
}

const byId = (rs: Result[]) => new Map(rs.map((r) => [JSON.stringify(r.id), r]));

Deno.test("batch: killed mid-run (SIGKILL) with --parallel 4, rerun: the union equals an uninterrupted one-at-a-time run", async () => {
  await using dir = await tempDir();
  const input = `${dir.path}/prompts.jsonl`;
  await Deno.writeTextFile(input, workload());

  const full = await k3(["batch", TINY, "--input", input, "--output", `${dir.path}/full.jsonl`, "--parallel", "1"]);
  assert.equal(full.code, 0, full.stderr);
  assert.match(full.stderr, /1 prompt at a time/);
  assert.match(full.stderr, /40\/40 done .* tokens, [\d.]+ tok\/s, ETA/);
  const ref = await results(`${dir.path}/full.jsonl`);
  assert.equal(ref.length, 40);
  for (const r of ref) {
    assert.equal(r.generated_ids.length, 64);
    assert.ok(r.seconds > 0 && r.seconds_per_token > 0);
    assert.equal(typeof r.generated_text, "string", "the tiny model has a tokenizer");
  }

  // Start it again on a fresh output file, kill it as soon as one result is on disk.
  const out = `${dir.path}/killed.jsonl`;
  const child = new K3Process(["batch", TINY, "--input", input, "--output", out, "--parallel", "4"]);
  // Its progress line says a result is on disk (written before the line is logged).
  await child.waitFor(/k3: batch: 1\/40 done/);
  child.child.kill("SIGKILL");
  const status = await child.exit();
  assert.equal(status.success, false, "killed");
  const before = (await Deno.readTextFile(out)).split("\n").filter((l) => l.trim()).length;
  assert.ok(before >= 1 && before < 40, `killed mid-run (had ${before} of 40 results)`);
  console.log(`killed with ${before} of 40 results on disk`);

  // A torn line, as a kill in the middle of a write would leave it.
  await Deno.writeTextFile(out, '{"id":"p38","prompt_ids":[1,', { append: true });

  const rerun = await k3(["batch", TINY, "--input", input, "--output", out, "--parallel", "4"]);
  assert.equal(rerun.code, 0, rerun.stderr);
  assert.match(rerun.stderr, /4 prompts at a time/);
  assert.match(rerun.stderr, /cut a torn last line/);
  assert.match(rerun.stderr, new RegExp(`${before} already in .*; ${40 - before} to run`));
  const union = await results(out);
  assert.equal(union.length, 40, "each id exactly once");
  const got = byId(union), want = byId(ref);
  assert.deepEqual([...got.keys()].sort(), [...want.keys()].sort());
  for (const [id, r] of want) {
    assert.deepEqual(got.get(id)!.prompt_ids, r.prompt_ids, `prompt of ${id}`);
    assert.deepEqual(got.get(id)!.generated_ids, r.generated_ids, `generated ids of ${id}`);
    assert.equal(got.get(id)!.generated_text, r.generated_text);
  }

  // A third run has nothing to do and leaves the file alone.
  const again = await k3(["batch", TINY, "--input", input, "--output", out]);
  assert.equal(again.code, 0, again.stderr);
  assert.match(again.stderr, /40 already in .*; 0 to run/);
  assert.equal((await results(out)).length, 40);
});

Deno.test("batch: malformed lines are reported by line number and skipped; exit 1; text prompts and stop ids", async () => {
  await using dir = await tempDir();
  const input = `${dir.path}/p.jsonl`;
  await Deno.writeTextFile(
    input,
    [
      '{"id": "t", "prompt": "Once upon a time", "gen": 3}',
      "not json",
      '{"id": 1, "ids": [1, 2], "prompt": "x"}',
      "",
      '{"id": "t", "ids": [5]}',
      '{"id": 2, "ids": [5000]}',
      '{"id": 3, "ids": [5], "gen": 0}',
      '{"id": 4, "ids": [7, 8], "extra": 1}',
      '{"ids": [1]}',
      "[1, 2]",
      '{"id": 5, "ids": [1, 2, 3], "gen": 4}',
    ].join("\n"),
  );
  const out = `${dir.path}/r.jsonl`;
  const res = await k3(["batch", TINY, "--input", input, "--output", out]);
  assert.equal(res.code, 1, res.stderr);
  const reported = [...res.stderr.matchAll(/p\.jsonl:(\d+): /g)].map((m) => Number(m[1]));
  assert.deepEqual(reported, [2, 3, 5, 6, 7, 8, 9, 10]);
  assert.match(res.stderr, /p\.jsonl:2: not JSON/);
  assert.match(res.stderr, /p\.jsonl:3: give one of "prompt" and "ids", not both/);
  assert.match(res.stderr, /p\.jsonl:5: duplicate id "t"/);
  assert.match(res.stderr, /p\.jsonl:6: "ids": id 5000 is outside the vocabulary/);
  assert.match(res.stderr, /p\.jsonl:7: "gen" must be an integer in 1\.\.4096/);
  assert.match(res.stderr, /p\.jsonl:8: unknown field "extra"/);
  assert.match(res.stderr, /p\.jsonl:9: "id" must be a string or a number/);
  assert.match(res.stderr, /p\.jsonl:10: expected a JSON object/);
  const rs = await results(out);
  assert.deepEqual(rs.map((r) => r.id), ["t", 5]);
  assert.equal(rs[0].generated_ids.length, 3);
  assert.equal(rs[1].generated_ids.length, 4);

  // The same ids through `k3 run` give the same tokens.
  const run = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "4", "--json"]);
  assert.deepEqual(jsonIds(run.stdout), rs[1].generated_ids);

  // A stop id ends a line early; finish_reason says so.
  const stop = rs[1].generated_ids[1];
  await Deno.writeTextFile(
    input,
    JSON.stringify({ id: "s", ids: [1, 2, 3], gen: 4, stop_ids: [stop] }) + "\n",
  );
  const res2 = await k3(["batch", TINY, "--input", input, "--output", `${dir.path}/s.jsonl`]);
  assert.equal(res2.code, 0, res2.stderr);
  const [s] = await results(`${dir.path}/s.jsonl`);
  assert.deepEqual(s.generated_ids, rs[1].generated_ids.slice(0, 2));
  assert.equal((s as unknown as { finish_reason: string }).finish_reason, "stop");
});

Deno.test("batch: text prompts without a tokenizer fail per line; ids lines still run", async () => {
  await using dir = await tempDir();
  // A model dir without tiktoken.model.
  for await (const e of Deno.readDir(TINY)) {
    if (e.isFile && e.name !== "tiktoken.model") {
      await Deno.copyFile(`${TINY}/${e.name}`, `${dir.path}/${e.name}`);
    }
  }
  const input = `${dir.path}/p.jsonl`;
  await Deno.writeTextFile(
    input,
    '{"id": 1, "prompt": "hi"}\n{"id": 2, "ids": [1, 2], "gen": 2}\n',
  );
  const res = await k3(["batch", dir.path, "--input", input, "--output", `${dir.path}/r.jsonl`]);
  assert.equal(res.code, 1, res.stderr);
  assert.match(res.stderr, /p\.jsonl:1: "prompt" needs a tokenizer: pass --tok DIR/);
  const rs = await results(`${dir.path}/r.jsonl`);
  assert.deepEqual(rs.map((r) => r.id), [2]);
  assert.equal(rs[0].generated_text, null);
});

Deno.test("batch: an output file that is not ours is refused, not appended to", async () => {
  await using dir = await tempDir();
  const input = `${dir.path}/p.jsonl`;
  await Deno.writeTextFile(input, '{"id": 1, "ids": [1, 2], "gen": 2}\n');
  const out = `${dir.path}/r.jsonl`;
  await Deno.writeTextFile(out, "hello\nworld\n");
  const res = await k3(["batch", TINY, "--input", input, "--output", out]);
  assert.equal(res.code, 1);
  assert.match(res.stderr, /^k3: --output: .*r\.jsonl:1 is not a result line; refusing to append/m);
  assert.equal(await Deno.readTextFile(out), "hello\nworld\n");
});

Deno.test("batch: usage errors exit 2 with one line", async () => {
  await using dir = await tempDir();
  const input = `${dir.path}/p.jsonl`;
  await Deno.writeTextFile(input, '{"id": 1, "ids": [1]}\n');
  const cases: [string[], RegExp][] = [
    [["batch", TINY, "--output", `${dir.path}/r`], /--input PROMPTS\.jsonl is required/],
    [["batch", TINY, "--input", input], /--output RESULTS\.jsonl is required/],
    [["batch", "--input", input, "--output", `${dir.path}/r`], /expected exactly one <model_dir>/],
    [
      ["batch", TINY, "--input", input, "--output", input],
      /--input and --output must be different/,
    ],
    [
      ["batch", TINY, "--input", `${dir.path}/missing`, "--output", `${dir.path}/r`],
      /--input: cannot read/,
    ],
    [
      ["batch", TINY, "--input", input, "--output", `${dir.path}/r`, "--prompt", "x"],
      /unknown option --prompt; see k3 batch --help/,
    ],
    [
      ["batch", TINY, "--input", input, "--output", `${dir.path}/r`, "--gen", "5000"],
      /--gen: 5000 is out of range 1\.\.4096/,
    ],
    [
      ["batch", TINY, "--input", input, "--output", `${dir.path}/r`, "--stop-id", "99999"],
      /--stop-id: id 99999 is outside the vocabulary/,
    ],
    [["batch", TINY, "--input"], /--input.* argument missing/],
    [
      ["batch", TINY, "--input", input, "--output", `${dir.path}/r`, "--preset", "huge"],
      /--preset: unknown preset "huge"/,
    ],
  ];
  for (const [args, pattern] of cases) {
    const res = await k3(args);
    assert.equal(res.code, 2, `${args.join(" ")}: ${res.stderr}`);
    assert.equal(res.stderr.trim().split("\n").length, 1, res.stderr);
    assert.match(res.stderr, pattern);
  }
  const help = await k3(["batch", "--help"]);
  assert.equal(help.code, 0);
  assert.match(help.stdout, /usage: k3 batch <model_dir> --input/);
});

Deno.test("batch: the memory flags apply (packed trunk, tiny budget) and never change a token", async () => {
  await using dir = await tempDir();
  const input = `${dir.path}/p.jsonl`;
  await Deno.writeTextFile(input, workload(4));
  const pack = await k3(["pack", TINY, `${dir.path}/trunk`]);
  assert.equal(pack.code, 0, pack.stderr);
  const resident = await k3(["batch", TINY, "--input", input, "--output", `${dir.path}/a.jsonl`]);
  assert.equal(resident.code, 0, resident.stderr);
  const small = await k3([
    "batch",
    TINY,
    "--input",
    input,
    "--output",
    `${dir.path}/b.jsonl`,
    "--trunk",
    `${dir.path}/trunk`,
    "--trunk-gb",
    "0.0005",
    "--cache-gb",
    "0.0002",
  ]);
  assert.equal(small.code, 0, small.stderr);
  assert.match(small.stderr, /memory plan/);
  const a = await results(`${dir.path}/a.jsonl`), b = await results(`${dir.path}/b.jsonl`);
  assert.deepEqual(b.map((r) => [r.id, r.generated_ids]), a.map((r) => [r.id, r.generated_ids]));
});
