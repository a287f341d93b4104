/**
 * The memory plan by predicted tokens/s (weights/throughput.ts, weights/plan.ts): the pass
 * model, the choice between sequence slots, trunk pins and expert cache under `--preset
 * auto` and `--parallel auto`, and the speculation records the plan counts.
 */

import assert from "node:assert/strict";
import {
  estimatedInput,
  expertSlotBytes,
  fitSequences,
  FIXED_OVERHEAD_BYTES,
  formatPlan,
  makePlan,
  type MemoryOptions,
  type MemoryPlan,
  type PlanInput,
  releasedK3,
} from "../../engine/weights/plan.ts";
import { DEFAULT_COMPUTE, distinctExperts, type PassShape, predictPass } from "../../engine/weights/throughput.ts";
import { SPEC_RECORD_ROWS, speculationBytes, SpeculationRecord } from "../../engine/model/state.ts";
import { loadConfig } from "../../engine/model/config.ts";
import { kernels } from "../../engine/native/ffi.ts";
import { passRows, scratchBytes } from "../../engine/model/scratch.ts";
import { DEFAULT_MAX_DRAFT } from "../../engine/generate/draft.ts";

const cfg = releasedK3();
const rates = { disk: 3e9, ...DEFAULT_COMPUTE };
const AUTO: MemoryOptions = { trunkDir: "t", preset: "auto" };
const CAPACITY = 4096;
/** One layer-size list for every plan (the plan keeps what it works out per list). */
const LAYERS = estimatedInput(cfg, AUTO, CAPACITY).layerBytes;

/** The plan input for `n` sequences of the released model (scratch sized for them). */
function input(n: number, mem: MemoryOptions, extra: Partial<PlanInput> = {}): PlanInput {
  const base = estimatedInput(cfg, mem, CAPACITY);
  return {
    ...base,
    layerBytes: LAYERS,
    sequences: n,
    scratchBytes: scratchBytes(cfg, passRows(base.chunk, n), CAPACITY),
    drafts: true,
    rates,
    ...extra,
  };
}

/** `--parallel auto` up to 16 under `available` bytes with `--preset auto`. */
function autoPlan(available: number): MemoryPlan {
  return fitSequences((n) => makePlan(input(n, AUTO, { available })), 16, true);
}

const shape: PassShape = {
  trunkBytes: 110e9,
  headBytes: 2.3e9,
  moeLayers: 92,
  experts: 896,
  topK: 16,
  expertBytes: 17.6e6,
};

Deno.test("throughput: more slots, more pins or more sequences never predict fewer tokens/s", () => {
  const all = shape.moeLayers * shape.experts;
  for (const S of [1, 2, 8, 16]) {
    let last = 0;
    for (const slots of [17, 100, 1000, 10000, all, 2 * all]) {
      const t = predictPass(shape, { sequences: S, streamedBytes: 50e9, slots }, rates).tokensPerSecond;
      assert.ok(t >= last, `S ${S}: slots ${slots} predicts ${t} < ${last}`);
      last = t;
    }
    last = 0;
    for (const streamed of [110e9, 80e9, 20e9, 1e9, 0]) {
      const t = predictPass(shape, { sequences: S, streamedBytes: streamed, slots: 17 }, rates).tokensPerSecond;
      assert.ok(t >= last, `S ${S}: ${streamed} streamed predicts ${t} < ${last}`);
      last = t;
    }
  }
  let last = 0;
  for (const S of [1, 2, 3, 8, 16, 64]) {
    const t = predictPass(shape, { sequences: S, streamedBytes: 110e9, slots: 17 }, rates).tokensPerSecond;
    assert.ok(t > last, `${S} sequences predict ${t} <= ${last}`);
    last = t;
  }
});

Deno.test("throughput: the pass is the read or the compute, whichever is longer", () => {
  // At the floor the read bounds: the streamed trunk plus 16 experts in each MoE layer.
  const floor = predictPass(shape, { sequences: 1, streamedBytes: 110e9, slots: 17 }, rates);
  const missed = 92 * 16 * 17.6e6 * (1 - 17 / (92 * 896));
  assert.ok(Math.abs(floor.readBytes - (110e9 + missed)) < 1e3);
  assert.equal(floor.passSeconds, floor.ioSeconds);
  assert.ok(Math.abs(floor.tokensPerSecond - 3e9 / floor.readBytes) < 1e-12);
  // Resident: nothing is read, the compute is the pass.
  const resident = predictPass(shape, { sequences: 4, streamedBytes: 0, slots: 0, resident: true }, rates);
  assert.equal(resident.readBytes, 0);
  assert.equal(resident.passSeconds, resident.computeSeconds);
  // Distinct experts: k for one row, all of them for many rows.
  assert.ok(Math.abs(distinctExperts(896, 16, 1) - 16) < 1e-9);
  assert.ok(distinctExperts(896, 16, 1000) > 895.99);
});

Deno.test("plan: more memory never predicts fewer tokens/s (preset auto, --parallel auto)", () => {
  let last = 0;
  for (let gb = 16; gb <= 400; gb += 12) {
    let p: MemoryPlan;
    try {
      p = autoPlan(gb * 1e9);
    } catch {
      assert.equal(last, 0, `${gb} GB does not fit, a smaller budget did`);
      continue;
    }
    const t = p.prediction!.tokensPerSecond;
    assert.ok(t >= last * (1 - 1e-9), `${gb} GB predicts ${t} < ${last}`);
    assert.deepEqual(autoPlan(gb * 1e9), p, `${gb} GB: the same plan made twice`);
    assert.ok(p.totalBytes + p.overheadBytes <= gb * 1e9, `${gb} GB: the plan does not fit`);
    last = t;
  }
  assert.ok(last > 0, "no budget fitted");
});

