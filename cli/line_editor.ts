/**
 * A line editor for `k3 chat` on a terminal: the keys readline users expect (left/right,
 * Home/End, Ctrl-A/E/B/F, Backspace/Delete, Ctrl-K/U/W, up/down through the history), a
 * history kept across runs in a file, Ctrl-C and Ctrl-D as results the caller acts on.
 * Raw mode is on only while a line is read, so during a reply Ctrl-C is SIGINT again.
 *
 * Written here rather than taken from npm: the packages made for this (readline clones,
 * "cliffy" prompts) either need node:readline's TTY emulation, which Deno's raw stdin does
 * not give key by key, or bring a framework for one prompt; this is ~200 lines.
 *
 * The history file holds one JSON string per line (a multi-line message stays one entry), only
 * entries the caller adds: what was sent, never the keystrokes that edited it.
 *
 * @module
 */

/** What `readLine` ended with: a line, end of input (Ctrl-D on an empty line) or Ctrl-C. */
export type LineResult = { kind: "line"; text: string } | { kind: "eof" } | { kind: "interrupt" };

/** Where the editor reads keys and writes the echo (injectable for tests). */
export interface Terminal {
  /** Reads some bytes; null at end of input. */
  read(): Promise<Uint8Array | null>;
  /** Writes the echo. */
  write(text: string): void;
  /** Raw mode on or off. */
  setRaw(on: boolean): void;
  /** The terminal's width in columns (default 80), for input that wraps. */
  columns?(): number;
}

/** The process's own terminal (stdin keys, stdout echo). */
export function stdinTerminal(): Terminal {
  const buf = new Uint8Array(1024);
  const enc = new TextEncoder();
  return {
    async read() {
      const n = await Deno.stdin.read(buf);
      return n === null ? null : buf.slice(0, n);
    },
    write(text) {
      const bytes = enc.encode(text);
      let off = 0;
      while (off < bytes.length) off += Deno.stdout.writeSync(bytes.subarray(off));
    },
    setRaw(on) {
      Deno.stdin.setRaw(on);
    },
    columns() {
      try {
        return Deno.consoleSize().columns;
      } catch {
        return 80;
      }
    },
  };
}

/**
 * The escape text that redraws `prompt` + `text` with the cursor at `cursor` (an index into
 * `text`'s characters), on a terminal `cols` wide whose cursor is now `row` rows below the
 * prompt's first row; and the row the cursor ends on. Input longer than a row wraps: the
 * redraw goes up to the first row, rewrites every row and clears what is below, so no
 * copy of a row is left behind. (One column per character: wide characters are not measured.)
 */
