/**
 * What the conversation state cache buys: time to first token per turn of a six-turn chat
 * with the cache on and off (each turn's request is the whole conversation again, as an
 * OpenAI client sends it; the two schedulers alternate turn by turn on one opened model,
 * so both see the same machine load), and a batch of lines sharing a long prefix with the
 * cache on and off (alternating repetitions). Both are checked to give the same tokens.
 * Ends with the full model's projection from its memory plan: state bytes per position
 * and per conversation, and the passes a cached turn skips.
 *
 *   deno run -A bench/prefix_cache.ts [--model DIR] [--tok DIR] [--turns 6] [--gen 8]
 *     [--lines 16] [--shared 500] [--reps 3] [--rules 12] [--terse] [--chunk 16]
 *     [--trunk DIR --trunk-gb X --cache-gb Y] [--json]
 *
 * `--rules N`: sentences of the system prompt (12: ~330 tokens). `--terse`: user turns and
 * line tails of a few ids (the chat markup alone is ~75 ids a turn). Every request prints
 * a progress line on stderr (prompt, cached and prefilled positions, bytes read, seconds).
 * On a real-width slice at the floor every pass streams the trunk and a row costs ~0.1 s
 * of compute, so keep the rows few and the passes wide (the tokenizer comes from the tiny
 * fixture, whose ids the slice's 32,768-row vocabulary covers):
 *   deno run -A bench/prefix_cache.ts --model SLICE --tok tests/fixtures/tiny --trunk TRUNK \
 *     --trunk-gb 2.35 --cache-gb 0.3 --turns 6 --gen 1 --reps 1 --rules 1 --terse \
 *     --lines 16 --shared 48 --chunk 64
 *
 * @module
 */

import { benchArgs, median } from "./args.ts";
import { openModel } from "../engine/open.ts";
import { Scheduler } from "../engine/generate/scheduler.ts";
import { chatCachePoints, StateCache } from "../engine/generate/state_cache.ts";
import { type ChatMessage, chatPrompt, stopIds } from "../engine/text/chat.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { sharedPrefixes } from "../cli/batch/shared_prefix.ts";
import { shownMessage } from "../cli/reply.ts";
import { estimatedInput, makePlan } from "../engine/weights/plan.ts";
import { releasedK3 } from "../engine/model/shapes.ts";
import { stateBytes } from "../engine/model/state.ts";
import { readActivity } from "../engine/native/io.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const USAGE = "usage: deno run -A bench/prefix_cache.ts [--model DIR] [--tok DIR] [--turns 6] [--gen 8] " +
  "[--lines 16] [--shared 500] [--reps 3] [--rules 12] [--terse] [--chunk 16] " +
  "[--trunk DIR --trunk-gb X --cache-gb Y] [--json]";
const { values } = benchArgs(USAGE, {
  model: { type: "string", default: `${ROOT}tests/fixtures/tiny` },
  tok: { type: "string" },
  turns: { type: "string", default: "6" },
  gen: { type: "string", default: "8" },
  lines: { type: "string", default: "16" },
  shared: { type: "string", default: "500" },
  reps: { type: "string", default: "3" },
  rules: { type: "string", default: "12" },
  terse: { type: "boolean" },
  chunk: { type: "string", default: "16" },
  trunk: { type: "string" },
  "trunk-gb": { type: "string" },
  "cache-gb": { type: "string" },
  json: { type: "boolean" },
});
const turns = Number(values.turns), gen = Number(values.gen), nLines = Number(values.lines);
const sharedLen = Number(values.shared), reps = Number(values.reps), chunk = Number(values.chunk);
// `--turns 0` or `--lines 0` leaves that part out (a long run split in two).
for (
  const [name, v, min] of [["turns", turns, 0], ["gen", gen, 1], ["lines", nLines, 0], ["reps", reps, 1], [
    "chunk",
    chunk,
    1,
  ]] as const
) {
  if (!Number.isInteger(v) || v < min) {
    console.error(`--${name} must be an integer of at least ${min}\n${USAGE}`);
    Deno.exit(2);
  }
}
const tok = Tokenizer.load(values.tok ?? values.model!);
const memory = values.trunk
  ? {
    trunkDir: values.trunk,
    trunkGB: values["trunk-gb"] ? Number(values["trunk-gb"]) : undefined,
    cacheGB: values["cache-gb"] ? Number(values["cache-gb"]) : undefined,
  }
  : undefined;

