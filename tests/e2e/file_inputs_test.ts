/**
 * Every file input checked the same way (issue 35): the options that read a file are
 * found from the flag declarations (cli/flags.ts `file`), so a new one is walked too; each
 * given a FIFO, /dev/zero and a directory ends k3 at once with one `k3:` line and exit 2.
 * A key file may be a pipe: one bounded line is read, and a FIFO nobody writes to still
 * lets a signal end k3.
 *
 * @module
 */

import assert from "node:assert/strict";
import { type CommandFlags } from "../../cli/flags.ts";
import { RUN_FLAGS } from "../../cli/run/options.ts";
import { CHAT_FLAGS } from "../../cli/chat/options.ts";
import { BATCH_FLAGS } from "../../cli/batch/options.ts";
import { SERVE_FLAGS } from "../../cli/serve/options.ts";
import { PACK_FLAGS } from "../../cli/pack.ts";
import { TOKENIZE_FLAGS } from "../../cli/tokenize.ts";
import { DETOKENIZE_FLAGS } from "../../cli/detokenize.ts";
import { DOCTOR_FLAGS } from "../../cli/doctor/options.ts";
import { PRESETS_FLAGS } from "../../cli/presets.ts";
import { k3, type Output, ROOT, tempDir, TINY } from "../helpers.ts";

const COMMANDS: CommandFlags[] = [
  RUN_FLAGS,
  CHAT_FLAGS,
  BATCH_FLAGS,
  SERVE_FLAGS,
  PACK_FLAGS,
  TOKENIZE_FLAGS,
  DETOKENIZE_FLAGS,
  DOCTOR_FLAGS,
  PRESETS_FLAGS,
];

/** Arguments that make each command otherwise valid, before the file option under test. */
const BASE: Record<string, string[]> = {
  run: [TINY, "--ids", "5", "--gen", "1"],
  chat: [TINY],
  batch: [TINY, "--input", `${ROOT}/README.md`, "--output", "/tmp/k3-never-written.jsonl"],
  serve: [TINY, "--port", "0"],
  tokenize: ["--tok", TINY],
};

/** Every (command, option) whose value is a file k3 reads, from the declarations. */
function inputOptions(): { cmd: string; flag: string; key: boolean }[] {
  const out: { cmd: string; flag: string; key: boolean }[] = [];
  for (const c of COMMANDS) {
    for (const [flag, f] of Object.entries(c.flags)) {
      if (f.file === "input" || f.file === "key") out.push({ cmd: c.name, flag, key: f.file === "key" });
    }
  }
  return out;
}

function mkfifo(path: string): void {
  const r = new Deno.Command("mkfifo", { args: [path] }).outputSync();
  if (!r.success) throw new Error(`mkfifo ${path} failed`);
}

/** Exit 2 and the whole stderr is one `k3:` line naming the option. */
function refused(out: Output, flag: string, what: string): void {
  assert.equal(out.code, 2, `${what}: ${out.stderr}`);
  const lines = out.stderr.trim().split("\n");
  assert.equal(lines.length, 1, `${what}: one line, got ${out.stderr}`);
  assert.match(lines[0], new RegExp(`^k3: --${flag}: `), what);
}

Deno.test("file options: every option named for a file declares what it does with it", () => {
  for (const c of COMMANDS) {
    for (const [flag, f] of Object.entries(c.flags)) {
      if (/file$/.test(flag) || /^F/.test(f.value ?? "")) {
        assert.ok(f.file !== undefined, `k3 ${c.name} --${flag}: declare file: "input", "key" or "output"`);
      }
    }
  }
  const found = inputOptions().map((o) => `${o.cmd} --${o.flag}`);
  for (const known of ["chat --history", "chat --state", "chat --tools", "run --load-state", "serve --api-key-file"]) {
    assert.ok(found.includes(known), `${known} in ${found.join(", ")}`);
  }
});

Deno.test("file options: a FIFO, /dev/zero or a directory for any input option is one line, exit 2, at once", async () => {
  await using d = await tempDir();
  const fifo = `${d.path}/fifo`;
  mkfifo(fifo);
  for (const { cmd, flag, key } of inputOptions()) {
    assert.ok(BASE[cmd], `k3 ${cmd}: add its base arguments to BASE`);
    // The base without the option under test (batch's base names an --input).
    const at = BASE[cmd].indexOf(`--${flag}`);
    const base = at < 0 ? BASE[cmd] : BASE[cmd].toSpliced(at, 2);
    const specials = key ? ["/dev/zero", d.path] : [fifo, "/dev/zero", d.path];
    for (const special of specials) {
      const what = `k3 ${cmd} --${flag} ${special}`;
      refused(await k3([cmd, ...base, `--${flag}`, special], { stdin: "", seconds: 30 }), flag, what);
    }
  }
});

Deno.test("file options: a key from a pipe is one bounded line; a FIFO nobody writes to still ends on SIGTERM", async () => {
  await using d = await tempDir();
  const fifo = `${d.path}/key`;
  mkfifo(fifo);
  // A pipe that never ends a line: refused after the bound, not read without end.
  const writer = (async () => {
    const w = await Deno.open(fifo, { write: true });
    const zeros = new Uint8Array(65536).fill(120);
    try {
      while (true) await w.write(zeros);
    } catch { /* the reader closed it */ }
    w.close();
  })();
  const out = await k3(["serve", TINY, "--port", "0", "--api-key-file", fifo], { seconds: 30 });
  await writer;
  refused(out, "api-key-file", "an endless key line");
  assert.match(out.stderr, /no line end within 4096 bytes/);

  // Nobody writes: k3 waits for the key, and SIGTERM still ends it.
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${ROOT}/main.ts`, "serve", TINY, "--port", "0", "--api-key-file", fifo],
    stdout: "null",
    stderr: "piped",
    signal: AbortSignal.timeout(30_000),
  }).spawn();
  await new Promise((r) => setTimeout(r, 1500));
  child.kill("SIGTERM");
  const status = await child.status;
  assert.ok(!status.success, "k3 ended on SIGTERM, before any key arrived");
  await child.stderr.cancel();
});