export function redraw(
  prompt: string,
  text: string[],
  cursor: number,
  cols: number,
  row: number,
): { out: string; row: number } {
  // deno-lint-ignore no-control-regex
  const promptWidth = [...prompt.replace(/\x1b\[[0-9;]*m/g, "")].length;
  const total = promptWidth + text.length;
  let out = `${row > 0 ? `\x1b[${row}A` : ""}\r${prompt}${text.join("")}`;
  // At an exact multiple of the width the cursor waits past the last column: a newline
  // puts it where the end is, the start of the next row.
  if (total > 0 && total % cols === 0) out += "\r\n";
  out += "\x1b[J";
  const end = Math.floor(total / cols), at = promptWidth + cursor;
  const target = Math.floor(at / cols), col = at % cols;
  if (end > target) out += `\x1b[${end - target}A`;
  if (end > target || col !== total % cols) out += `\r${col > 0 ? `\x1b[${col}C` : ""}`;
  return { out, row: target };
}

/** The most entries kept in the history file. */
export const HISTORY_LIMIT = 1000;

/** Reads a history file (one JSON string per line); lines that are not are skipped. */
export function readHistoryFile(path: string): string[] {
  let text: string;
  try {
    text = Deno.readTextFileSync(path);
  } catch {
    return [];
  }
  const out: string[] = [];
  for (const line of text.split("\n")) {
    try {
      const v = JSON.parse(line);
      if (typeof v === "string") out.push(v);
    } catch { /* not an entry */ }
  }
  return out.slice(-HISTORY_LIMIT);
}

const enum Key {
  CtrlA = 1,
  CtrlB = 2,
  CtrlC = 3,
  CtrlD = 4,
  CtrlE = 5,
  CtrlF = 6,
  CtrlH = 8,
  CtrlK = 11,
  CtrlL = 12,
  Enter = 13,
  CtrlN = 14,
  CtrlP = 16,
  CtrlU = 21,
  CtrlW = 23,
  Esc = 27,
  Backspace = 127,
}

/** A readline-like editor over a Terminal, with a history. */
export class LineEditor {
  /** The entries up/down recall, oldest first (the file's, then this session's). */
  readonly history: string[];
  #pending: number[] = [];
  readonly #decoder = new TextDecoder();

  /** An editor reading `term`, its history loaded from (and appended to) `historyPath`. */
  constructor(readonly term: Terminal, readonly historyPath?: string) {
    this.history = historyPath ? readHistoryFile(historyPath) : [];
  }

  /** Adds `entry` to the history (and its file): what was meant, once per message. */
  addHistory(entry: string): void {
    if (entry.trim() === "" || this.history[this.history.length - 1] === entry) return;
    this.history.push(entry);
    if (this.history.length > HISTORY_LIMIT) this.history.splice(0, this.history.length - HISTORY_LIMIT);
    if (!this.historyPath) return;
    try {
      const dir = this.historyPath.replace(/\/[^/]*$/, "");
      if (dir && dir !== this.historyPath) Deno.mkdirSync(dir, { recursive: true });
      Deno.writeTextFileSync(this.historyPath, JSON.stringify(entry) + "\n", { append: true, mode: 0o600 });
    } catch { /* history is a convenience: a read-only home does not stop the chat */ }
  }

  async #byte(): Promise<number | null> {
    if (this.#pending.length === 0) {
      const chunk = await this.term.read();
      if (chunk === null) return null;
      this.#pending.push(...chunk);
    }
    return this.#pending.shift()!;
  }

  /** Reads one line with editing; raw mode only for its duration. */
  async readLine(prompt: string): Promise<LineResult> {
    this.term.setRaw(true);
    try {
      return await this.#read(prompt);
    } finally {
      this.term.setRaw(false);
    }
  }

  async #read(prompt: string): Promise<LineResult> {
    let line: string[] = [], cursor = 0, index = this.history.length, draft: string[] = [];
    let row = 0; // rows between the prompt's first row and the cursor (input that wraps)
    const render = () => {
      const r = redraw(prompt, line, cursor, Math.max(1, this.term.columns?.() ?? 80), row);
      row = r.row;
      this.term.write(r.out);
    };
    // Before leaving the line, the cursor goes to its end, so what follows starts below it.
    const toEnd = () => {
      cursor = line.length;
      render();
    };
    const recall = (to: number) => {
      if (to < 0 || to > this.history.length) return;
      if (index === this.history.length) draft = line;
      index = to;
      line = [...(index === this.history.length ? draft.join("") : this.history[index])];
      cursor = line.length;
    };
    render();
    for (;;) {
      const b = await this.#byte();
      if (b === null) {
        toEnd();
        this.term.write("\r\n");
        return line.length ? { kind: "line", text: line.join("") } : { kind: "eof" };
      }
      switch (b) {
        case Key.Enter:
        case 10:
          toEnd();
          this.term.write("\r\n");
          return { kind: "line", text: line.join("") };
        case Key.CtrlC:
          toEnd();
          this.term.write("^C\r\n");
          return { kind: "interrupt" };
        case Key.CtrlD:
          if (line.length === 0) {
            this.term.write("\r\n");
            return { kind: "eof" };
          }
          line.splice(cursor, 1);
          break;
        case Key.CtrlA:
          cursor = 0;
          break;
        case Key.CtrlE:
          cursor = line.length;
          break;
        case Key.CtrlB:
          cursor = Math.max(0, cursor - 1);
          break;
        case Key.CtrlF:
          cursor = Math.min(line.length, cursor + 1);
          break;
        case Key.Backspace:
        case Key.CtrlH:
          if (cursor > 0) line.splice(--cursor, 1);
          break;
        case Key.CtrlK:
          line.splice(cursor);
          break;
        case Key.CtrlU:
          line.splice(0, cursor);
          cursor = 0;
          break;
        case Key.CtrlW: {
          let i = cursor;
          while (i > 0 && line[i - 1] === " ") i--;
          while (i > 0 && line[i - 1] !== " ") i--;
          line.splice(i, cursor - i);
          cursor = i;
          break;
        }
        case Key.CtrlP:
          recall(index - 1);
          break;
        case Key.CtrlN:
          recall(index + 1);
          break;
        case Key.CtrlL:
          this.term.write("\x1b[2J\x1b[H");
          row = 0;
          break;
        case Key.Esc:
          await this.#escape({
            up: () => recall(index - 1),
            down: () => recall(index + 1),
            left: () => (cursor = Math.max(0, cursor - 1)),
            right: () => (cursor = Math.min(line.length, cursor + 1)),
            home: () => (cursor = 0),
            end: () => (cursor = line.length),
            del: () => line.splice(cursor, 1),
          });
          break;
        default: {
          if (b < 32) break; // other control keys: ignored, never inserted
          // A UTF-8 sequence: its lead byte says how many continuation bytes follow.
          const bytes = [b];
          const more = b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : b >= 0xc0 ? 1 : 0;
          for (let i = 0; i < more; i++) {
            const c = await this.#byte();
            if (c === null) break;
            bytes.push(c);
          }
          const text = this.#decoder.decode(new Uint8Array(bytes));
          const chars = [...text];
          line.splice(cursor, 0, ...chars);
          cursor += chars.length;
        }
      }
      render();
    }
  }

  /** An escape sequence (arrows, Home/End, Delete; CSI or SS3); unknown ones are dropped. */
  async #escape(
    keys: Record<"up" | "down" | "left" | "right" | "home" | "end" | "del", () => unknown>,
  ): Promise<void> {
    const intro = await this.#byte();
    if (intro !== 0x5b && intro !== 0x4f) return; // "[" or "O"
    let params = "";
    for (;;) {
      const c = await this.#byte();
      if (c === null) return;
      const ch = String.fromCharCode(c);
      if (c >= 0x40 && c <= 0x7e) {
        const code = ch === "~" ? params : ch;
        const action = ({
          A: "up",
          B: "down",
          C: "right",
          D: "left",
          H: "home",
          F: "end",
          "1": "home",
          "7": "home",
          "4": "end",
          "8": "end",
          "3": "del",
        } as const)[
          code.split(";")[0] as "A"
        ];
        if (action) keys[action]();
        return;
      }
      params += ch;
    }
  }
}

