/**
 * The README's real-model path, every command exactly as the README writes it, against the
 * local hub of tests/hub_server.ts serving a checkpoint in the released format (the tiny
 * model, under the released repository id): `k3 pull` (its transfer interrupted once and
 * resumed) with `--pack`, `k3 doctor --checkpoint`, a piped `k3 chat` that prints one
 * answer, and `k3 serve` answering /v1/models. Only `/data` becomes a temporary directory
 * and the port a free one; `HF_ENDPOINT` points the pull at the local hub.
 */

import assert from "node:assert/strict";
import { ROOT, runCmd, tempDir, TINY } from "../helpers.ts";
import { readPage } from "../doc_pages.ts";
import { repoFromDir, startHub } from "../hub_server.ts";

const SECTION = "## The real model: from a download to a first answer";

/** The command lines of the section's shell block (comments stripped, as a shell would). */
function realModelCommands(): string[] {
  const text = readPage("README.md");
  const start = text.indexOf(SECTION);
  assert.ok(start >= 0, `README has the section ${SECTION}`);
  const block = text.slice(start).match(/```sh\n([\s\S]*?)```/)?.[1] ?? "";
  return block.split("\n").map((l) => l.replace(/\s+#.*$/, "").trim()).filter((l) => l !== "");
}

Deno.test("README: pull (interrupted once), doctor, pack, chat and serve on a checkpoint in the released format", async () => {
  const lines = realModelCommands();
  assert.deepEqual(lines.map((l) => l.match(/\bk3 (\w+)/)?.[1]), ["pull", "doctor", "chat", "serve"]);
  const repo = lines[0].match(/k3 pull (\S+)/)![1];
  await using hub = startHub(
    await repoFromDir(TINY, { "preprocessor_config.json": "{}\n" }),
    repo,
  );
  await using data = await tempDir("k3-readme-data-");
  await Deno.mkdir(`${data.path}/bin`);
  await Deno.writeTextFile(
    `${data.path}/bin/k3`,
    `#!/bin/sh\nexec "${Deno.execPath()}" run -q --config "${ROOT}/deno.json" -P=k3 "${ROOT}/main.ts" "$@"\n`,
    { mode: 0o755 },
  );
  const env = { PATH: `${data.path}/bin:/usr/bin:/bin`, HF_ENDPOINT: hub.endpoint };
  const asRun = (line: string) => line.replaceAll("/data/", `${data.path}/`).replace(/--port \d+/, "--port 0");
  // The transfer of one shard is cut once: the pull resumes it with a Range request.
  hub.faults.cut = { path: "model-00002-of-00003.safetensors", bytes: 250_000 };

  const pull = await runCmd("sh", ["-c", asRun(lines[0])], { env, seconds: 300 });
  assert.equal(pull.code, 0, pull.stderr);
  assert.match(pull.stderr, /model-00002-of-00003\.safetensors: transfer interrupted at 250000 bytes/);
  assert.ok(hub.seen.some((r) => r.range === "bytes=250000-"));
  const model = asRun(lines[0]).split(/\s+/)[3];
  for (const f of ["config.json", "model-00002-of-00003.safetensors", "tiktoken.model"]) {
    assert.deepEqual(await Deno.readFile(`${model}/${f}`), await Deno.readFile(`${TINY}/${f}`), f);
  }
  const trunk = asRun(lines[0]).match(/--pack (\S+)/)![1];
  assert.ok((await Deno.stat(`${trunk}/manifest.json`)).isFile, "the trunk is packed");
  // Packed as the shards landed, not after the download.
  assert.match(pull.stderr, /pack: \d+ trunk regions? packed once model-00001-of-00003\.safetensors landed/);

  const doctor = await runCmd("sh", ["-c", asRun(lines[1])], { env, seconds: 300 });
  assert.equal(doctor.code, 0, doctor.stdout + doctor.stderr);
  assert.match(doctor.stdout, /^model +.*: 3 of 3 shards whole, .*complete \(not the released shape\)$/m);

  const chat = await runCmd("sh", ["-c", asRun(lines[2])], { env, seconds: 300 });
  assert.equal(chat.code, 0, chat.stderr);
  assert.ok(chat.stdout.trim().length > 0, `one answer on stdout: ${JSON.stringify(chat.stdout)}`);
  assert.match(chat.stderr, /k3: chat: 1 turn;/);

  const serve = new Deno.Command("sh", {
    args: ["-c", `exec ${asRun(lines[3])}`],
    env,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = serve.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let text = "", port = 0;
  while (!port) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`serve ended before it was ready: ${text}`);
    text += value;
    port = Number(text.match(/ready: http:\/\/127\.0\.0\.1:(\d+)/)?.[1] ?? 0);
  }
  const models = await (await fetch(`http://127.0.0.1:${port}/v1/models`)).json();
  assert.equal(models.data[0].id, "kimi-k3", "the served name is the directory's");
  serve.kill("SIGTERM");
  await serve.status;
  while (!(await reader.read()).done);
});
