/**
 * `k3 chat` on a terminal, typed into through a pseudo-terminal (tests/e2e/pty_drive.py, on
 * Python's pty module): editing with arrows and Ctrl-A/E, history recall within a session
 * and across sessions, multi-line input, /help, Ctrl-C stopping a reply, Ctrl-D ending the
 * chat; the history file holds the messages sent and nothing else.
 */

import assert from "node:assert/strict";
import { K3_PERMISSIONS } from "../../cli/permissions.ts";
import { ROOT, runCmd, tempDir, TINY } from "../helpers.ts";

type Step = { send: string } | { expect: string };

/** Runs `k3 chat TINY args` in a pty through `steps`; returns the exit code and transcript. */
async function typeInto(args: string[], steps: Step[], home: string, extraEnv: Record<string, string> = {}) {
  const spec = {
    argv: [Deno.execPath(), "run", ...K3_PERMISSIONS, `${ROOT}/main.ts`, "chat", TINY, ...args],
    cwd: ROOT,
    env: { HOME: home, PATH: "/usr/bin:/bin", ...extraEnv },
    steps,
  };
  const out = await runCmd("python3", [`${ROOT}/tests/e2e/pty_drive.py`], { stdin: JSON.stringify(spec) });
  assert.equal(out.code, 0, out.stderr);
  const r = JSON.parse(out.stdout) as { code: number; transcript: string; failed: unknown };
  assert.equal(r.failed, null, `step ${JSON.stringify(r.failed)} not seen in:\n${r.transcript}`);
  return r;
}

const UP = "\x1b[A", LEFT = "\x1b[D", CTRL_A = "\x01", CTRL_E = "\x05", CTRL_C = "\x03", CTRL_D = "\x04";
const turn = (n: number, reason = "\\w+") => ({ expect: `turn ${n}: [^\\n]*finish_reason ${reason}` });

Deno.test("chat REPL in a pty: editing, history, multi-line, /help, Ctrl-C mid-reply, Ctrl-D", async () => {
  await using dir = await tempDir();
  const conv = `${dir.path}/conv.jsonl`;
  const args = ["--temperature", "0", "--color", "never", "--no-think", "--history", conv];
  const first = await typeInto([...args, "--gen", "4"], [
    { expect: "\\r> " },
    // "helo", left, "l" -> "hello"; Ctrl-A "X"; Ctrl-E "!"
    { send: `helo${LEFT}l${CTRL_A}X${CTRL_E}!\r` },
    turn(1),
    { expect: "\\r> " },
    { send: `${UP}\r` }, // the same message again, recalled
    turn(2),
    { expect: "\\r> " },
    { send: '"""\rline one\rline two"""\r' },
    turn(3),
    { expect: "\\r> " },
    { send: "/help\r" },
    { expect: "commands: /help" },
    { expect: "\\r> " },
    { send: CTRL_D },
    { expect: "3 turns" },
  ], dir.path);
  assert.equal(first.code, 0, first.transcript);
  assert.match(first.transcript, /thinking\.\.\./, "a visible waiting state");
  const users = (await Deno.readTextFile(conv)).trimEnd().split("\n").map((l) => JSON.parse(l))
    .filter((m) => m.role === "user").map((m) => m.content);
  assert.deepEqual(users, ["Xhello!", "Xhello!", "line one\nline two"]);
  const historyFile = `${dir.path}/.k3/chat_history`;
  const saved = (await Deno.readTextFile(historyFile)).trimEnd().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(saved, ["Xhello!", "line one\nline two", "/help"], "what was sent, no keystrokes");

  // A second session: the history is there (up twice: "/help", then the two-line message);
  // Ctrl-C during a long reply stops it and the chat goes on; Ctrl-C at the prompt clears.
  const second = await typeInto([...args, "--gen", "2000", "--context", "4096"], [
    { expect: "\\r> " },
    { send: `${UP}${UP}` },
    { expect: "line one\\r?\\nline two" },
    { send: `${CTRL_C}` },
    { expect: "Ctrl-D or /exit" },
    { expect: "\\r> " },
    { send: "tell me everything\r" },
    { expect: "thinking\\.\\.\\." },
    { expect: "\\r\\x1b\\[K\\S" }, // the reply has started
    { send: CTRL_C },
    turn(1, "interrupted"),
    { expect: "\\r> " },
    { send: CTRL_D },
  ], dir.path);
  assert.equal(second.code, 0, second.transcript);
  const after = (await Deno.readTextFile(historyFile)).trimEnd().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(after, [...saved, "tell me everything"]);
  for (const entry of after) {
    assert.ok([...entry].every((c) => c === "\n" || c.charCodeAt(0) >= 32), `no control characters: ${entry}`);
  }
});

Deno.test("chat REPL in a pty: the think channel dimmed, and marked in text instead under NO_COLOR", async () => {
  await using dir = await tempDir();
  const ESC = String.fromCharCode(27);
  const steps: Step[] = [{ expect: "\\r> " }, { send: "Hello\r" }, turn(1), { expect: "\\r> " }, { send: CTRL_D }];
  const args = ["--temperature", "0", "--gen", "8", "--input-history", ""];
  const colored = await typeInto(args, steps, dir.path);
  const plain = await typeInto(args, steps, dir.path, { NO_COLOR: "1" });
  assert.ok(colored.transcript.includes(`${ESC}[2m`), colored.transcript);
  assert.ok(!plain.transcript.includes(`${ESC}[2m`), plain.transcript);
  assert.match(plain.transcript, /Thinking\.\.\./);
});
