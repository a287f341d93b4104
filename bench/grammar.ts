/**
 * What constrained decoding costs per token on a vocabulary of the released size (163,840
 * ids): a synthetic tokenizer made of the tiny model's 768 ranks plus generated ranks
 * (words of the test corpus with and without a leading space, numbers, JSON punctuation,
 * whitespace runs, CJK characters) and 256 added tokens. Per step of a JSON reply, once
 * following a schema and once as any JSON (`json_object`: free keys), per step of the same
 * document as a forced tool call in the trained form (`tool_call`: argument elements, strings
 * raw), and once following a schema as clients write them (`client`: integer and number
 * bounds, a pattern, the uuid, date-time, email and uri formats; `client_tool`: the same as
 * a forced tool call's arguments, the strings raw), each mode with its own
 * constraint (so its state table and mask cache start cold every round):
 *
 * - greedy, the argmax allowed (the common case: one token checked);
 * - greedy, the three best tokens refused (re-takes of the argmax);
 * - sampled (temperature 1, top-p 0.95): the whole mask, then one draw among the allowed
 *   tokens (one draw for every mode: a seed draws the same whatever else is asked);
 * - sampled, the three most likely tokens refused (the same path; the draw sees them masked);
 * - the whole mask alone (what log probabilities pay every step), with its worst case by
 *   the kind of state it was computed in (entering a string, a key, a number ...).
 *
 * The mask's cost is the pick's time minus the sampler's own time on the same logits. The
 * reference is a floor-budget decode token of the real-width slice (trunk 2.5 GB, expert
 * cache 0.31 GB), measured in the same run: rounds alternate one slice token with one pass
 * over the replies. The target is under 2% of that token.
 *
 * Then the trained tiny model (tests/fixtures/tiny-en) writes constrained replies, greedy
 * and sampled: the reply it writes, and the mask's cost per token on its own tokens,
 * against its own decode token and the slice's.
 *
 *   deno run -A bench/grammar.ts [--rounds 3] [--steps N] [--json] [--skip-slice]
 *
 * The slice (/var/tmp/k3-bench/slice-3l-32e and its packed trunk -trunk) is only read; it
 * is built by bench/limits.ts. Without it, or with --skip-slice, the ratios are left out.
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { parseAddedTokens, parseTiktokenModel, Tokenizer } from "../engine/text/tokenizer.ts";
import { compileSchema } from "../engine/generate/grammar/schema.ts";
import { type GrammarSpec, startState, TOOL_MARKUP } from "../engine/generate/grammar/forms.ts";
import { argumentElements, pythonJson } from "../engine/text/chat.ts";
import { TokenConstraint, tokenSymbols } from "../engine/generate/grammar/mask.ts";
import { argmax, makeSampler } from "../engine/generate/sampling.ts";
import { openModel } from "../engine/open.ts";
import { Scheduler, type TokenFilter } from "../engine/generate/scheduler.ts";
import { Lit, Num, Obj, type State, Str, Value } from "../engine/generate/grammar/automaton.ts";
import { Ranged } from "../engine/generate/grammar/numbers.ts";
import { PatternStr } from "../engine/generate/grammar/patterns.ts";

const USAGE = "usage: deno run -A bench/grammar.ts [--rounds N] [--steps N] [--json] [--skip-slice]";
const { values } = benchArgs(USAGE, {
  steps: { type: "string" },
  rounds: { type: "string" },
  json: { type: "boolean" },
  "skip-slice": { type: "boolean" },
});
const STEPS = Number(values.steps ?? 1000);
const ROUNDS = Number(values.rounds ?? 3);
if (!(STEPS >= 1 && ROUNDS >= 1)) {
  console.error(`k3: --steps and --rounds must be positive integers\n${USAGE}`);
  Deno.exit(2);
}
const VOCAB = 163_840;
const ADDED = 256;
const SLICE_DIR = "/var/tmp/k3-bench/slice-3l-32e";
const SLICE_TRUNK = `${SLICE_DIR}-trunk`;

const ROOT = new URL("..", import.meta.url).pathname;
const TINY = `${ROOT}tests/fixtures/tiny`;
const TINY_EN = `${ROOT}tests/fixtures/tiny-en`;

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
const log = (s: string) => console.error(`grammar: ${s}`);
const load = () => Deno.readTextFileSync("/proc/loadavg").trim().split(" ").slice(0, 3).join(" ");

log("building the 163,840-id vocabulary");
const tBuild = performance.now();
const tok = syntheticTokenizer();
const symbols = tokenSymbols(tok, VOCAB);
const buildSeconds = (performance.now() - tBuild) / 1000;
const eos = tok.specialId("[EOS]");
const target = [...tok.encode(JSON.stringify(DOC, null, 2)), eos];
/** The forced call of get_record with the arguments `doc`, in the trained form (argument
 * elements, strings raw, other values as the encoder writes them), after an empty
 * response channel. */
