/** Fuzz: tiktoken.model (parseTiktokenModel) on line-aware mutations of the real file. */

import assert from "node:assert/strict";
import fc from "fast-check";
import { parseTiktokenModel } from "../../engine/text/tokenizer.ts";
import { assertRefusal, check } from "./fuzz.ts";
import { TINY } from "../helpers.ts";

const mutation = fc.record({
  op: fc.nat({ max: 7 }),
  a: fc.nat(),
  b: fc.nat(),
  n: fc.oneof(fc.nat({ max: 2000 }), fc.constantFrom(999999999, 2 ** 31, 1e12)),
  ch: fc.constantFrom("!", "=", " ", "\r", "\t", "\u00e9", "A", "-"),
});

Deno.test("fuzz tiktoken.model: refused with exit 1 and one line, or accepted with dense unique ranks", () => {
  const text = Deno.readTextFileSync(`${TINY}/tiktoken.model`);
  const lines = text.split("\n").filter((l) => l);
  const ref = parseTiktokenModel(text);
  check("tiktoken.model", fc.array(mutation, { minLength: 1, maxLength: 3 }), (ms) => {
    const ls = [...lines];
    for (const m of ms) {
      const i = m.a % ls.length, j = m.b % ls.length;
      const [b64, rank] = ls[i].split(" ");
      switch (m.op) {
        case 0: // another rank
          ls[i] = `${b64} ${m.n}`;
          break;
        case 1: // two ranks swapped (still a valid permutation)
          ls[i] = `${b64} ${ls[j].split(" ")[1]}`;
          ls[j] = `${ls[j].split(" ")[0]} ${rank}`;
          break;
        case 2: // a line duplicated
          ls.splice(j, 0, ls[i]);
          break;
        case 3: // a line removed
          ls.splice(i, 1);
          break;
        case 4: // a character of the base64 replaced
          ls[i] = b64.slice(0, m.b % b64.length) + m.ch + b64.slice((m.b % b64.length) + 1) + ` ${rank}`;
          break;
        case 5: // a huge line
          ls[i] = "QUFB".repeat(1 + (m.n % 3000)) + ` ${rank}`;
          break;
        case 6: // CRLF and blank lines (harmless)
          ls[i] = ls[i] + "\r";
          ls.splice(j, 0, "");
          break;
        default: // two lines swapped (harmless)
          [ls[i], ls[j]] = [ls[j], ls[i]];
      }
    }
    let table;
    try {
      table = parseTiktokenModel(ls.join("\n"));
    } catch (e) {
      return assertRefusal(e, [1]);
    }
    assert.ok(table.size <= ls.length);
    // Dense: every rank 0..size-1 has bytes.
    assert.equal(table.start.length, table.size);
    for (let r = 0; r < table.size; r++) assert.ok(table.start[r] >= 0 && table.length[r] > 0, `rank ${r}`);
    if (ms.every((m) => m.op >= 6)) assert.equal(table.size, ref.size);
  });
});
