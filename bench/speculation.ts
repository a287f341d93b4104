/**
 * Speculative decoding, measured side by side: the same greedy run with drafts off and on
 * (alternating, medians), on a repetitive prompt and a non-repetitive one, on the tiny model
 * that writes English (tests/fixtures/tiny-en, or the random tiny model when it is absent);
 * the same with drafts from an oracle that knows the plain tokens (every draft accepted:
 * the ceiling the pass cost allows); and on the real-width slice at the floor budget, the
 * cost of a drafted row against a pass without drafts (the number the full-model
 * projection rests on) and the oracle's speed-up there.
 *
 *   deno run -A bench/speculation.ts [--json] [--model DIR] [--reps N] [--skip-slice]
 *
 * Also a section of bench/limits.ts (keys spec_accepted_per_pass, spec_speedup_repetitive).
 *
 * @module
 */

import { benchArgs, median } from "./args.ts";
import type { Figure, Section } from "./figures.ts";
import { ensureSlice, type SliceRecipe } from "./slice.ts";
import { Scheduler } from "../engine/generate/scheduler.ts";
import type { DraftOptions } from "../engine/generate/draft.ts";
import { openModel } from "../engine/open.ts";
import { packTrunk } from "../pack/pack.ts";
import type { K3Model } from "../engine/model/model.ts";
import type { MemoryOptions } from "../engine/weights/plan_input.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");

/** The slice of bench/limits.ts's decode section (the same cached files). */
const SLICE: SliceRecipe = { layers: 3, experts: 32, topK: 16, vocab: 32768, fullAttn: [3] };

/** The English tiny model when present, else the random one. */
async function tinyModel(): Promise<string> {
  const en = `${ROOT}/tests/fixtures/tiny-en`;
  try {
    await Deno.stat(`${en}/config.json`);
    return en;
  } catch {
    return `${ROOT}/tests/fixtures/tiny`;
  }
}

/** One greedy run: decode seconds per token after the first, tokens, and accepted drafts. */
async function greedyRun(model: K3Model, prompt: number[], gen: number, draft: DraftOptions) {
  const r = await new Scheduler(model, { draft }).submit({ prompt, maxTokens: gen });
  const accepted = r.draft?.accepted ?? 0;
  // Passes after the prefill's: each emitted one token plus its accepted drafts.
  const passes = Math.max(1, r.tokens.length - 1 - accepted);
  return { seconds: r.decodeSeconds / Math.max(1, r.tokens.length - 1), tokens: r.tokens, accepted, passes };
}

/** Alternates `modes` for `reps` rounds; medians of seconds per token, and the last counts. */
async function sideBySide(model: K3Model, prompt: number[], gen: number, modes: DraftOptions[], reps: number) {
  const times = modes.map(() => [] as number[]);
  const last: Awaited<ReturnType<typeof greedyRun>>[] = [];
  await greedyRun(model, prompt, gen, { mode: "off" }); // warm up
  for (let r = 0; r < reps; r++) {
    for (let m = 0; m < modes.length; m++) {
      last[m] = await greedyRun(model, prompt, gen, modes[m]);
      times[m].push(last[m].seconds);
    }
  }
  return modes.map((_, m) => ({ perToken: median(times[m]), best: Math.min(...times[m]), ...last[m] }));
}

/** Drafts from a plain run's tokens: every draft right. */
function oracle(plain: number[], promptLength: number): DraftOptions {
  return {
    mode: "lookup",
    force: true,
    propose: (text, k) => plain.slice(text.length - promptLength, text.length - promptLength + k),
  };
}

/** Options of the speculation measurements. */
export interface SpeculationOptions {
  /** The small model (default: tiny-en, else tiny). */
  model?: string;
  /** Rounds of each side-by-side timing. */
  reps: number;
  /** Skip the real-width slice. */
  skipSlice?: boolean;
  /** Progress lines. */
  log: (line: string) => void;
}