function callTarget(doc: unknown): number[] {
  const m = TOOL_MARKUP;
  const args = argumentElements(pythonJson(doc))!.map((e) => m.openArgument(e.key, e.type) + e.text + m.closeArgument);
  const text = m.closeResponse + m.openTools + m.openCall("get_record", 1) + args.join("") + m.closeCall +
    m.closeTools + m.closeMessage;
  return [...tok.encode(text, { allowSpecial: true }), eos];
}
/** A forced call of get_record whose arguments follow `schema`. */
const forcedCall = (schema: unknown): GrammarSpec => ({
  kind: "tools",
  tools: [{ name: "get_record", args: compileSchema(schema) }],
  parallel: false,
  reply: "response",
});
/** What clients generate (zod 4, pydantic): integer and number bounds, a pattern, formats. */
const CLIENT_SCHEMA = {
  type: "object",
  properties: {
    id: { type: "string", format: "uuid" },
    created: { type: "string", format: "date-time" },
    email: { type: "string", format: "email" },
    code: { type: "string", pattern: "^[A-Z]{2}-\\d{3}$" },
    site: { type: "string", format: "uri" },
    count: { type: "integer", minimum: -9007199254740991, maximum: 9007199254740991 },
    score: { type: "number", minimum: 0, exclusiveMaximum: 10 },
    step: { type: "integer", minimum: 0, maximum: 1000, multipleOf: 5 },
  },
  required: ["id", "created", "email", "code", "site", "count", "score", "step"],
  additionalProperties: false,
};
const CLIENT_DOC = {
  id: "123e4567-e89b-12d3-a456-426614174000",
  created: "2024-02-29T12:00:00Z",
  email: "ann.lee@example.com",
  code: "KX-042",
  site: "https://example.com/harbour?night=long",
  count: 1234567,
  score: 7.25,
  step: 125,
};
const GRAMMARS: Record<string, { spec: GrammarSpec; target: number[] }> = {
  schema: { spec: { kind: "value", value: compileSchema(SCHEMA) }, target },
  json_object: { spec: { kind: "value", value: compileSchema({}) }, target },
  // tool_choice named, the trained form (the floor token is the same reference).
  tool_call: { spec: forcedCall(SCHEMA), target: callTarget(DOC) },
  client: {
    spec: { kind: "value", value: compileSchema(CLIENT_SCHEMA) },
    target: [...tok.encode(JSON.stringify(CLIENT_DOC, null, 2)), eos],
  },
  // The same as a forced tool's arguments: the patterned and formatted strings written raw.
  client_tool: { spec: forcedCall(CLIENT_SCHEMA), target: callTarget(CLIENT_DOC) },
};
type GrammarName = keyof typeof GRAMMARS;

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

