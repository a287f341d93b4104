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
 *     [--lines 16] [--shared 500] [--reps 3] [--rules 12] [--trunk DIR --trunk-gb X --cache-gb Y] [--json]
 *
 * `--rules N`: sentences of the system prompt (12: ~330 tokens). On a real-width slice at
 * the floor every pass streams the trunk, so keep it small, e.g.
 *   deno run -A bench/prefix_cache.ts --model SLICE --tok tests/fixtures/tiny --trunk TRUNK \
 *     --trunk-gb 2.35 --cache-gb 0.3 --turns 3 --gen 1 --reps 1 --rules 3 --lines 4 --shared 64
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { openModel } from "../engine/open.ts";
import { Scheduler } from "../engine/generate/scheduler.ts";
import { chatCachePoints, StateCache } from "../engine/generate/state_cache.ts";
import { type ChatMessage, chatPrompt, stopIds } from "../engine/text/chat.ts";
import { Tokenizer } from "../engine/text/tokenizer.ts";
import { sharedPrefixes } from "../cli/batch/shared_prefix.ts";
import { estimatedInput, makePlan, releasedK3 } from "../engine/weights/plan.ts";
import { stateBytes } from "../engine/model/state.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const USAGE = "usage: deno run -A bench/prefix_cache.ts [--model DIR] [--tok DIR] [--turns 6] [--gen 8] " +
  "[--lines 16] [--shared 500] [--reps 3] [--rules 12] [--trunk DIR --trunk-gb X --cache-gb Y] [--json]";
const { values } = benchArgs(USAGE, {
  model: { type: "string", default: `${ROOT}tests/fixtures/tiny` },
  tok: { type: "string" },
  turns: { type: "string", default: "6" },
  gen: { type: "string", default: "8" },
  lines: { type: "string", default: "16" },
  shared: { type: "string", default: "500" },
  reps: { type: "string", default: "3" },
  rules: { type: "string", default: "12" },
  trunk: { type: "string" },
  "trunk-gb": { type: "string" },
  "cache-gb": { type: "string" },
  json: { type: "boolean" },
});
const turns = Number(values.turns), gen = Number(values.gen), nLines = Number(values.lines);
const sharedLen = Number(values.shared), reps = Number(values.reps);
const tok = Tokenizer.load(values.tok ?? values.model!);
const memory = values.trunk
  ? {
    trunkDir: values.trunk,
    trunkGB: values["trunk-gb"] ? Number(values["trunk-gb"]) : undefined,
    cacheGB: values["cache-gb"] ? Number(values["cache-gb"]) : undefined,
  }
  : undefined;

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const capacity = Math.max(4096, sharedLen + 64 + gen);
const opened = await openModel(values.model!, { capacity, chunk: 16, sequences: nLines, memory });
const { model } = opened;
const ends = stopIds(tok);

/** A long system prompt (an agent's instructions and tool list) and short user turns. */
const system = Array.from(
  { length: Number(values.rules) },
  (_, i) => `Rule ${i + 1}: answer with care and cite tool ${i}.`,
).join(" ");
const users = Array.from({ length: turns }, (_, i) => `Question ${i + 1}: what comes after ${i + 1}, and why?`);

/** Seconds to the first token, and the tokens, of one request on `s`. */
async function ttft(s: Scheduler, ids: number[], cached: boolean) {
  const t0 = performance.now();
  let first = 0;
  const r = await s.submit({
    prompt: ids,
    maxTokens: gen,
    stopIds: ends,
    onToken: () => void (first ||= performance.now()),
    ...(cached ? chatCachePoints(tok, ids, { thinking: true }) : {}),
  });
  // The reply's closing pass may still run: one scheduler at a time on the model.
  await s.close();
  return { seconds: (first - t0) / 1000, tokens: r.tokens, cached: r.cachedTokens, prompt: ids.length };
}

// 1. The conversation, turn by turn, `reps` times: on and off alternate within each turn
// (which goes first alternates too); each repetition starts with an empty cache.
const turnRows: { turn: number; prompt: number; cached: number; on_s: number; off_s: number; ratio: number }[] = [];
const onSeconds: number[][] = users.map(() => []), offSeconds: number[][] = users.map(() => []);
for (let rep = 0; rep < reps; rep++) {
  const cache = new StateCache(model, { ramBytes: 8e9 });
  const on = new Scheduler(model, { cache }), off = new Scheduler(model);
  const messages: ChatMessage[] = [{ role: "system", content: system }];
  for (let t = 0; t < turns; t++) {
    messages.push({ role: "user", content: users[t] });
    const ids = chatPrompt(tok, messages);
    const onFirst = (t + rep) % 2 === 0;
    const a = onFirst ? await ttft(on, ids, true) : undefined;
    const b = await ttft(off, ids, false);
    const c = a ?? await ttft(on, ids, true);
    if (c.tokens.join() !== b.tokens.join()) throw new Error(`turn ${t + 1}: the cache changed the tokens`);
    onSeconds[t].push(c.seconds), offSeconds[t].push(b.seconds);
    if (rep === 0) turnRows.push({ turn: t + 1, prompt: ids.length, cached: c.cached, on_s: 0, off_s: 0, ratio: 0 });
    messages.push({ role: "assistant", content: tok.decode(c.tokens.filter((x) => !ends.includes(x))) });
  }
}
for (const r of turnRows) {
  r.on_s = median(onSeconds[r.turn - 1]);
  r.off_s = median(offSeconds[r.turn - 1]);
  r.ratio = r.off_s / r.on_s;
}

