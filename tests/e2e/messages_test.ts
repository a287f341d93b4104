/**
 * What a newcomer meets, each checked as they would meet it: habits from llama.cpp and ollama
 * get a suggestion (or work, for the aliases -p, -n, -t), messages say what is wrong and what
 * to do, a path of the wrong kind exits 2, the terminal flags do what their help says, and
 * every JSON object k3 writes has one snake_case schema with its head.
 */

import assert from "node:assert/strict";
import { k3, tempDir, TINY } from "../helpers.ts";

/** Exit code and the one stderr line of a failing k3 command. */
async function fails(args: string[], code: number, pattern: RegExp, stdin?: string) {
  const out = await k3(args, { stdin });
  assert.equal(out.code, code, `${args.join(" ")}: ${out.stderr}`);
  const lines = out.stderr.trimEnd().split("\n");
  assert.equal(lines.length, 1, out.stderr);
  assert.match(lines[0], pattern);
  assert.doesNotMatch(lines[0], /os error|\n\s+at /);
}

Deno.test("habits: aliases run, other llama.cpp/ollama flags are named as k3 calls them", async () => {
  const a = await k3(["run", TINY, "-p", "Once upon a time", "-n", "3", "-t", "1", "--json"]);
  const b = await k3(["run", TINY, "--prompt", "Once upon a time", "--gen", "3", "--threads", "1", "--json"]);
  assert.equal(a.code, 0, a.stderr);
  const ids = (o: string) => JSON.parse(o.trimEnd().split("\n").at(-1)!).generated_ids;
  assert.deepEqual(ids(a.stdout), ids(b.stdout));
  await fails(["run", TINY, "-p", "hi", "-c", "64"], 2, /-c \(k3 calls it --context\)/);
  await fails(["run", TINY, "-p", "hi", "--ctx-size", "64"], 2, /--ctx-size \(k3 calls it --context\)/);
  await fails(["run", "-m", TINY, "-p", "hi"], 2, /the model directory is the first argument/);
  await fails(["run", TINY, "Hello"], 2, /to give it as the prompt: k3 run \S+ --prompt "Hello"/);
  // No prompt flag and nothing piped: what to give (piped text would be the prompt).
  await fails(["run", TINY], 2, /a prompt is required: .* or text piped to stdin/, "");
  await fails(["run", TINY, "-p", "hi", "-n", "8", "--context", "4"], 2, /needs \d+ positions .*raise --context/);
  const ctx = await k3(["run", TINY, "-p", "hi", "-n", "2", "--context", "64"]);
  assert.equal(ctx.code, 0, ctx.stderr);
  assert.match(ctx.stderr, /KV 640 B\/position x 64 positions/);
});

Deno.test("messages: what is wrong and what to do; a wrong-kind path is 2, an interrupted pack 1", async () => {
  await using d = await tempDir();
  await fails(["doctor", "--no-read", "--checkpoint", `${d.path}/missing`], 2, /^k3: --checkpoint: .* does not exist/);
  await Deno.writeFile(`${d.path}/bin`, new Uint8Array([0x7f, 0x45, 0x4c, 0x46, 0, 0, 0xd0, 0x61]));
  await fails(
    ["run", TINY, "--prompt-file", `${d.path}/bin`],
    2,
    /from offset 6 \(0xd0\) broken by 0x61 at offset 7 \(a binary file\?/,
  );
  for (const args of [["run", TINY, "--ids", "1", "--trunk"], ["pack", "--verify"]]) {
    await fails([...args, `${TINY}/config.json`], 2, /is not a packed trunk: it is a file; make one with k3 pack/);
    await fails([...args, d.path], 2, /is not a packed trunk: no manifest\.json/);
  }
  await Deno.mkdir(`${d.path}/partial`);
  await Deno.writeTextFile(`${d.path}/partial/trunk.bin.partial`, "x");
  await fails(["run", TINY, "--ids", "1", "--trunk", `${d.path}/partial`], 1, /an interrupted k3 pack\?\); pack again/);
  // A busy port: which one, and what to do.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  try {
    await fails(
      ["serve", TINY, "--port", String((listener.addr as Deno.NetAddr).port)],
      2,
      /already in use .*--port 0/,
    );
  } finally {
    listener.close();
  }
});

Deno.test("help: batch's stop example is one line of JSON, id once; chat has examples", async () => {
  const batch = await k3(["batch", "--help"]);
  assert.match(batch.stdout, /"stop": \["\\n\\n"\]\}/);
  assert.equal(batch.stdout.match(/^ {2}id {8}/gm)?.length, 1);
  const chat = await k3(["chat", "--help"]);
  assert.match(chat.stdout, /^examples:\n {2}k3 chat tests\/fixtures\/tiny$/m);
  assert.doesNotMatch(chat.stdout + chat.stderr, /index: |load: /);
});