/** The kind of state a whole mask is computed in: what the next bytes may be. */
function stateKind(state: State): string {
  if (state.length !== 1) return "alternatives";
  const top = state[0].top;
  if (top instanceof Str) return top.n === 0 && top.esc === 0 && top.cont === 0 ? "string entry" : "string";
  if (top instanceof Obj) return top.phase === 2 ? (top.key === "" ? "key entry" : "key") : "object";
  if (top instanceof Num) return "number";
  if (top instanceof Ranged) return "bounded number";
  if (top instanceof PatternStr) return top.n === 0 && top.mode === 0 ? "pattern entry" : "pattern";
  if (top instanceof Value) return "value start";
  if (top instanceof Lit) return "literal";
  return top.constructor.name.toLowerCase();
}

type Mode = "greedy" | "greedy_refused" | "sampled" | "sampled_refused" | "full_mask";
const MODES: Mode[] = ["greedy", "greedy_refused", "sampled", "sampled_refused", "full_mask"];
const costs: Record<string, number[]> = {}; // `${grammar} ${mode}` -> seconds per step
// The whole mask at each step of each grammar, one time per round, and the kind of state.
const wholeMask: Record<string, { kind: string; seconds: number[] }> = {};
const roundMax: number[] = []; // the largest whole mask of each round
const chooseSeconds: Record<string, number[]> = { greedy: [], sampled: [] };
const sampler = () => makeSampler({ temperature: 1, topP: 0.95, topK: 0, minP: 0, seed: 1 });
const stepsOf = (g: GrammarName) => Math.min(STEPS, GRAMMARS[g].target.length);
const steps = Math.max(...Object.keys(GRAMMARS).map(stepsOf));

/** One pass over the reply in every mode, each with a fresh constraint. */
function maskRound(): void {
  let worst = 0;
  for (const g of Object.keys(GRAMMARS) as GrammarName[]) {
    const state0 = startState(GRAMMARS[g].spec, tok, [eos]);
    const runs = Object.fromEntries(MODES.map((m) => [m, new TokenConstraint(symbols, state0, m === "full_mask")]));
    for (let i = 0; i < stepsOf(g); i++) {
      const want = GRAMMARS[g].target[i];
      // Three tokens the grammar refuses here (to sit above the wanted one).
      const refused: number[] = [];
      for (let id = 1000; refused.length < 3; id += 7919) {
        if (symbols.step(runs.greedy.state, id % VOCAB).length === 0) refused.push(id % VOCAB);
      }
      for (const mode of MODES) {
        const sampled = mode.startsWith("sampled");
        // Sampled: the wanted token holds nearly all the mass, so the draw is it (or, refused, one of those above).
        const peak = sampled ? 40 : 3;
        const base = logitsFor(want, mode.endsWith("refused") ? refused : [], i + 1, peak);
        const sample = sampled ? sampler() : argmax;
        // Time inside the sampler, so the mask's share is the pick's time minus it.
        let inChoose = 0;
        // A sampled pick takes the whole mask, then draws once among the allowed tokens (one
        // draw for every mode), so refused tokens above the wanted one never reach the draw.
        const choose = (l: Float32Array) => {
          const c0 = performance.now();
          const t = sample(l);
          inChoose += performance.now() - c0;
          return t;
        };
        const a = base.slice();
        const t0 = performance.now();
        sample === argmax ? argmax(a) : sampler()(a);
        const t1 = performance.now();
        const b = base.slice();
        const kind = mode === "full_mask" ? stateKind(runs[mode].state) : "";
        const t2 = performance.now();
        const got = runs[mode].pick(b, sample === argmax ? argmax : choose);
        const t3 = performance.now();
        if (got !== want) throw new Error(`${g} ${mode}: step ${i} picked ${got}, wanted ${want}`);
        chooseSeconds[sampled ? "sampled" : "greedy"].push((t1 - t0) / 1000);
        // Greedy passes argmax itself (the constraint re-takes it lazily): its time is the pick's minus one argmax.
        const own = sample === argmax ? t1 - t0 : inChoose;
        const cost = Math.max(0, t3 - t2 - own) / 1000;
        (costs[`${g} ${mode}`] ??= []).push(cost);
        if (mode === "full_mask") {
          (wholeMask[`${g} ${i}`] ??= { kind, seconds: [] }).seconds.push(cost);
          worst = Math.max(worst, cost);
        }
      }
    }
  }
  roundMax.push(worst);
}

