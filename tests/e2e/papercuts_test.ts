/**
 * What a new user trips on first, each fixed: a closed stdout (`k3 run ... | head`) ends k3
 * quietly with the shell's code; `-q` leaves only errors on stderr; text piped to `k3 run`
 * is the prompt; each chat session samples with a fresh seed unless --seed; the REPL's
 * ollama-style /set, /show, /clear and /load.
 */

import assert from "node:assert/strict";
import { jsonIds, k3, ROOT, tempDir, TINY, TINY_EN } from "../helpers.ts";
import { K3_PERMISSIONS } from "../../cli/permissions.ts";

Deno.test("a closed stdout ends k3 run quietly with 141 (as a shell's SIGPIPE), not an internal error", async () => {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", ...K3_PERMISSIONS, `${ROOT}/main.ts`, "run", TINY_EN, "--prompt", "Once upon a time", "--gen", "400"],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const reader = child.stdout.getReader();
  await reader.read(); // the first text: then the reader goes away, as `head -c 1` does
  await reader.cancel();
  const [status, err] = await Promise.all([child.status, new Response(child.stderr).text()]);
  assert.equal(status.code, 141, err);
  assert.doesNotMatch(err, /internal error|Broken pipe|^\s+at /m);
});

Deno.test("-q prints only errors: no plan, no summary, no speculation line", async () => {
  const out = await k3(["run", TINY_EN, "--prompt", "Once", "--gen", "40", "-q"]);
  assert.equal(out.code, 0, out.stderr);
  assert.ok(out.stdout.length > 0);
  assert.equal(out.stderr, "");
});

Deno.test("text piped to k3 run is the prompt when no prompt flag is given", async () => {
  const piped = await k3(["run", TINY, "--gen", "4", "--json", "-q"], { stdin: "Once upon a time" });
  const flag = await k3(["run", TINY, "--gen", "4", "--json", "-q", "--prompt", "Once upon a time"]);
  assert.equal(piped.code, 0, piped.stderr);
  assert.deepEqual(jsonIds(piped.stdout), jsonIds(flag.stdout));
  assert.equal(JSON.parse(piped.stdout.trimEnd().split("\n").at(-1)!).usage.prompt_tokens, 8);
  // Nothing piped (stdin empty): the usage error, before the model loads.
  const none = await k3(["run", TINY, "--gen", "4"], { stdin: "" });
  assert.equal(none.code, 2);
  assert.match(none.stderr, /a prompt is required: one of --prompt, --prompt-file, --ids, or text piped to stdin/);
});

/** The seed a chat session reports on its first line. */
function chatSeed(stderr: string): number {
  return Number(stderr.match(/k3: chat: .* seed (\d+)\./)?.[1]);
}

Deno.test("chat: a fresh seed per session unless --seed", async () => {
  const a = await k3(["chat", TINY, "--gen", "2"], { stdin: "/exit\n" });
  const b = await k3(["chat", TINY, "--gen", "2"], { stdin: "/exit\n" });
  const fixed = await k3(["chat", TINY, "--gen", "2", "--seed", "42"], { stdin: "/exit\n" });
  assert.equal(a.code, 0, a.stderr);
  assert.ok(Number.isInteger(chatSeed(a.stderr)) && Number.isInteger(chatSeed(b.stderr)));
  assert.notEqual(chatSeed(a.stderr), chatSeed(b.stderr), "two sessions, two seeds");
  assert.equal(chatSeed(fixed.stderr), 42);
});

Deno.test("chat: /set, /show, /clear and /load as in ollama", async () => {
  await using tmp = await tempDir();
  const saved = `${tmp.path}/talk.jsonl`;
  await Deno.writeTextFile(
    saved,
    '{"role": "system", "content": "Be brief."}\n{"role": "user", "content": "Hi"}\n{"role": "assistant", "content": "Hello."}\n',
  );
  const script = [
    "/set parameter temperature 0",
    "/set parameter top_p 2",
    "/set parameter num_predict 3",
    "/set system You are terse.",
    "/show parameters",
    "/show system",
    `/load ${saved}`,
    "/show info",
    "/clear",
    "/show info",
    "/set parameter colour 1",
    "/exit",
  ].join("\n") + "\n";
  const out = await k3(["chat", TINY, "--seed", "9"], { stdin: script });
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, /k3: chat: temperature 0\n/);
  assert.match(out.stderr, /k3: chat: --top-p: 2 is out of range 0\.\.1/);
  assert.match(out.stdout, /^temperature 0, top_p 0\.95, top_k 0, min_p 0, seed 9, num_predict 3$/m);
  assert.match(out.stdout, /^system: You are terse\.$/m);
  assert.match(out.stderr, /k3: chat: loaded 3 messages from /);
  assert.match(out.stdout, /; 3 messages; thinking on\n/);
  assert.match(out.stdout, /; 1 messages; thinking on\n/, "/clear keeps only the system message");
  assert.match(out.stderr, /no parameter "colour"/);
  assert.doesNotMatch(out.stderr, /unknown command/);
});
