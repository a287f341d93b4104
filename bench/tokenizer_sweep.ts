/**
 * The tokenizer parity sweep: every Unicode scalar value in ten contexts, against a
 * vocabulary made of all substrings of those contexts, so that any difference in piece
 * boundaries changes the ids. It shows V8's Unicode tables agree with the Rust regex
 * crate's (the WASM tiktoken) for every property K3's pattern uses. About 11 million
 * contexts, ~5 minutes; run it after upgrading Deno. Exits 1 on any difference.
 *
 *   deno run -A bench/tokenizer_sweep.ts
 *
 * @module
 */

import { Tiktoken } from "tiktoken";
import { K3_PAT_STR } from "../engine/text/pretokenize.ts";
import { parseTiktokenModel, Tokenizer } from "../engine/text/tokenizer.ts";
import { benchArgs } from "./args.ts";

benchArgs("usage: deno run -A bench/tokenizer_sweep.ts   (about 5 minutes; exit 1 on any difference)", {});

function diff(text: string, ours: number[], ref: ArrayLike<number>): string {
  const a = Array.from(ref);
  if (ours.length === a.length && ours.every((x, i) => x === a[i])) return "";
  return `${JSON.stringify(text.slice(0, 200))}\n  ours ${ours.join(",")}\n  ref  ${a.join(",")}`;
}

const contexts = (c: string) => [
  `a${c}a`,
  c + c,
  ` ${c}`,
  `${c}a`,
  `A${c}`,
  `${c}\n`,
  `1${c}`,
  `'${c}`,
  `${c}'s`,
  `中${c}`,
];
const b64 = (s: string) => btoa(String.fromCharCode(...new TextEncoder().encode(s)));
const failures: string[] = [];
let checked = 0;
const BATCH = 8192;
for (let lo = 0; lo < 0x110000; lo += BATCH) {
  const texts: string[] = [];
  const tokens = new Set<string>();
  for (let cp = lo; cp < lo + BATCH; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    for (const t of contexts(String.fromCodePoint(cp))) {
      texts.push(t);
      const cps = [...t];
      for (let i = 0; i < cps.length; i++) {
        for (let j = i + 1; j <= cps.length; j++) tokens.add(cps.slice(i, j).join(""));
      }
    }
  }
  const seen = new Set<string>();
  const lines: string[] = [];
  for (let b = 0; b < 256; b++) {
    const e = btoa(String.fromCharCode(b));
    seen.add(e);
    lines.push(`${e} ${b}\n`);
  }
  for (const t of tokens) {
    const e = b64(t);
    if (!seen.has(e)) lines.push(`${e} ${seen.add(e).size - 1}\n`);
  }
  const model = lines.join("");
  const ours = new Tokenizer(parseTiktokenModel(model));
  const ref = new Tiktoken(model, {}, K3_PAT_STR);
  for (const t of texts) {
    checked++;
    const d = diff(t, ours.encode(t), ref.encode_ordinary(t));
    if (d && failures.length < 20) failures.push(d);
  }
  ref.free();
}
if (failures.length) {
  console.error(failures.join("\n"));
  Deno.exit(1);
}
console.log(`sweep: every code point in 10 contexts, ${checked} texts, no difference`);