Deno.test("terminal flags: the step table in logs by default, --quiet errors only, --verbose, --color", async () => {
  const args = ["run", TINY, "--prompt", "Once upon a time", "--gen", "3"];
  const normal = await k3(args), quiet = await k3([...args, "--quiet"]), verbose = await k3([...args, "--verbose"]);
  for (const o of [normal, quiet, verbose]) assert.equal(o.code, 0, o.stderr);
  assert.equal(quiet.stdout, normal.stdout, "stdout is the text, whatever the flags");
  assert.equal(quiet.stderr, "");
  assert.match(normal.stderr, /^step +token/m, "stderr is not a terminal: the table is for the log");
  assert.match(verbose.stderr, /^step +token/m);
  assert.doesNotMatch(normal.stdout, /step|k3:/);
  await fails([...args, "--color", "sometimes"], 2, /--color: expected auto, always or never/);
  await fails([...args, "--quiet", "--verbose"], 2, /conflict/);
});

Deno.test("chat off a terminal: the think channel hidden unless --show-think, then between markers", async () => {
  const args = ["chat", TINY, "--temperature", "0", "--gen", "12"];
  const hidden = await k3(args, { stdin: "Hello\n" });
  const shown = await k3([...args, "--show-think"], { stdin: "Hello\n" });
  const colored = await k3([...args, "--show-think", "--color", "always"], { stdin: "Hello\n" });
  for (const o of [hidden, shown, colored]) assert.equal(o.code, 0, o.stderr);
  assert.match(shown.stdout, /^Thinking\.\.\.\n/);
  const ESC = String.fromCharCode(27);
  assert.ok(!(hidden.stdout + shown.stdout).includes(ESC), "no colour off a terminal by default");
  assert.ok(colored.stdout.includes(`${ESC}[2m`), "--color always: the think channel dimmed");
  assert.ok(!hidden.stdout.includes("Thinking..."));
  assert.match(hidden.stderr, /; 0 messages; /);
});

/** Every key of `v`, at any depth, is snake_case (values are not looked at). */
function assertSnake(v: unknown, where: string): void {
  if (Array.isArray(v)) return v.forEach((x, i) => assertSnake(x, `${where}[${i}]`));
  if (v === null || typeof v !== "object") return;
  for (const [k, x] of Object.entries(v)) {
    assert.match(k, /^[a-z][a-z0-9_]*$/, `${where}.${k}`);
    assertSnake(x, `${where}.${k}`);
  }
}

Deno.test("every JSON k3 writes: one snake_case schema with schema_version, k3_version and kind", async () => {
  await using d = await tempDir();
  const objects: [string, Record<string, unknown>][] = [];
  const run = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "2", "--json", "--out", `${d.path}/run.json`]);
  assert.equal(run.code, 0, run.stderr);
  objects.push(["run --out", JSON.parse(await Deno.readTextFile(`${d.path}/run.json`))]);
  objects.push(["run --json summary", JSON.parse(run.stdout.trimEnd().split("\n").at(-1)!)]);
  await Deno.writeTextFile(`${d.path}/in.jsonl`, '{"id": "a", "ids": [1, 2, 3], "gen": 2}\n');
  const batch = await k3([
    "batch",
    TINY,
    "--input",
    `${d.path}/in.jsonl`,
    "--output",
    `${d.path}/out.jsonl`,
    "--report",
    `${d.path}/report.json`,
  ]);
  assert.equal(batch.code, 0, batch.stderr);
  objects.push(["batch result", JSON.parse((await Deno.readTextFile(`${d.path}/out.jsonl`)).split("\n")[0])]);
  objects.push(["batch --report", JSON.parse(await Deno.readTextFile(`${d.path}/report.json`))]);
  const presets = await k3(["presets", "--json"]);
  objects.push(["presets --json", JSON.parse(presets.stdout)]);
  const chat = await k3(["chat", TINY, "--gen", "2", "--out", `${d.path}/chat.json`], { stdin: "hi\n" });
  assert.equal(chat.code, 0, chat.stderr);
  objects.push(["chat --out", JSON.parse(await Deno.readTextFile(`${d.path}/chat.json`))]);
  for (const [what, o] of objects) {
    assert.equal(o.schema_version, 1, what);
    assert.match(String(o.k3_version), /^\d+\.\d+\.\d+/, what);
    assert.equal(typeof o.kind, "string", what);
    assertSnake(o, what);
  }
});
