/**
 * Tokenizer benchmark: vocabulary load time and encode throughput, ours against the WASM
 * tiktoken (the official Rust core) on the same vocabulary, pattern and corpus.
 *
 * `deno run -A bench/tokenizer_bench.ts` prints a table of medians over several runs and
 * checks that both produce the same ids on every corpus. Under `deno bench` it registers
 * the encode benchmarks instead.
 *
 * @module
 */

import { Tiktoken } from "tiktoken";
import { K3_PAT_STR } from "../engine/text/pretokenize.ts";
import { parseTiktokenModel, Tokenizer } from "../engine/text/tokenizer.ts";

const ROOT = new URL("../", import.meta.url).pathname;
const RUNS = 7;

/** The o200k_base ranks of the npm package as `tiktoken.model` text (first `limit`). */
function o200kModel(limit = Infinity): string {
  const path = new URL(import.meta.resolve("tiktoken/encoders/o200k_base.json")).pathname;
  const parts = (JSON.parse(Deno.readTextFileSync(path)).bpe_ranks as string).split(" ");
  const lines: string[] = [];
  for (let i = 2; i < parts.length && lines.length < limit; i++) {
    lines.push(`${parts[i]} ${Number(parts[1]) + i - 2}\n`);
  }
  return lines.join("");
}

/** Text files of the repository (prose, TypeScript, C) plus tiktoken's README. */
function repoCorpus(): string {
  const texts: string[] = [];
  const walk = (dir: string) => {
    for (const e of [...Deno.readDirSync(dir)].sort((a, b) => a.name < b.name ? -1 : 1)) {
      const path = `${dir}/${e.name}`;
      if (
        e.isDirectory && !e.name.startsWith(".") && e.name !== "node_modules" &&
        e.name !== "tiny"
      ) walk(path);
      else if (e.isFile && /\.(ts|md|c|h|txt|py|json)$/.test(e.name)) {
        const bytes = Deno.statSync(path).size;
        if (bytes < 1 << 20) texts.push(Deno.readTextFileSync(path));
      }
    }
  };
  walk(ROOT.replace(/\/$/, ""));
  texts.push(Deno.readTextFileSync(`${ROOT}node_modules/tiktoken/README.md`));
  return texts.join("\n");
}

/** Deterministic multilingual text with few repeated words: a cache-hostile case. */
function multilingualCorpus(bytes: number): string {
  const words = [
    ..."中文 字 漢語 言語 日本 東京 北京 人工 智能".split(" "),
    ..."テキスト カタカナ ひらがな です ます こんにちは".split(" "),
    ..."한국어 텍스트 서울 안녕하세요".split(" "),
    ..."العربية مرحبا عالم שלום עולם Привет мир Ελληνικά".split(" "),
    ..."the of and to in is was for on that with as by at from".split(" "),
    "😀",
    "👍🏽",
    "👨‍👩‍👧",
    "é",
    "ß",
    "Øre",
    "naïve",
    "It's",
    "THEY'RE",
  ];
  let a = 12345;
  const rand = () => (a = (Math.imul(a, 1103515245) + 12345) >>> 0) / 4294967296;
  const out: string[] = [];
  let n = 0;
  while (n < bytes) {
    let w = words[Math.floor(rand() * words.length)];
    if (rand() < 0.5) w += Math.floor(rand() * 100000); // numbers keep pieces varied
    if (rand() < 0.3) w = w + words[Math.floor(rand() * words.length)];
    const sep = rand() < 0.1 ? "\n" : rand() < 0.1 ? ", " : " ";
    out.push(w + sep);
    n += w.length * 2 + 1;
  }
  return out.join("");
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

function time(fn: () => void): number {
  const t0 = performance.now();
  fn();
  return performance.now() - t0;
}

function sameIds(a: number[], b: ArrayLike<number>): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/** Prints the comparison table. */
function report(): void {
  const rows: string[][] = [];
  const model = o200kModel();
  const k3Sized = o200kModel(163584);

  for (const [name, text] of [["o200k, 199,998 ranks", model], ["K3-sized, 163,584", k3Sized]]) {
    const dir = Deno.makeTempDirSync({ prefix: "k3-bench-" });
    Deno.writeTextFileSync(`${dir}/tiktoken.model`, text);
    const ours: number[] = [];
    const wasm: number[] = [];
    for (let r = 0; r < RUNS; r++) {
      ours.push(time(() => Tokenizer.load(dir)));
      wasm.push(time(() => new Tiktoken(text, {}, K3_PAT_STR).free()));
    }
    Deno.removeSync(dir, { recursive: true });
    rows.push([
      `load ${name}`,
      `${median(ours).toFixed(0)} ms (first ${ours[0].toFixed(0)})`,
      `${median(wasm).toFixed(0)} ms`,
      (median(wasm) / median(ours)).toFixed(2),
    ]);
  }

  const ranks = parseTiktokenModel(model);
  const ref = new Tiktoken(model, {}, K3_PAT_STR);
  const corpora: [string, string][] = [
    ["repo prose+code", repoCorpus()],
    // Small and repeated: mostly piece-cache hits after the first copy.
    [
      "tokenizer_corpus.txt x64",
      Deno.readTextFileSync(`${ROOT}tests/fixtures/tokenizer_corpus.txt`).repeat(64),
    ],
    ["multilingual, varied", multilingualCorpus(1 << 20)],
  ];
  for (const [name, text] of corpora) {
    const mb = new TextEncoder().encode(text).length / 1e6;
    const ours: number[] = [];
    const wasm: number[] = [];
    let equal = true;
    for (let r = 0; r < RUNS; r++) {
      const tok = new Tokenizer(ranks); // fresh piece cache each run: no carry-over
      let ids: number[] = [];
      ours.push(time(() => ids = tok.encode(text)));
      let refIds: ArrayLike<number> = [];
      wasm.push(time(() => refIds = ref.encode_ordinary(text)));
      equal &&= sameIds(ids, refIds);
    }
    const o = mb / (median(ours) / 1000);
    const w = mb / (median(wasm) / 1000);
    rows.push([
      `encode ${name} (${mb.toFixed(2)} MB)${equal ? "" : " IDS DIFFER"}`,
      `${o.toFixed(1)} MB/s`,
      `${w.toFixed(1)} MB/s`,
      (o / w).toFixed(2),
    ]);
  }
  ref.free();

  const head = ["", "ours", "WASM tiktoken", "ratio (ours faster if > 1)"];
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (r: string[]) => r.map((c, i) => c.padEnd(widths[i])).join(" | ");
  console.log(`medians of ${RUNS} runs, o200k ranks with K3's pattern`);
  console.log(line(head));
  console.log(widths.map((w) => "-".repeat(w)).join("-|-"));
  for (const r of rows) console.log(line(r));
}

if (import.meta.main) report();

// Cases for `deno bench` (ignored by `deno run`).
const model = o200kModel();
const benchText = Deno.readTextFileSync(`${ROOT}tests/fixtures/tokenizer_corpus.txt`).repeat(4);
let ours: Tokenizer | undefined;
let ref: Tiktoken | undefined;
Deno.bench("encode corpus: ours (warm piece cache)", { group: "encode", baseline: true }, () => {
  ours ??= new Tokenizer(parseTiktokenModel(model));
  ours.encode(benchText);
});
Deno.bench("encode corpus: WASM tiktoken", { group: "encode" }, () => {
  ref ??= new Tiktoken(model, {}, K3_PAT_STR);
  ref.encode_ordinary(benchText);
});