const started = performance.now();
const elapsed = () => `${((performance.now() - started) / 1000).toFixed(0)} s`;
const progress = (line: string) => console.error(`prefix_cache ${elapsed()}: ${line}`);
const capacity = Math.max(4096, sharedLen + 64 + gen);
const opened = await openModel(values.model!, { capacity, chunk, sequences: Math.max(1, nLines), memory });
const { model } = opened;
// A slice's vocabulary is wider than the tiny tokenizer's: its ids beyond decode as placeholders.
tok.forModel(model.cfg.vocabSize);
const ends = stopIds(tok);
/** How the server reads a reply of this chat (no stop strings, no tools). */
const SHAPE = { chat: { thinking: true, tools: false }, stops: [] };

/** A system prompt (an agent's instructions and tool list) and short user turns. */
const system = Array.from(
  { length: Number(values.rules) },
  (_, i) => `Rule ${i + 1}: answer with care and cite tool ${i}.`,
).join(" ");
const users = Array.from(
  { length: turns },
  (_, i) => values.terse ? `Q${i + 1}?` : `Question ${i + 1}: what comes after ${i + 1}, and why?`,
);

/** One request on `s`: seconds to the first token, the tokens, and what it prefilled and read. */
async function ttft(s: Scheduler, ids: number[], cached: boolean, what: string) {
  const t0 = performance.now(), read0 = readActivity.bytes;
  let first = 0, firstRead = 0;
  const r = await s.submit({
    prompt: ids,
    maxTokens: gen,
    stopIds: ends,
    onToken: () => void (first ||= (firstRead = readActivity.bytes, performance.now())),
    ...(cached ? chatCachePoints(tok, ids, { thinking: true }, (t) => shownMessage(tok, SHAPE, t)) : {}),
  });
  // The reply's closing pass may still run: one scheduler at a time on the model.
  await s.close();
  const out = {
    seconds: (first - t0) / 1000,
    tokens: r.tokens,
    cached: r.cachedTokens,
    prefilled: r.promptTokens - r.cachedTokens,
    prompt: ids.length,
    readBytes: firstRead - read0,
  };
  progress(
    `${what}: prompt ${out.prompt}, cached ${out.cached}, prefilled ${out.prefilled}, first token after ${
      out.seconds.toFixed(2)
    } s and ${(out.readBytes / 1e9).toFixed(2)} GB read`,
  );
  return out;
}

