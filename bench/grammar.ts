/**
 * What constrained decoding costs per token on a vocabulary of the released size (163,840
 * ids): a synthetic tokenizer made of the tiny model's 768 ranks plus generated ranks
 * (words of the test corpus with and without a leading space, numbers, JSON punctuation,
 * whitespace runs, CJK characters) and 256 added tokens. Per step of a JSON reply that
 * follows a schema, side by side in one run:
 *
 * - greedy, the argmax allowed (the common case: one token checked);
 * - greedy, the three best tokens refused (re-takes of the argmax);
 * - sampled (temperature 1, top-p 0.95), the draw allowed;
 * - sampled, the draw refused (the whole mask and a second draw);
 * - the whole mask alone (what log probabilities pay every step).
 *
 * The mask's cost is the pick's time minus the sampler's own time on the same logits.
 * The reference token is a decode token of the tiny model measured in the same run (this
 * machine), and the floor-budget token of the real-width slice recorded in bench/README.md
 * (1.16 s); the target is under 2% of the latter.
 *
 *   deno run -A bench/grammar.ts [--steps 120] [--json]
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { parseAddedTokens, parseTiktokenModel, Tokenizer } from "../engine/text/tokenizer.ts";
import { compileSchema } from "../engine/generate/grammar/schema.ts";
import { startState } from "../engine/generate/grammar/forms.ts";
import { TokenConstraint, tokenSymbols } from "../engine/generate/grammar/mask.ts";
import { argmax, makeSampler } from "../engine/generate/sampling.ts";
import { openModel } from "../engine/open.ts";
import { Scheduler } from "../engine/generate/scheduler.ts";

const USAGE = "usage: deno run -A bench/grammar.ts [--steps N] [--json]";
const { values } = benchArgs(USAGE, { steps: { type: "string" }, json: { type: "boolean" } });
const STEPS = Number(values.steps ?? 120);
const VOCAB = 163_840;
const ADDED = 256;
/** The floor-budget token of the real-width slice, bench/README.md's memory ladder. */
const SLICE_FLOOR_TOKEN_S = 1.16;

const ROOT = new URL("..", import.meta.url).pathname;
const TINY = `${ROOT}tests/fixtures/tiny`;

/** A tiktoken.model of VOCAB - ADDED ranks: the tiny ones, then generated ones. */
function syntheticRanks(): string {
  const enc = new TextEncoder();
  const b64 = (b: Uint8Array) => btoa(String.fromCharCode(...b));
  const seen = new Set<string>();
  const lines: string[] = [];
  const add = (bytes: Uint8Array) => {
    const k = b64(bytes);
    if (bytes.length === 0 || seen.has(k) || lines.length >= VOCAB - ADDED) return;
    seen.add(k);
    lines.push(`${k} ${lines.length}`);
  };
  for (const line of Deno.readTextFileSync(`${TINY}/tiktoken.model`).split("\n")) {
    if (line.trim() === "") continue;
    add(Uint8Array.from(atob(line.split(" ")[0]), (c) => c.charCodeAt(0)));
  }
  const words = [
    ...new Set(Deno.readTextFileSync(`${ROOT}tests/fixtures/tokenizer_corpus.txt`).split(/[^\p{L}\p{N}]+/u)),
  ]
    .filter((w) => w.length > 0);
  const punct = [
    '"',
    '":',
    '",',
    '{"',
    '"}',
    "},",
    "],",
    "[",
    "]",
    "{",
    "}",
    ":",
    ",",
    '":"',
    '","',
    '":[',
    "null",
    "true",
    "false",
  ];
  for (const p of punct) add(enc.encode(p));
  for (let n = 1; n <= 32; n++) add(enc.encode(" ".repeat(n))), add(enc.encode("\n" + " ".repeat(n - 1)));
  for (let i = 0; i < 100_000 && lines.length < VOCAB - ADDED; i++) add(enc.encode(String(i)));
  let seed = 12345;
  const rand = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
  for (let round = 0; lines.length < VOCAB - ADDED; round++) {
    // Corpus pieces first, then (the corpus being small) pairs of pieces, so the count is reached.
    const w = words[Math.floor(rand() * words.length)];
    const cut = 1 + Math.floor(rand() * w.length);
    let piece = round % 3 === 0 ? w : rand() < 0.5 ? w.slice(0, cut) : w.slice(cut - 1);
    if (round > 200_000) piece += words[Math.floor(rand() * words.length)].slice(0, 1 + Math.floor(rand() * 4));
    add(enc.encode(piece)), add(enc.encode(" " + piece)), add(enc.encode(piece[0].toUpperCase() + piece.slice(1)));
    if (round % 5 === 0) add(enc.encode(String.fromCodePoint(0x4e00 + Math.floor(rand() * 20000))));
  }
  return lines.join("\n") + "\n";
}