// 2. A batch of lines sharing a prefix: on and off alternate over the repetitions.
const prefix = tok.encode(system.repeat(Math.ceil(sharedLen / 40)), { allowSpecial: false }).slice(0, sharedLen);
const batchLines = Array.from({ length: nLines }, (_, i) => [
  ...prefix,
  ...tok.encode(` Line ${i}: please continue number ${i * 7}.`, { allowSpecial: false }),
]);
async function batch(cached: boolean) {
  const c = cached ? new StateCache(model, { ramBytes: 8e9 }) : undefined;
  let rows = 0;
  const s = new Scheduler(model, { maxSequences: nLines, cache: c, onPass: (p) => void (rows += p.rows) });
  const keep = cached ? sharedPrefixes(batchLines) : [];
  const t0 = performance.now();
  const out = await Promise.all(batchLines.map((ids, i) => s.submit({ prompt: ids, maxTokens: 4, cacheAt: keep[i] })));
  return { seconds: (performance.now() - t0) / 1000, rows, tokens: out.map((r) => r.tokens.join()).join("|") };
}
const batchOn: number[] = [], batchOff: number[] = [];
let rowsOn = 0, rowsOff = 0;
for (let r = 0; r < reps; r++) {
  const first = r % 2 === 0;
  const x = await batch(first), y = await batch(!first);
  const [a, b] = first ? [x, y] : [y, x];
  if (a.tokens !== b.tokens) throw new Error("batch: the cache changed the tokens");
  batchOn.push(a.seconds), batchOff.push(b.seconds);
  rowsOn = a.rows, rowsOff = b.rows;
}
await opened.close();

// 3. The full model, from its plan at the floor (the `laptop` preset's trunk streamed).
const full = releasedK3();
const sb = stateBytes(full);
const plan = makePlan({ ...estimatedInput(full, { trunkDir: "x", trunkGB: 3, cacheGB: 1 }, 4096), stateCache: {} });
const streamedPerPass = plan.trunk.totalBytes - plan.trunk.pinnedBytes;
const history = 4000;
const projection = {
  kda_fixed_bytes: sb.fixed,
  kv_bytes_per_position: sb.perPosition,
  conversation_4000_bytes: sb.fixed + sb.perPosition * history,
  trunk_bytes_read_per_pass: streamedPerPass,
  passes_skipped_at_4000_tokens: Math.ceil(history / 16),
  trunk_bytes_not_read_at_4000_tokens: Math.ceil(history / 16) * streamedPerPass,
  conversations_in_8_gb: Math.floor(8e9 / (sb.fixed + sb.perPosition * history)),
};

const load = (await Deno.readTextFile("/proc/loadavg").catch(() => "?")).trim();
console.log(`load ${load}; model ${values.model}`);
console.log(`time to first token, median of ${reps}:`);
console.log("turn  prompt  cached   TTFT on s  TTFT off s   off/on");
for (const r of turnRows) {
  console.log(
    `${String(r.turn).padStart(4)}  ${String(r.prompt).padStart(6)}  ${String(r.cached).padStart(6)}  ${
      r.on_s.toFixed(4).padStart(10)
    }  ${r.off_s.toFixed(4).padStart(10)}  ${r.ratio.toFixed(2).padStart(7)}`,
  );
}
const mOn = median(batchOn), mOff = median(batchOff);
console.log(
  `batch of ${nLines} lines sharing ${prefix.length} tokens: on ${mOn.toFixed(3)} s (${rowsOn} rows), off ${
    mOff.toFixed(3)
  } s (${rowsOff} rows), off/on ${(mOff / mOn).toFixed(2)} (median of ${reps})`,
);
const mb = (n: number) => `${(n / 1e6).toFixed(1)} MB`;
console.log(
  `full model: KDA state ${mb(sb.fixed)} + ${
    (sb.perPosition / 1e3).toFixed(1)
  } kB/position; a 4,000-token conversation ${
    mb(projection.conversation_4000_bytes)
  } (RAM or spill file); at the floor a pass reads ${(streamedPerPass / 1e9).toFixed(1)} GB of trunk, so a cached ` +
    `4,000-token history skips ${projection.passes_skipped_at_4000_tokens} passes (${
      (projection.trunk_bytes_not_read_at_4000_tokens / 1e12).toFixed(1)
    } TB not read); 8 GB holds ${projection.conversations_in_8_gb} such conversations`,
);
if (values.json) {
  console.log(JSON.stringify({
    bench: "prefix_cache",
    load,
    model: values.model,
    turns: turnRows,
    batch: {
      lines: nLines,
      shared_tokens: prefix.length,
      on_seconds: mOn,
      off_seconds: mOff,
      ratio: mOff / mOn,
      rows_on: rowsOn,
      rows_off: rowsOff,
    },
    full_model: projection,
  }));
}