// 1. The conversation, turn by turn, `reps` times: on and off alternate within each turn
// (which goes first alternates too); each repetition starts with an empty cache.
interface TurnRow {
  turn: number;
  prompt: number;
  cached: number;
  prefilled_on: number;
  prefilled_off: number;
  on_s: number;
  off_s: number;
  ratio: number;
  read_gb_on: number;
  read_gb_off: number;
}
const turnRows: TurnRow[] = [];
const onSeconds: number[][] = users.map(() => []), offSeconds: number[][] = users.map(() => []);
for (let rep = 0; rep < reps; rep++) {
  const cache = new StateCache(model, { ramBytes: 8e9 });
  const on = new Scheduler(model, { cache }), off = new Scheduler(model);
  const messages: ChatMessage[] = [{ role: "system", content: system }];
  for (let t = 0; t < turns; t++) {
    messages.push({ role: "user", content: users[t] });
    const ids = chatPrompt(tok, messages);
    const onFirst = (t + rep) % 2 === 0;
    const what = (mode: string) => `rep ${rep + 1}/${reps} turn ${t + 1}/${turns} cache ${mode}`;
    const a = onFirst ? await ttft(on, ids, true, what("on")) : undefined;
    const b = await ttft(off, ids, false, what("off"));
    const c = a ?? await ttft(on, ids, true, what("on"));
    if (c.tokens.join() !== b.tokens.join()) throw new Error(`turn ${t + 1}: the cache changed the tokens`);
    onSeconds[t].push(c.seconds), offSeconds[t].push(b.seconds);
    if (rep === 0) {
      turnRows.push({
        turn: t + 1,
        prompt: ids.length,
        cached: c.cached,
        prefilled_on: c.prefilled,
        prefilled_off: b.prefilled,
        on_s: 0,
        off_s: 0,
        ratio: 0,
        read_gb_on: c.readBytes / 1e9,
        read_gb_off: b.readBytes / 1e9,
      });
    }
    // The client sends back the reply as shown (no reasoning), as most clients do.
    messages.push(shownMessage(tok, SHAPE, c.tokens));
  }
}
for (const r of turnRows) {
  r.on_s = median(onSeconds[r.turn - 1]);
  r.off_s = median(offSeconds[r.turn - 1]);
  r.ratio = r.off_s / r.on_s;
}

// 2. A batch of lines sharing a prefix: on and off alternate over the repetitions.
const prefix = tok.encode(system.repeat(Math.ceil(sharedLen / 10)), { allowSpecial: false }).slice(0, sharedLen);
const batchLines = Array.from({ length: nLines }, (_, i) => [
  ...prefix,
  ...tok.encode(values.terse ? ` ${i}` : ` Line ${i}: please continue number ${i * 7}.`, { allowSpecial: false }),
]);
async function batch(cached: boolean, what: string) {
  const c = cached ? new StateCache(model, { ramBytes: 8e9 }) : undefined;
  let rows = 0, done = 0;
  const s = new Scheduler(model, { maxSequences: nLines, cache: c, onPass: (p) => void (rows += p.rows) });
  const keep = cached ? sharedPrefixes(batchLines) : [];
  const t0 = performance.now(), read0 = readActivity.bytes;
  const out = await Promise.all(batchLines.map(async (ids, i) => {
    const r = await s.submit({ prompt: ids, maxTokens: Math.min(gen, 4), cacheAt: keep[i] });
    progress(`${what}: line ${++done}/${nLines} done (${rows} rows so far)`);
    return r;
  }));
  return {
    seconds: (performance.now() - t0) / 1000,
    rows,
    readBytes: readActivity.bytes - read0,
    tokens: out.map((r) => r.tokens.join()).join("|"),
  };
}
const batchOn: number[] = [], batchOff: number[] = [];
let rowsOn = 0, rowsOff = 0, readOn = 0, readOff = 0;
for (let r = 0; r < (nLines > 0 ? reps : 0); r++) {
  const first = r % 2 === 0;
  const what = (on: boolean) => `rep ${r + 1}/${reps} batch cache ${on ? "on" : "off"}`;
  const x = await batch(first, what(first)), y = await batch(!first, what(!first));
  const [a, b] = first ? [x, y] : [y, x];
  if (a.tokens !== b.tokens) throw new Error("batch: the cache changed the tokens");
  batchOn.push(a.seconds), batchOff.push(b.seconds);
  rowsOn = a.rows, rowsOff = b.rows, readOn = a.readBytes, readOff = b.readBytes;
}
await opened.close();