/** The synthetic tokenizer: VOCAB - ADDED ranks and the tiny model's 256 added tokens at the top. */
function syntheticTokenizer(): Tokenizer {
  const table = parseTiktokenModel(syntheticRanks());
  const tinyAdded = parseAddedTokens(Deno.readTextFileSync(`${TINY}/tokenizer_config.json`));
  const added = tinyAdded.map((t, i) => ({ ...t, id: VOCAB - ADDED + i }));
  return new Tokenizer(table, added);
}

const SCHEMA = {
  type: "object",
  properties: {
    title: { type: "string", maxLength: 80 },
    year: { type: "integer" },
    rating: { type: "number" },
    genres: { type: "array", items: { enum: ["drama", "comedy", "horror", "documentary"] }, maxItems: 4 },
    cast: {
      type: "array",
      items: {
        type: "object",
        properties: { name: { type: "string" }, role: { type: "string" } },
        required: ["name"],
        additionalProperties: false,
      },
    },
    sequel: { type: ["string", "null"] },
  },
  required: ["title", "year", "genres", "cast"],
  additionalProperties: false,
};
const DOC = {
  title: "The long night of the quiet harbour",
  year: 1987,
  rating: 7.25,
  genres: ["drama", "documentary"],
  cast: [{ name: "Ann Lee", role: "the keeper" }, { name: "Bo Park" }, { name: "Chidi Okafor", role: "a sailor" }],
  sequel: null,
};

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor(s.length / 2)];
}

const tBuild = performance.now();
const tok = syntheticTokenizer();
const symbols = tokenSymbols(tok, VOCAB);
const buildSeconds = (performance.now() - tBuild) / 1000;
const eos = tok.specialId("[EOS]");
const spec = { kind: "value" as const, value: compileSchema(SCHEMA) };
const target = [...tok.encode(JSON.stringify(DOC, null, 2)), eos];

/** Logits over VOCAB with `top` highest, then `refused` (refused ids) just below or above it. */
function logitsFor(top: number, above: number[], seed: number, peak: number): Float32Array {
  const l = new Float32Array(VOCAB);
  let s = seed >>> 0 || 1;
  for (let i = 0; i < VOCAB; i++) {
    s ^= s << 13, s ^= s >>> 17, s ^= s << 5;
    l[i] = ((s >>> 0) / 2 ** 32 - 0.5) * 4;
  }
  l[top] = peak;
  above.forEach((id, k) => (l[id] = peak + 3 - k));
  return l;
}

type Mode = "greedy" | "greedy_refused" | "sampled" | "sampled_refused" | "full_mask";
const costs: Record<Mode, number[]> = {
  greedy: [],
  greedy_refused: [],
  sampled: [],
  sampled_refused: [],
  full_mask: [],
};
const chooseSeconds: Record<string, number[]> = { greedy: [], sampled: [] };
const sampler = () => makeSampler({ temperature: 1, topP: 0.95, topK: 0, minP: 0, seed: 1 });