/** The slice at the floor budget, one decode token per call (or undefined: no slice). */
async function sliceFloor() {
  if (values["skip-slice"]) return undefined;
  try {
    await Deno.stat(`${SLICE_DIR}/slice.json`);
    await Deno.stat(`${SLICE_TRUNK}/manifest.json`);
  } catch {
    log(`no slice at ${SLICE_DIR} (bench/limits.ts builds it): ratios to its token left out`);
    return undefined;
  }
  const opened = await openModel(SLICE_DIR, {
    capacity: 64,
    chunk: 16,
    memory: { trunkDir: SLICE_TRUNK, trunkGB: 2.5, cacheGB: 0.31 },
  });
  const m = opened.model;
  const st = m.newState();
  log("slice floor: prefill");
  let last = [11, 222, 3333, 4444];
  await m.pass([{ state: st, ids: last, logits: "last" }]);
  let next = 5555;
  return {
    async token(): Promise<number> {
      const t0 = performance.now();
      const [logits] = await m.pass([{ state: st, ids: [next], logits: "last" }]);
      const s = (performance.now() - t0) / 1000;
      last = [next];
      next = logits ? argmax(logits) : (next + 1) % 32768;
      return s;
    },
    async close() {
      st.free();
      await opened.close();
    },
  };
}

const slice = await sliceFloor();
const sliceTokens: number[] = [];
const sliceLoads: string[] = [];
try {
  if (slice) await slice.token(); // warm: the first token also faults the pinned trunk in
  for (let r = 0; r < ROUNDS; r++) {
    if (slice) {
      log(`round ${r + 1} of ${ROUNDS}: a slice floor token`);
      sliceTokens.push(await slice.token());
      sliceLoads.push(load());
    }
    log(
      `round ${r + 1} of ${ROUNDS}: the masks (up to ${steps} steps x ${MODES.length} modes x ${
        Object.keys(GRAMMARS).length
      } grammars)`,
    );
    maskRound();
  }
} finally {
  await slice?.close();
}
const sliceToken = sliceTokens.length > 0 ? median(sliceTokens) : NaN;