// 3. The full model, from its plan at the floor (the `laptop` preset's trunk streamed): what
// a kept state costs, and what the measured turns' cached positions would skip there.
const full = releasedK3();
const sb = stateBytes(full);
const plan = makePlan({ ...estimatedInput(full, { trunkDir: "x", trunkGB: 3, cacheGB: 1 }, 4096), stateCache: {} });
const streamedPerPass = plan.trunk.totalBytes - plan.trunk.pinnedBytes;
const passRowsFull = 16;
const passes = (rows: number) => Math.ceil(rows / passRowsFull);
const history = 4000;
const cachedTurns = turnRows.reduce((n, r) => n + passes(r.prefilled_off) - passes(r.prefilled_on), 0);
const projection = {
  kda_fixed_bytes: sb.fixed,
  kv_bytes_per_position: sb.perPosition,
  conversation_4000_bytes: sb.fixed + sb.perPosition * history,
  trunk_bytes_read_per_pass: streamedPerPass,
  passes_skipped_at_4000_tokens: passes(history),
  trunk_bytes_not_read_at_4000_tokens: passes(history) * streamedPerPass,
  conversations_in_8_gb: Math.floor(8e9 / (sb.fixed + sb.perPosition * history)),
  passes_skipped_by_these_turns: cachedTurns,
  trunk_bytes_not_read_by_these_turns: cachedTurns * streamedPerPass,
};

const load = (await Deno.readTextFile("/proc/loadavg").catch(() => "?")).trim();
console.log(`load ${load}; model ${values.model}; ${elapsed()} in all`);
console.log(`time to first token, median of ${reps} (prefilled: positions run through the model before it):`);
console.log("turn  prompt  cached  prefilled on/off   TTFT on s  TTFT off s   off/on   GB read on/off");
for (const r of turnRows) {
  console.log(
    `${String(r.turn).padStart(4)}  ${String(r.prompt).padStart(6)}  ${String(r.cached).padStart(6)}  ${
      `${r.prefilled_on}/${r.prefilled_off}`.padStart(16)
    }  ${r.on_s.toFixed(4).padStart(10)}  ${r.off_s.toFixed(4).padStart(10)}  ${r.ratio.toFixed(2).padStart(7)}  ${
      `${r.read_gb_on.toFixed(2)}/${r.read_gb_off.toFixed(2)}`.padStart(15)
    }`,
  );
}
const mOn = median(batchOn), mOff = median(batchOff);
if (nLines > 0) {
  console.log(
    `batch of ${nLines} lines sharing ${prefix.length} tokens: on ${mOn.toFixed(3)} s (${rowsOn} rows, ${
      (readOn / 1e9).toFixed(2)
    } GB read), off ${mOff.toFixed(3)} s (${rowsOff} rows, ${(readOff / 1e9).toFixed(2)} GB read), off/on ${
      (mOff / mOn).toFixed(2)
    } (median of ${reps})`,
  );
}
const mb = (n: number) => `${(n / 1e6).toFixed(1)} MB`;
console.log(
  `full model: KDA state ${mb(sb.fixed)} + ${
    (sb.perPosition / 1e3).toFixed(1)
  } kB/position; a 4,000-token conversation ${
    mb(projection.conversation_4000_bytes)
  } (RAM or spill file); at the floor a pass reads ${(streamedPerPass / 1e9).toFixed(1)} GB of trunk, so a cached ` +
    `4,000-token history skips ${projection.passes_skipped_at_4000_tokens} passes (${
      (projection.trunk_bytes_not_read_at_4000_tokens / 1e12).toFixed(1)
    } TB not read); 8 GB holds ${projection.conversations_in_8_gb} such states; the ${turns} turns above ` +
    `skip ${cachedTurns} passes of ${passRowsFull} rows there (${
      (projection.trunk_bytes_not_read_by_these_turns / 1e12).toFixed(2)
    } TB not read)`,
);
if (values.json) {
  console.log(JSON.stringify({
    bench: "prefix_cache",
    load,
    model: values.model,
    chunk,
    turns: turnRows,
    batch: {
      lines: nLines,
      shared_tokens: prefix.length,
      on_seconds: mOn,
      off_seconds: mOff,
      ratio: mOff / mOn,
      rows_on: rowsOn,
      rows_off: rowsOff,
      read_bytes_on: readOn,
      read_bytes_off: readOff,
    },
    full_model: projection,
  }));
}