const steps = Math.min(STEPS, target.length);
const state0 = startState(spec, tok, [eos]);
// One constraint per mode, each stepped along the same target tokens.
const runs: Record<Mode, TokenConstraint> = {
  greedy: new TokenConstraint(symbols, state0),
  greedy_refused: new TokenConstraint(symbols, state0),
  sampled: new TokenConstraint(symbols, state0),
  sampled_refused: new TokenConstraint(symbols, state0),
  full_mask: new TokenConstraint(symbols, state0, true),
};
for (let i = 0; i < steps; i++) {
  const want = target[i];
  // Three tokens the grammar refuses here (to sit above the wanted one).
  const refused: number[] = [];
  for (let id = 1000; refused.length < 3; id += 7919) {
    if (symbols.step(runs.greedy.state, id % VOCAB).length === 0) refused.push(id % VOCAB);
  }
  for (const mode of Object.keys(runs) as Mode[]) {
    const sampled = mode.startsWith("sampled");
    // Sampled: the wanted token holds nearly all the mass, so the draw is it (or, refused, one of those above).
    const peak = sampled ? 40 : 3;
    const base = logitsFor(want, mode.endsWith("refused") ? refused : [], i + 1, peak);
    const sample = sampled ? sampler() : argmax;
    // Time inside the sampler, so the mask's share is the pick's time minus it.
    let inChoose = 0;
    const refusedDraw = mode === "sampled_refused";
    let first = true;
    const choose = (l: Float32Array) => {
      const c0 = performance.now();
      // sampled_refused: the first draw is one of the refused tokens, as a model's would be.
      const t = refusedDraw && first ? refused[0] : sample(l);
      if (refusedDraw && first) sample(l);
      first = false;
      inChoose += performance.now() - c0;
      return t;
    };
    const a = base.slice();
    const t0 = performance.now();
    sample === argmax ? argmax(a) : sampler()(a);
    const t1 = performance.now();
    const b = base.slice();
    const t2 = performance.now();
    const got = runs[mode].pick(b, sample === argmax && !refusedDraw ? argmax : choose);
    const t3 = performance.now();
    if (got !== want) throw new Error(`${mode}: step ${i} picked ${got}, wanted ${want}`);
    chooseSeconds[sampled ? "sampled" : "greedy"].push((t1 - t0) / 1000);
    // Greedy passes argmax itself (the constraint re-takes it lazily): its time is the pick's minus one argmax.
    const own = sample === argmax && !refusedDraw ? t1 - t0 : inChoose;
    costs[mode].push(Math.max(0, t3 - t2 - own) / 1000);
  }
}

// The reference: decode tokens of the tiny model, in this run.
const opened = await openModel(TINY, { capacity: 64 });
const decode: number[] = [];
try {
  const r = await new Scheduler(opened.model).submit({ prompt: [1, 2, 3, 4], maxTokens: 33 });
  decode.push(...r.stepSeconds.slice(1));
} finally {
  await opened.close();
}
const tinyToken = median(decode);

const load = Deno.readTextFileSync("/proc/loadavg").trim();
const rows = (Object.keys(costs) as Mode[]).map((mode) => {
  const m = median(costs[mode]);
  return {
    mode,
    mask_ms_median: m * 1000,
    mask_ms_max: Math.max(...costs[mode]) * 1000,
    ratio_to_tiny_token: m / tinyToken,
    ratio_to_slice_floor_token: m / SLICE_FLOOR_TOKEN_S,
  };
});
console.log(
  `vocabulary ${VOCAB} (${symbols.order.length} byte tokens, ${symbols.specials.length} special); built in ${
    buildSeconds.toFixed(2)
  } s`,
);
console.log(`${steps} steps of a ${target.length}-token reply; load ${load}`);
console.log(
  `sampler alone: greedy ${(median(chooseSeconds.greedy) * 1000).toFixed(3)} ms, sampled ${
    (median(chooseSeconds.sampled) * 1000).toFixed(3)
  } ms`,
);
console.log(
  `reference: tiny decode token ${
    (tinyToken * 1000).toFixed(2)
  } ms (measured now); real-width slice floor token ${SLICE_FLOOR_TOKEN_S} s (bench/README.md)`,
);
console.log("mode              mask ms (median)  max ms   / tiny token  / slice floor token");
for (const r of rows) {
  console.log(
    `${r.mode.padEnd(17)} ${r.mask_ms_median.toFixed(3).padStart(16)} ${r.mask_ms_max.toFixed(2).padStart(8)} ${
      (r.ratio_to_tiny_token * 100).toFixed(1).padStart(11)
    }% ${(r.ratio_to_slice_floor_token * 100).toFixed(3).padStart(16)}%`,
  );
}
if (values.json) {
  console.log(JSON.stringify({
    bench: "grammar",
    vocab: VOCAB,
    steps,
    load,
    build_seconds: buildSeconds,
    tiny_token_seconds: tinyToken,
    slice_floor_token_seconds: SLICE_FLOOR_TOKEN_S,
    sampler_seconds: { greedy: median(chooseSeconds.greedy), sampled: median(chooseSeconds.sampled) },
    modes: rows,
  }));
}