Deno.test("plan: where a slot beats a pin, the plan takes the slot", () => {
  // One more sequence costs about one trunk layer (its KDA state, its MLA cache and its
  // speculation record); at the floor it doubles the tokens a read of the trunk yields,
  // where the layer would save 1% of the read.
  const available = 40e9;
  const one = makePlan(input(1, AUTO, { available }));
  const chosen = autoPlan(available);
  assert.ok(chosen.state.sequences > 1, `the plan took ${chosen.state.sequences} sequence`);
  assert.ok(chosen.trunk.pinned.length < one.trunk.pinned.length, "the slots' memory came from pins");
  assert.ok(chosen.prediction!.tokensPerSecond > 1.5 * one.prediction!.tokensPerSecond);
  assert.match(chosen.notes.join("\n"), /best predicted tokens\/s/);
  assert.match(formatPlan(chosen).join("\n"), /predicted: [\d.]+ tokens\/s with \d+ sequences decoding/);
});

Deno.test("plan: where a pin beats a slot, the plan takes the pin", () => {
  // A model without routed experts (every layer dense), room for the whole trunk and one
  // sequence, not for a second: a second sequence would stream a layer every pass, and on
  // a slow disk that read costs more than the second sequence's tokens bring.
  const dense = { ...cfg, firstKDense: cfg.numLayers };
  const layers = estimatedInput(dense, AUTO, CAPACITY).layerBytes;
  const slow = { ...rates, disk: 0.02e9 };
  const inputOf = (n: number, extra: Partial<PlanInput>) => ({
    ...input(n, AUTO, extra),
    cfg: dense,
    layerBytes: layers,
  });
  const one = inputOf(1, { rates: slow });
  const trunk = one.layerBytes.reduce((a, b) => a + b, 0);
  const minCache = 17 * expertSlotBytes(one.expertBytes);
  // The one-sequence plan with the trunk pinned, top-k + 1 slots, embedding and head
  // resident; auto spends 90% of what the fixed parts leave. (Streaming the head would
  // make room for a second sequence, at a read of the head every pass.)
  const fixedPlan = makePlan({ ...one, mem: { trunkDir: "t", trunkGB: 1e4, cacheGB: minCache / 1e9 } });
  const available = fixedPlan.totalBytes - trunk - fixedPlan.experts.bytes + FIXED_OVERHEAD_BYTES +
    (trunk + minCache) / 0.9 + 0.05e9;
  const p = fitSequences((n) => makePlan(inputOf(n, { available, rates: slow })), 16, true);
  assert.equal(p.trunk.ringBytes, 0, `every layer pinned: ${formatPlan(p).join("\n")}`);
  assert.equal(p.state.sequences, 1, formatPlan(p).join("\n"));
  assert.equal(p.embedHead.streamed, false);
  // The same memory on a fast disk goes to a second sequence.
  assert.ok(fitSequences((n) => makePlan(inputOf(n, { available })), 16, true).state.sequences > 1);
});

Deno.test("plan: without rates there is no prediction and no line for it", () => {
  const p = makePlan(input(1, { trunkDir: "t", trunkGB: 3, cacheGB: 1 }, { rates: undefined }));
  assert.equal(p.prediction, null);
  assert.ok(!formatPlan(p).some((l) => l.includes("predicted")));
});

Deno.test("plan: each drafting sequence holds a speculation record, counted and printed", () => {
  const mem = { trunkDir: "t", trunkGB: 3, cacheGB: 1 };
  const off = makePlan(input(4, mem, { drafts: false }));
  const on = makePlan(input(4, mem));
  const each = speculationBytes(cfg, SPEC_RECORD_ROWS);
  assert.ok(each > 0.67e9 && each < 0.69e9, `the released model's record is ${each} bytes`);
  assert.equal(off.speculation, null);
  assert.deepEqual(on.speculation, { rows: SPEC_RECORD_ROWS, perSequence: each, sequences: 4, bytes: 4 * each });
  assert.equal(on.totalBytes, off.totalBytes + 4 * each);
  assert.match(formatPlan(on).join("\n"), /drafts +2\.71 GB +4 sequences x 678\.6 MB speculation record/);
  assert.ok(!formatPlan(off).some((l) => l.includes("drafts")));
  // A pass of fewer rows than a full draft needs a smaller record.
  const small = makePlan({ ...input(1, mem), chunk: 4 });
  assert.equal(small.speculation!.rows, 4);
  assert.equal(SPEC_RECORD_ROWS, DEFAULT_MAX_DRAFT + 1);
});

Deno.test("plan: speculationBytes is what a SpeculationRecord allocates", async () => {
  const tiny = await loadConfig(new URL("../fixtures/tiny", import.meta.url).pathname);
  const rec = new SpeculationRecord(kernels(), tiny, SPEC_RECORD_ROWS);
  try {
    let floats = tiny.kda.numHeads * tiny.kda.headDim; // the replay's output row
    for (const r of rec.kda.values()) for (const v of Object.values(r)) floats += v.length;
    assert.equal(speculationBytes(tiny, SPEC_RECORD_ROWS), 4 * floats);
  } finally {
    rec.free();
  }
});