// The trained tiny model writes constrained replies: greedy and sampled, timed per pick.
const TINY_SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 40 },
    age: { type: "integer" },
    city: { type: "string", maxLength: 40 },
  },
  required: ["name", "age", "city"],
  additionalProperties: false,
};
const TINY_PROMPT = "The man said that his name was";
interface TinyReply {
  grammar: string;
  sampling: string;
  text: string;
  tokens: number;
  valid_json: boolean;
  mask_ms_per_token: number;
  decode_ms_per_token: number;
}
const tinyReplies: TinyReply[] = [];
let tinyTokenSeconds = NaN;
try {
  await Deno.stat(`${TINY_EN}/config.json`);
  log("tiny-en: constrained replies");
  const enTok = Tokenizer.load(TINY_EN);
  const opened = await openModel(TINY_EN, { capacity: 1024 });
  try {
    const vocab = opened.model.cfg.vocabSize;
    const enEos = enTok.specialId("[EOS]");
    const prompt = enTok.encode(TINY_PROMPT);
    const plain = await new Scheduler(opened.model).submit({ prompt, maxTokens: 33 });
    tinyTokenSeconds = median(plain.stepSeconds.slice(1));
    const specs = { any_json: compileSchema({}), schema: compileSchema(TINY_SCHEMA) };
    for (const [name, value] of Object.entries(specs)) {
      for (const sampling of ["greedy", "sampled"]) {
        const inner = new TokenConstraint(
          tokenSymbols(enTok, vocab),
          startState({ kind: "value", value }, enTok, [enEos]),
        );
        const pickSeconds: number[] = [];
        const base = sampling === "greedy"
          ? argmax
          : makeSampler({ temperature: 0.8, topP: 0.95, topK: 0, minP: 0, seed: 7 });
        let inChoose = 0;
        const choose = (l: Float32Array) => {
          const c0 = performance.now();
          const t = base(l);
          inChoose += performance.now() - c0;
          return t;
        };
        const grammar: TokenFilter = {
          pick(logits, _choose) {
            inChoose = 0;
            const t0 = performance.now();
            const t = inner.pick(logits, base === argmax ? argmax : choose);
            // Greedy: the constraint calls argmax itself; count one argmax as the sampler's.
            const a0 = performance.now();
            if (base === argmax) argmax(logits.slice());
            const own = base === argmax ? performance.now() - a0 : inChoose;
            pickSeconds.push(Math.max(0, a0 - t0 - own) / 1000);
            return t;
          },
        };
        const r = await new Scheduler(opened.model).submit({ prompt, maxTokens: 600, stopIds: [enEos], grammar });
        const text = enTok.decode(r.tokens.filter((t) => t !== enEos));
        let valid = false;
        try {
          JSON.parse(text);
          valid = r.finishReason === "stop";
        } catch { /* cut off by max tokens */ }
        tinyReplies.push({
          grammar: name,
          sampling,
          text,
          tokens: r.tokens.length,
          valid_json: valid,
          mask_ms_per_token: median(pickSeconds) * 1000,
          decode_ms_per_token: median(r.stepSeconds.slice(1)) * 1000,
        });
      }
    }
  } finally {
    await opened.close();
  }
} catch (e) {
  if (!(e instanceof Deno.errors.NotFound)) throw e;
  log(`no trained model at ${TINY_EN}: its replies left out`);
}

const pct = (x: number) => Number.isFinite(x) ? `${(x * 100).toFixed(3)}%` : "n/a";
const rows = Object.entries(costs).map(([key, xs]) => {
  const [grammar, mode] = key.split(" ");
  const m = median(xs);
  return {
    grammar,
    mode,
    mask_ms_median: m * 1000,
    mask_ms_max: Math.max(...xs) * 1000,
    ratio_to_slice_floor_token: m / sliceToken,
  };
});
// By kind of state: each step's median over the rounds (a single time under load is often
// the machine: a preempted or collected step), the worst step of the kind, and the largest
// single time seen.
const byKind: Record<string, { step: number[]; raw: number[] }> = {};
for (const [key, { kind, seconds }] of Object.entries(wholeMask)) {
  const k = (byKind[`${key.split(" ")[0]} ${kind}`] ??= { step: [], raw: [] });
  k.step.push(median(seconds)), k.raw.push(...seconds);
}
const kinds = Object.entries(byKind).map(([key, { step, raw }]) => {
  const [grammar, ...kind] = key.split(" ");
  const worstStep = Math.max(...step);
  return {
    grammar,
    kind: kind.join(" "),
    steps: step.length,
    whole_mask_ms_median: median(step) * 1000,
    whole_mask_ms_worst_step: worstStep * 1000,
    whole_mask_ms_max_single: Math.max(...raw) * 1000,
    worst_step_ratio_to_slice_floor_token: worstStep / sliceToken,
  };
}).sort((a, b) => b.whole_mask_ms_worst_step - a.whole_mask_ms_worst_step);
const worst = kinds.length > 0 ? kinds[0].whole_mask_ms_worst_step / 1000 : NaN;