/** The speculation figures (see the module doc). */
export async function measureSpeculation(o: SpeculationOptions): Promise<Figure[]> {
  const dir = o.model ?? await tinyModel();
  const name = dir.split("/").pop()!;
  const gen = 96;
  const opened = await openModel(dir, { capacity: 256, chunk: 16 });
  const figures: Figure[] = [];
  try {
    const V = opened.cfg.vocabSize;
    // A repetitive prompt: one short cycle of ids, several times (text a model continues by
    // repeating); a non-repetitive one: ids spread over the vocabulary.
    const cycle = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20].map((x) => (x * 37) % V);
    const repetitive = Array.from({ length: 60 }, (_, i) => cycle[i % cycle.length]);
    const plainPrompt = Array.from({ length: 60 }, (_, i) => (i * 7919 + 101) % V);
    for (const [label, prompt] of [["repetitive", repetitive], ["non-repetitive", plainPrompt]] as const) {
      o.log(`${name}: ${label} prompt, drafts off / suffix / lookup / oracle`);
      const [base] = await sideBySide(opened.model, prompt, gen, [{ mode: "off" }], 1);
      const [off, suffix, lookup, orc] = await sideBySide(
        opened.model,
        prompt,
        gen,
        [{ mode: "off" }, { mode: "suffix" }, { mode: "lookup" }, oracle(base.tokens, prompt.length)],
        o.reps,
      );
      const key = label === "repetitive" ? "repetitive" : "plain";
      for (const [mode, r] of [["suffix", suffix], ["lookup", lookup], ["oracle", orc]] as const) {
        figures.push({
          key: `spec_${mode}_speedup_${key}`,
          label: `${name} ${label}: ${mode} drafts, ${(r.accepted / r.passes).toFixed(2)} accepted/pass`,
          value: off.perToken / r.perToken,
          unit: "x",
        });
        figures.push({
          key: `spec_${mode}_speedup_best_${key}`,
          label: `${name} ${label}: ${mode} drafts, best of each over best`,
          value: off.best / r.best,
          unit: "x",
        });
        figures.push({
          key: `spec_${mode}_accepted_per_pass_${key}`,
          label: `${name} ${label}: ${mode} accepted draft tokens per decode pass`,
          value: r.accepted / r.passes,
          unit: "tok",
        });
      }
      figures.push({
        key: `spec_off_s_per_token_${key}`,
        label: `${name} ${label}: drafts off`,
        value: off.perToken,
        unit: "s",
      });
    }
  } finally {
    await opened.close();
  }
  if (!o.skipSlice) figures.push(...await sliceFloor(o));
  return figures;
}

/**
 * At the floor on the real-width slice: seconds of one decode pass of 1 row and of 9 rows
 * (a verified draft of 8) of one sequence, alternating, and the oracle's speed-up.
 */
async function sliceFloor(o: SpeculationOptions): Promise<Figure[]> {
  const model = await ensureSlice(SLICE, undefined, o.log);
  const trunk = `${model}-trunk-spec`;
  try {
    await Deno.stat(`${trunk}/manifest.json`);
  } catch {
    o.log(`slice: packing ${trunk}`);
    await packTrunk(model, trunk, { log: null });
  }
  const memory: MemoryOptions = { trunkDir: trunk, trunkGB: 2.5, cacheGB: 0.31 };
  const opened = await openModel(model, { capacity: 64, chunk: 16, memory });
  try {
    const m = opened.model;
    const prompt = [11, 222, 3333, 4444];
    const gen = 9;
    o.log("slice floor: plain and oracle-drafted runs, alternating");
    const [base] = await sideBySide(m, prompt, gen, [{ mode: "off" }], 1);
    const [off, orc] = await sideBySide(m, prompt, gen, [{ mode: "off" }, oracle(base.tokens, prompt.length)], o.reps);
    // One pass of 1 row against one of 9 rows of the same sequence.
    const t1: number[] = [], t9: number[] = [];
    for (let r = 0; r < o.reps; r++) {
      for (const rows of [1, 9]) {
        const st = m.newState();
        try {
          await m.pass([{ state: st, ids: prompt, logits: "last" }]);
          const ids = Array.from({ length: rows }, (_, i) => base.tokens[i]);
          const t0 = performance.now();
          await m.pass([{ state: st, ids, logits: rows > 1 ? "all" : "last", speculative: rows > 1 }]);
          (rows === 1 ? t1 : t9).push((performance.now() - t0) / 1000);
        } finally {
          st.free();
        }
      }
    }
    const c = (median(t9) - median(t1)) / 8 / median(t1);
    return [
      { key: "spec_floor_pass_1_row_s", label: "slice floor: a pass of 1 row", value: median(t1), unit: "s" },
      {
        key: "spec_floor_row_cost",
        label: "slice floor: a drafted row, of a 1-row pass",
        value: c,
        unit: "x",
      },
      {
        key: "spec_floor_oracle_speedup",
        label: `slice floor: oracle drafts (8 per pass), ${gen} tokens`,
        value: off.perToken / orc.perToken,
        unit: "x",
      },
    ];
  } finally {
    await opened.close();
  }
}

/** The section of bench/limits.ts. */
export const speculationSection: Section = (ctx) =>
  measureSpeculation({ reps: Math.max(3, ctx.opts.reps), skipSlice: ctx.opts.skipDecode, log: ctx.log });

if (import.meta.main) {
  const usage = "usage: deno run -A bench/speculation.ts [--json] [--model DIR] [--reps N] [--skip-slice]";
  const { values } = benchArgs(usage, {
    json: { type: "boolean" },
    model: { type: "string" },
    reps: { type: "string" },
    "skip-slice": { type: "boolean" },
  });
  const reps = values.reps === undefined ? 5 : Number(values.reps);
  if (!Number.isInteger(reps) || reps < 1) {
    console.error(`k3: --reps must be a positive integer\n${usage}`);
    Deno.exit(2);
  }
  console.error(`load: ${(await Deno.readTextFile("/proc/loadavg")).trim()}`);
  const figures = await measureSpeculation({
    model: values.model,
    reps,
    skipSlice: values["skip-slice"],
    log: (l) => console.error(`spec: ${l}`),
  });
  for (const f of figures) console.log(`${f.label.padEnd(64)} ${f.value.toFixed(3).padStart(10)} ${f.unit}`);
  if (values.json) console.log(JSON.stringify(Object.fromEntries(figures.map((f) => [f.key, f.value]))));
}
