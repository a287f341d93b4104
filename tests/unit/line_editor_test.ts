/**
 * The chat line editor on input that wraps: every key redraws the prompt and the text over
 * as many rows as they take, with no copy of the first row left behind, the cursor where the
 * edit is, at several widths. The screen is a small model of a VT100 (autowrap with the
 * pending-wrap column, cursor up/right, erase below), fed exactly what the editor writes.
 */

import assert from "node:assert/strict";
import { LineEditor, type Terminal } from "../../cli/line_editor.ts";

/** A VT100-like screen: enough of one for what the editor writes. */
class Screen {
  rows: string[][] = [[]];
  row = 0;
  col = 0; // === cols: the pending wrap after the last column
  constructor(readonly cols: number) {}

  write(text: string): void {
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (c === "\x1b") {
        // deno-lint-ignore no-control-regex -- reading the terminal escape sequences the editor wrote
        const m = text.slice(i).match(/^\x1b\[(\d*)([A-Za-z])/);
        if (!m) throw new Error(`unexpected escape ${JSON.stringify(text.slice(i, i + 6))}`);
        i += m[0].length - 1;
        const n = Number(m[1] || 1);
        if (m[2] === "A") this.row = Math.max(0, this.row - n), this.col = Math.min(this.col, this.cols - 1);
        else if (m[2] === "C") this.col = Math.min(this.cols - 1, this.col + n);
        else if (m[2] === "D") this.col = Math.max(0, Math.min(this.col, this.cols - 1) - n);
        else if (m[2] === "J") {
          this.line().length = Math.min(this.line().length, this.col);
          this.rows.length = this.row + 1;
        } else if (m[2] === "K") this.line().length = Math.min(this.line().length, this.col);
        else throw new Error(`unexpected escape ${m[0]}`);
      } else if (c === "\r") this.col = 0;
      else if (c === "\n") this.#down();
      else {
        if (this.col === this.cols) {
          this.#down();
          this.col = 0;
        }
        const l = this.line();
        while (l.length < this.col) l.push(" ");
        l[this.col++] = c;
      }
    }
  }

  line(): string[] {
    while (this.rows.length <= this.row) this.rows.push([]);
    return this.rows[this.row];
  }

  #down(): void {
    this.row++;
    this.line();
  }

  text(): string[] {
    return this.rows.map((r) => r.join("").trimEnd());
  }
}

/** What the screen showed once every key was typed (before Enter ends the line). */
interface Shown {
  text: string[];
  row: number;
  col: number;
}

/** A terminal that types `keys` one at a time into the editor, shows it on `screen`, records
 * the screen once they are all typed in `shown`, then presses Enter. */
function terminal(screen: Screen, keys: string[], shown: Shown[]): Terminal {
  const enc = new TextEncoder();
  let entered = false;
  return {
    read: () => {
      if (keys.length) return Promise.resolve(enc.encode(keys.shift()!));
      if (entered) return Promise.resolve(null);
      entered = true;
      shown.push({ text: screen.text(), row: screen.row, col: screen.col });
      return Promise.resolve(enc.encode("\r"));
    },
    write: (t) => screen.write(t),
    setRaw: () => {},
    columns: () => screen.cols,
  };
}

/** The rows `text` takes at `cols` columns. */
function wrapped(text: string, cols: number): string[] {
  const rows: string[] = [];
  for (let i = 0; i < text.length; i += cols) rows.push(text.slice(i, i + cols).trimEnd());
  if (text.length % cols === 0) rows.push("");
  return rows;
}

const LEFT = "\x1b[D", HOME = "\x01", END = "\x05";

for (const cols of [10, 12, 17, 48]) {
  Deno.test(`line editor at ${cols} columns: wrapped input redrawn in place, cursor at the edit`, async () => {
    const screen = new Screen(cols), shown: Shown[] = [];
    // Type a sentence, go left 5, insert "X", Home, insert "<", End, insert ">", left 2.
    const keys = [..."the quick brown fox jumps over the lazy dog", ...Array(5).fill(LEFT), "X", HOME, "<", END, ">"];
    keys.push(LEFT, LEFT);
    const editor = new LineEditor(terminal(screen, keys, shown));
    const r = await editor.readLine("> ");
    const want = "<the quick brown fox jumps over the lazXy dog>";
    assert.deepEqual(r, { kind: "line", text: want });
    // Before Enter: the prompt and the text once, wrapped at the width (no copy of a row
    // left above or below), the cursor on the "g" two left of the end.
    const full = `> ${want}`;
    assert.deepEqual(shown[0].text, wrapped(full, cols));
    const at = full.length - 2;
    assert.deepEqual([shown[0].row, shown[0].col], [Math.floor(at / cols), at % cols]);
    // After Enter: the cursor on a fresh row below the input.
    assert.deepEqual(screen.text(), [...wrapped(full, cols), ""]);
  });
}