/**
 * Reads one message: a line, or several when the first starts with `"""` (until a line ending
 * with `"""`, as ollama) or lines end with a backslash (joined with newlines). `next` reads a
 * line given a prompt. The caller adds the whole message to the history.
 */
export async function readMessage(
  next: (prompt: string) => Promise<LineResult>,
  prompt = "> ",
  more = "... ",
): Promise<LineResult> {
  const first = await next(prompt);
  if (first.kind !== "line") return first;
  if (first.text.startsWith('"""')) {
    let text = first.text.slice(3);
    if (text.endsWith('"""') && text.length >= 3) return { kind: "line", text: text.slice(0, -3) };
    for (;;) {
      const r = await next(more);
      if (r.kind !== "line") return r.kind === "eof" ? { kind: "line", text } : r;
      if (r.text.endsWith('"""')) return { kind: "line", text: `${text}\n${r.text.slice(0, -3)}`.replace(/^\n/, "") };
      text += `\n${r.text}`;
    }
  }
  let text = first.text;
  while (text.endsWith("\\")) {
    const r = await next(more);
    if (r.kind === "interrupt") return r;
    text = text.slice(0, -1) + (r.kind === "line" ? `\n${r.text}` : "");
    if (r.kind === "eof") break;
  }
  return { kind: "line", text };
}