console.log(
  `vocabulary ${VOCAB} (${symbols.order.length} byte tokens, ${symbols.specials.length} special); built in ${
    buildSeconds.toFixed(2)
  } s`,
);
console.log(
  `${ROUNDS} rounds of up to ${steps} steps of a ${target.length}-token reply (tool_call: ${GRAMMARS.tool_call.target.length}); load ${load()}`,
);
console.log(
  `sampler alone: greedy ${(median(chooseSeconds.greedy) * 1000).toFixed(3)} ms, sampled ${
    (median(chooseSeconds.sampled) * 1000).toFixed(3)
  } ms`,
);
console.log(
  Number.isFinite(sliceToken)
    ? `slice floor token (this run, alternating with the masks): median ${sliceToken.toFixed(3)} s of ${
      sliceTokens.map((t) => t.toFixed(2)).join(", ")
    } (load ${sliceLoads.join(" | ")})`
    : "slice floor token: not measured (--skip-slice or no slice)",
);
console.log("grammar      mode              mask ms (median)  max ms   / slice floor token (median)");
for (const r of rows) {
  console.log(
    `${r.grammar.padEnd(12)} ${r.mode.padEnd(17)} ${r.mask_ms_median.toFixed(3).padStart(16)} ${
      r.mask_ms_max.toFixed(2).padStart(8)
    } ${pct(r.ratio_to_slice_floor_token).padStart(12)}`,
  );
}
console.log(
  "whole mask by state (each step: median of its rounds): grammar, kind, steps, median ms, worst step ms, " +
    "largest single ms, worst step / slice floor token",
);
for (const k of kinds) {
  console.log(
    `  ${k.grammar.padEnd(12)} ${k.kind.padEnd(14)} ${String(k.steps).padStart(5)} ${
      k.whole_mask_ms_median.toFixed(3).padStart(9)
    } ${k.whole_mask_ms_worst_step.toFixed(2).padStart(8)} ${k.whole_mask_ms_max_single.toFixed(2).padStart(8)} ${
      pct(k.worst_step_ratio_to_slice_floor_token).padStart(9)
    }`,
  );
}
console.log(
  `worst whole mask (the worst step, median of its rounds): ${(worst * 1000).toFixed(2)} ms, ${
    pct(worst / sliceToken)
  } of the slice floor token; the largest single time of each round: ${
    roundMax.map((x) => (x * 1000).toFixed(1)).join(", ")
  } ms`,
);
if (tinyReplies.length > 0) {
  console.log(
    `tiny-en (${TINY_PROMPT} ...), its decode token ${(tinyTokenSeconds * 1000).toFixed(2)} ms:`,
  );
  for (const r of tinyReplies) {
    console.log(
      `  ${r.grammar} ${r.sampling}: ${r.tokens} tokens, ${r.valid_json ? "valid JSON" : "cut off"}, mask ${
        r.mask_ms_per_token.toFixed(3)
      } ms/token (${pct(r.mask_ms_per_token / 1000 / tinyTokenSeconds)} of its token, ${
        pct(r.mask_ms_per_token / 1000 / sliceToken)
      } of the slice's): ${JSON.stringify(r.text)}`,
    );
  }
}
if (values.json) {
  console.log(JSON.stringify({
    bench: "grammar",
    vocab: VOCAB,
    rounds: ROUNDS,
    steps,
    load: load(),
    build_seconds: buildSeconds,
    slice_floor_token_seconds: Number.isFinite(sliceToken) ? sliceToken : null,
    slice_floor_tokens: sliceTokens,
    sampler_seconds: { greedy: median(chooseSeconds.greedy), sampled: median(chooseSeconds.sampled) },
    modes: rows,
    whole_mask_by_state: kinds,
    worst_whole_mask_seconds: worst,
    largest_whole_mask_per_round_seconds: roundMax,
    worst_whole_mask_ratio_to_slice_floor_token: Number.isFinite(sliceToken) ? worst / sliceToken : null,
    tiny_en: { prompt: TINY_PROMPT, decode_token_seconds: tinyTokenSeconds, replies: tinyReplies },
  }));
}
