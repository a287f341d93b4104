/**
 * `k3 chat`'s REPL loop: reads messages (the line editor on a terminal, lines from a
 * pipe), runs the slash commands, and hands every message to a turn.
 *
 * @module
 */

import { LineEditor, type LineResult, readMessage, stdinTerminal } from "../line_editor.ts";
import { EXIT_INTERRUPTED, writeStdout } from "../interrupt.ts";
import { saveConversation } from "./conversation.ts";
import { type ChatSession, takeTurn } from "./turn.ts";
import { loadCommand, setCommand, SETTINGS_HELP, showCommand } from "./settings.ts";
import { K3Error } from "../../engine/errors.ts";

/** The REPL's /help. */
const REPL_HELP = `commands: /help  /reset (start over)  /save FILE  /exit (or Ctrl-D)
${SETTINGS_HELP}
several lines: start with """ and end with """, or end a line with \\
keys: left/right, Home/End, Ctrl-A/E, Ctrl-K/U/W, up/down (history); Ctrl-C stops a reply`;

/** Reads lines from stdin as they arrive. */
async function* stdinLines(): AsyncGenerator<string> {
  const reader = Deno.stdin.readable.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      yield buf.slice(0, nl).replace(/\r$/, "");
      buf = buf.slice(nl + 1);
    }
  }
  if (buf !== "") yield buf;
}

/** The line editor's history file: --input-history, else ~/.k3/chat_history ("" none). */
function inputHistoryFile(flag: string | undefined): string {
  if (flag !== undefined) return flag;
  let home: string | undefined;
  try {
    home = Deno.env.get("HOME");
  } catch {
    home = undefined;
  }
  return home ? `${home}/.k3/chat_history` : "";
}

/** Runs a slash command; false when `line` is not one (it is a message). */
async function command(s: ChatSession, line: string): Promise<boolean> {
  const trimmed = line.trim();
  if (trimmed === "/help" || trimmed === "/?") {
    writeStdout(REPL_HELP + "\n");
  } else if (/^\/(set|show|load)(\s|$)/.test(trimmed)) {
    const [name] = trimmed.split(/\s/, 1), args = trimmed.slice(name.length).trim();
    try {
      if (name === "/show") writeStdout(showCommand(s, args) + "\n");
      else console.error(`k3: chat: ${name === "/set" ? setCommand(s, args) : await loadCommand(s, args)}`);
    } catch (e) {
      if (!(e instanceof K3Error)) throw e;
      console.error(`k3: chat: ${e.message}`);
    }
  } else if (trimmed === "/reset" || trimmed === "/clear") {
    s.conv.reset();
    console.error("k3: chat: conversation reset");
  } else if (line.startsWith("/save")) {
    const to = line.slice(5).trim();
    if (!to) {
      console.error("k3: chat: /save needs a file name");
      return true;
    }
    const withState = s.o.state !== undefined;
    try {
      await saveConversation(s.conv, s.files, to, withState ? `${to}.k3state` : undefined);
      console.error(`k3: chat: saved ${to}${withState && s.conv.state ? ` and ${to}.k3state` : ""}`);
    } catch (e) {
      console.error(`k3: chat: /save: ${(e as Error).message}`);
    }
  } else if (line.startsWith("/")) {
    console.error(
      `k3: chat: unknown command ${line.split(/\s/, 1)[0]} (/help, /set, /show, /clear, /load FILE, /save FILE, /exit)`,
    );
  } else return false;
  return true;
}

/** Reads messages until end of input or /exit, each one a turn. */
export async function repl(s: ChatSession): Promise<void> {
  const editor = s.interactive
    ? new LineEditor(stdinTerminal(), inputHistoryFile(s.o.inputHistory) || undefined)
    : undefined;
  const lines = stdinLines();
  const nextLine = async (prompt: string): Promise<LineResult> => {
    if (editor) return await editor.readLine(prompt);
    if (s.tty) writeStdout(prompt);
    const next = await lines.next();
    return next.done ? { kind: "eof" } : { kind: "line", text: next.value };
  };
  for (;;) {
    if (s.tty) writeStdout("\n");
    s.interrupts.busy = false;
    s.interrupts.idle = () => Deno.exit(EXIT_INTERRUPTED);
    const read = await readMessage(nextLine);
    if (read.kind === "eof") break;
    if (read.kind === "interrupt") {
      writeStdout("(Ctrl-D or /exit ends the chat)\n");
      continue;
    }
    const line = read.text;
    if (line.trim() === "") continue;
    editor?.addHistory(line);
    if (line.trim() === "/exit" || line.trim() === "/bye") break;
    if (await command(s, line)) continue;
    await takeTurn(s, { role: "user", content: line }, nextLine);
  }
}
