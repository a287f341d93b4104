/**
 * The memory plan by predicted tokens/s (weights/throughput.ts, weights/plan.ts): the pass
 * model, the choice between sequence slots, trunk pins and expert cache under `--preset
 * auto` and `--parallel auto`, and the speculation records the plan counts.
 */

import assert from "node:assert/strict";
import { estimatedInput, fitSequences, makePlan, type MemoryPlan } from "../../engine/weights/plan.ts";
import { expertSlotBytes } from "../../engine/weights/plan_experts.ts";
import { FIXED_OVERHEAD_BYTES, type MemoryOptions, type PlanInput } from "../../engine/weights/plan_input.ts";
import { formatPlan } from "../../engine/weights/plan_text.ts";
import { releasedK3 } from "../../engine/model/shapes.ts";
import {
  CHECK_SHARE,
  DEFAULT_COMPUTE,
  distinctExperts,
  type PassRates,
  type PassShape,
  type PassSplit,
  predictPass,
  rowsCost,
} from "../../engine/weights/throughput.ts";
import { SPEC_RECORD_ROWS, speculationBytes, SpeculationRecord } from "../../engine/model/state.ts";
import { loadConfig } from "../../engine/model/config.ts";
import { weighSegments } from "../../engine/weights/plan_segment.ts";
import { kernels } from "../../engine/native/ffi.ts";
import { DEFAULT_MAX_DRAFT } from "../../engine/generate/draft.ts";

const cfg = releasedK3();
const rates = { disk: 3e9, ...DEFAULT_COMPUTE };
const AUTO: MemoryOptions = { trunkDir: "t", preset: "auto" };
const CAPACITY = 4096;
/** One layer-size list for every plan (the plan keeps what it works out per list). */
const LAYERS = estimatedInput(cfg, AUTO, CAPACITY).layerBytes;

/** The plan input for `n` sequences of the released model (its scratchFor sizes the scratch
 * for them). */
function input(n: number, mem: MemoryOptions, extra: Partial<PlanInput> = {}): PlanInput {
  const base = estimatedInput(cfg, mem, CAPACITY);
  return {
    ...base,
    layerBytes: LAYERS,
    sequences: n,
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

Deno.test("throughput: the pass is at least the read and the compute, and the read where nothing waits on it", () => {
  // At the floor the read bounds: the streamed trunk plus 16 experts in each MoE layer.
  const floor = predictPass(shape, { sequences: 1, streamedBytes: 110e9, slots: 17 }, rates);
  const missed = 92 * 16 * 17.6e6 * (1 - 17 / (92 * 896));
  assert.ok(Math.abs(floor.readBytes - (110e9 + missed)) < 1e3);
  assert.ok(floor.passSeconds >= Math.max(floor.ioSeconds, floor.computeSeconds));
  // The experts are read only once the routing is known: a little of the pass is serial.
  assert.ok(floor.passSeconds < 1.05 * floor.ioSeconds, `${floor.passSeconds} s for ${floor.ioSeconds} s of reads`);
  // Every expert cached, an unbounded ring, the head in RAM: the disk never waits, the
  // pass is the read.
  const cached = predictPass(shape, { sequences: 1, streamedBytes: 110e9, slots: 92 * 896 }, rates);
  assert.ok(Math.abs(cached.passSeconds / cached.ioSeconds - 1) < 1e-9, `${cached.passSeconds} / ${cached.ioSeconds}`);
  assert.ok(Math.abs(cached.tokensPerSecond - 3e9 / cached.readBytes) < 1e-12);
  // Resident: nothing is read, the compute is the pass.
  const resident = predictPass(shape, { sequences: 4, streamedBytes: 0, slots: 0, resident: true }, rates);
  assert.equal(resident.readBytes, 0);
  assert.equal(resident.passSeconds, resident.computeSeconds);
  // Distinct experts: k for one row, all of them for many rows.
  assert.ok(Math.abs(distinctExperts(896, 16, 1) - 16) < 1e-9);
  assert.ok(distinctExperts(896, 16, 1000) > 895.99);
});

/** The real-width decode slice: 3 layers (dense, MoE, MoE), 32 experts top-16, its sizes. */
const slice: PassShape = {
  trunkBytes: 2341302272 + 1255448576 + 832045056,
  headBytes: 469762048,
  moeLayers: 2,
  experts: 32,
  topK: 16,
  expertBytes: 17547264,
  layers: [2341302272, 1255448576, 832045056],
};
const sliceRates: PassRates = { disk: 7.4e9, dense: 22e9, expert: 6.6e9, rowGrowth: 0.1, expertRowGrowth: 0.1 };
const streamedSlice: PassSplit = {
  sequences: 8,
  streamedBytes: slice.trunkBytes,
  streamedLayers: [0, 1, 2],
  ringBytes: 2341302272 + 1255448576,
  headStreamed: true,
  slots: 58,
};

/** The compute of a pass with nothing read: the formula the module doc gives. */
function computeOf(sh: PassShape, S: number, r: PassRates): number {
  const D = distinctExperts(sh.experts, sh.topK, S);
  return (sh.trunkBytes + sh.headBytes) / r.dense * (1 + r.rowGrowth * (S - 1)) +
    sh.moeLayers * (D + r.expertRowGrowth * (S * sh.topK - D)) * sh.expertBytes / r.expert;
}

Deno.test("throughput: everything pinned and cached predicts the compute, as before", () => {
  for (const sh of [shape, slice]) {
    for (const S of [1, 3, 8, 16]) {
      const all = sh.moeLayers * sh.experts;
      const pinned = predictPass(
        sh,
        { sequences: S, streamedBytes: 0, streamedLayers: [], ringBytes: 0, slots: all },
        rates,
      );
      const resident = predictPass(sh, { sequences: S, streamedBytes: 0, slots: 0, resident: true }, rates);
      const expected = computeOf(sh, S, rates);
      for (const p of [pinned, resident]) {
        assert.equal(p.readBytes, 0);
        assert.ok(Math.abs(p.passSeconds / expected - 1) < 1e-12, `S ${S}: ${p.passSeconds} s, not ${expected}`);
        assert.equal(p.passSeconds, p.computeSeconds);
        assert.ok(Math.abs(p.tokensPerSecond - S / expected) < 1e-9);
      }
    }
  }
});

Deno.test("throughput: a larger ring never predicts fewer tokens/s, and a ring of two layers makes reads wait", () => {
  // Every expert cached (a missed expert's read queues behind what the ring read ahead).
  for (const S of [1, 2, 8, 16]) {
    for (const headStreamed of [false, true]) {
      let last = 0;
      for (let ring = 3.6e9; ring <= 12e9; ring += 0.1e9) {
        const split = { ...streamedSlice, sequences: S, headStreamed, ringBytes: ring, slots: 64 };
        const t = predictPass(slice, split, sliceRates).tokensPerSecond;
        assert.ok(t >= last * (1 - 1e-12), `S ${S}, ring ${ring}: ${t} < ${last}`);
        last = t;
      }
      const unbounded = predictPass(
        slice,
        { ...streamedSlice, sequences: S, headStreamed, ringBytes: undefined, slots: 64 },
        sliceRates,
      );
      assert.ok(Math.abs(unbounded.tokensPerSecond / last - 1) < 1e-9, `S ${S}: a ring of everything is unbounded`);
    }
  }
  // 8 rows, a ring of the two largest layers: the read of the third waits for the first to
  // be done, and the streamed head's read is behind the next pass's first layer.
  const p = predictPass(slice, streamedSlice, sliceRates);
  assert.ok(p.passSeconds > 1.2 * Math.max(p.ioSeconds, p.computeSeconds), JSON.stringify(p));
  const noHead = predictPass(slice, { ...streamedSlice, headStreamed: false }, sliceRates);
  assert.ok(noHead.passSeconds < p.passSeconds);
  assert.ok(p.readBytes - noHead.readBytes === slice.headBytes);
});

Deno.test("throughput: a layer's missed experts are read after its routing, beside its expert compute only", () => {
  // One MoE layer, pinned: dense compute, then max(expert compute, expert read + one expert).
  const one: PassShape = { trunkBytes: 1e9, headBytes: 0, moeLayers: 1, experts: 64, topK: 8, expertBytes: 20e6 };
  const r: PassRates = { disk: 2e9, dense: 10e9, expert: 4e9, rowGrowth: 0, expertRowGrowth: 1 };
  const D = distinctExperts(64, 8, 1);
  const expert = 8 * 20e6 / 4e9, read = D * 20e6 * (1 - 10 / 64) / 2e9;
  const p = predictPass(one, { sequences: 1, streamedBytes: 0, streamedLayers: [], ringBytes: 0, slots: 10 }, r);
  const expected = 0.1 + Math.max(expert, read + expert / D);
  assert.ok(Math.abs(p.passSeconds - expected) < 1e-12, `${p.passSeconds} s, not ${expected}`);
  assert.ok(p.passSeconds > Math.max(p.ioSeconds, p.computeSeconds));
  // A streamed layer's products also check its weights: CHECK_SHARE of one row's time.
  const streamed = predictPass(one, { sequences: 1, streamedBytes: 1e9, slots: 64 }, r);
  assert.ok(Math.abs(streamed.computeSeconds - (0.1 * (1 + CHECK_SHARE) + expert)) < 1e-12);
});

Deno.test("throughput: a pinned MoE layer's guessed experts are read behind the layer before it", () => {
  // A dense layer, then a pinned MoE layer: the guess's reads start as layer 0 ends; with
  // every guess right the routing finds them read, with none right it reads them again.
  const two: PassShape = {
    trunkBytes: 2e9,
    headBytes: 0,
    moeLayers: 1,
    experts: 64,
    topK: 8,
    expertBytes: 20e6,
    layers: [1e9, 1e9],
  };
  const r: PassRates = { disk: 2e9, dense: 10e9, expert: 4e9, rowGrowth: 0, expertRowGrowth: 1 };
  const split: PassSplit = { sequences: 1, streamedBytes: 0, streamedLayers: [], ringBytes: 0, slots: 10 };
  const D = distinctExperts(64, 8, 1);
  const expert = 8 * 20e6 / 4e9, read = D * 20e6 * (1 - 10 / 64) / 2e9, dense = 0.1;
  const near = (a: number, b: number, what: string) => assert.ok(Math.abs(a - b) < 1e-12, `${what}: ${a}, not ${b}`);
  const none = predictPass(two, split, r);
  near(none.passSeconds, 2 * dense + Math.max(expert, read + expert / D), "no guess");
  const right = predictPass({ ...two, guessRight: 1 }, split, r);
  near(right.passSeconds, dense + Math.max(dense + expert, read + expert / D), "every guess right");
  near(right.readBytes, none.readBytes, "right guesses read nothing more");
  const wrong = predictPass({ ...two, guessRight: 0 }, split, r);
  near(wrong.passSeconds, none.passSeconds, "guessRight 0 is no guess");
  const half = predictPass({ ...two, guessRight: 0.5 }, split, r);
  near(half.readBytes, none.readBytes + 0.5 * D * 20e6 * (1 - 10 / 64), "half wrong: half the misses read twice");
  assert.ok(right.passSeconds <= half.passSeconds && half.passSeconds <= none.passSeconds, "more right, never slower");
  // Where the reads are the longer part (a slower disk), the late half is read behind the
  // guess: the layer ends at the guess's reads, then half the misses again, then one expert.
  const slow = { ...r, disk: 1e9 };
  near(
    predictPass({ ...two, guessRight: 0.5 }, split, slow).passSeconds,
    Math.max(2 * dense + expert, dense + 2 * read + 0.5 * (2 * read) + expert / D),
    "half right, slow disk",
  );
  // A streamed MoE layer is not guessed (the pass does not wait for its weights to guess).
  const streamed = { sequences: 1, streamedBytes: 1e9, streamedLayers: [1], slots: 10 };
  near(
    predictPass({ ...two, guessRight: 1 }, streamed, r).passSeconds,
    predictPass(two, streamed, r).passSeconds,
    "streamed",
  );
});

Deno.test("throughput: drafted rows cost compute like rows, accepted drafts add tokens", () => {
  const pinned: PassSplit = { sequences: 4, streamedBytes: 0, streamedLayers: [], ringBytes: 0, slots: 64 };
  const base = predictPass(slice, pinned, sliceRates);
  assert.deepEqual(predictPass(slice, { ...pinned, draftRows: 0, acceptedDrafts: 0 }, sliceRates), base);
  // 3 drafted rows a sequence cost what 16 plain rows cost; with none accepted, 4 tokens.
  const drafted = predictPass(slice, { ...pinned, draftRows: 3 }, sliceRates);
  const sixteen = predictPass(slice, { ...pinned, sequences: 16 }, sliceRates);
  assert.ok(Math.abs(drafted.computeSeconds - sixteen.computeSeconds) < 1e-12);
  assert.ok(Math.abs(drafted.tokensPerSecond - 4 / drafted.passSeconds) < 1e-9);
  for (const split of [pinned, streamedSlice]) {
    let last = Infinity;
    for (const draftRows of [0, 1, 2, 4, 8]) {
      const p = predictPass(slice, { ...split, draftRows }, sliceRates);
      assert.ok(p.tokensPerSecond <= last, `${draftRows} drafted rows, none accepted: ${p.tokensPerSecond} > ${last}`);
      last = p.tokensPerSecond;
    }
    last = 0;
    for (const acceptedDrafts of [0, 0.5, 1, 2, 4, 8]) {
      const p = predictPass(slice, { ...split, draftRows: 4, acceptedDrafts }, sliceRates);
      assert.ok(p.tokensPerSecond >= last, `${acceptedDrafts} accepted: ${p.tokensPerSecond} < ${last}`);
      last = p.tokensPerSecond;
    }
    // No more accepted than drafted.
    const all = predictPass(slice, { ...split, draftRows: 4, acceptedDrafts: 4 }, sliceRates);
    assert.equal(
      predictPass(slice, { ...split, draftRows: 4, acceptedDrafts: 9 }, sliceRates).tokensPerSecond,
      all.tokensPerSecond,
    );
  }
});

Deno.test("plan: more memory never predicts fewer tokens/s (preset auto, --parallel auto)", () => {
  let last = 0;
  // Every 24 GB from the floor to 400 GB (each auto plan searches 16 sequence counts).
  for (let gb = 16; gb <= 400; gb += 24) {
    let p: MemoryPlan;
    try {
      p = autoPlan(gb * 1e9);
    } catch {
      assert.equal(last, 0, `${gb} GB does not fit, a smaller budget did`);
      continue;
    }
    const t = p.prediction!.tokensPerSecond;
    assert.ok(t >= last * (1 - 1e-9), `${gb} GB predicts ${t} < ${last}`);
    // Made twice at every other budget: the search is deterministic.
    if ((gb - 16) % 48 === 0) assert.deepEqual(autoPlan(gb * 1e9), p, `${gb} GB: the same plan made twice`);
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

Deno.test("throughput and plan: a coded trunk's streamed layers read their stored footprint, compute their whole bytes", () => {
  const coded: PassShape = { ...slice, streamLayers: slice.layers!.map((b) => 0.7 * b) };
  const raw = predictPass(slice, streamedSlice, sliceRates), less = predictPass(coded, streamedSlice, sliceRates);
  const streamed = streamedSlice.streamedLayers!.reduce((a, L) => a + slice.layers![L], 0);
  assert.ok(Math.abs(raw.readBytes - less.readBytes - 0.3 * streamed) < 1, `${raw.readBytes} - ${less.readBytes}`);
  assert.equal(less.computeSeconds, raw.computeSeconds, "the products still cover every byte");
  assert.ok(less.tokensPerSecond >= raw.tokensPerSecond);
  // The plan passes the footprints through: a streamed split reads fewer bytes.
  const mem: MemoryOptions = { trunkDir: "t", trunkGB: 2 * Math.max(...LAYERS) / 1e9, cacheGB: 1 };
  const plainPlan = makePlan(input(1, mem, { available: 64e9 }));
  const codedPlan = makePlan(
    input(1, mem, { available: 64e9, layerStreamBytes: LAYERS.map((b) => Math.round(0.7 * b)) }),
  );
  assert.ok(plainPlan.prediction && codedPlan.prediction);
  assert.ok(codedPlan.prediction.readBytes < plainPlan.prediction.readBytes);
  assert.deepEqual(codedPlan.trunk.pinned, plainPlan.trunk.pinned, "pins are sized by the decoded bytes");
  // The products' decode of the coded bytes costs compute, once a pass, at the measured rate.
  const decoding: PassShape = { ...coded, codedLayers: slice.layers!.map((b) => 0.95 * b) };
  const slow = predictPass(decoding, streamedSlice, { ...sliceRates, codedDense: 0.8 * sliceRates.dense });
  const streamedDense = streamedSlice.streamedLayers!.reduce((a, L) => a + slice.layers![L], 0);
  const extra = 0.95 * streamedDense * (1 / (0.8 * sliceRates.dense) - 1 / sliceRates.dense);
  assert.ok(
    Math.abs(slow.computeSeconds - less.computeSeconds - extra) < 1e-9,
    `${slow.computeSeconds} ${less.computeSeconds} ${extra}`,
  );
  assert.equal(
    predictPass(decoding, streamedSlice, sliceRates).computeSeconds,
    less.computeSeconds,
    "no rate: no cost",
  );
});

Deno.test("plan: auto weighs more, smaller segments against the pins they leave room for", () => {
  // A predicted prefill that falls with smaller segments down to 3 of 200 rows, then rises.
  const predicted = new Map([[600, 10], [300, 9], [200, 8], [150, 8.5]]);
  const one = { rows: 600, segments: 1 };
  assert.deepEqual(weighSegments(600, one, (rows) => predicted.get(rows) ?? 20), { rows: 200, segments: 3 });
  // Ties keep the fewest segments; no segment below 16 rows is weighed.
  assert.deepEqual(weighSegments(600, one, () => 1), one);
  const weighed: number[] = [];
  weighSegments(40, { rows: 20, segments: 2 }, (rows) => (weighed.push(rows), 1));
  assert.deepEqual(weighed, [20]);
  // The released model at the floor: the fewest segments win (an extra read of the experts
  // outweighs any pin), 1 of 4,096 at 8 GB.
  const floor = { trunkDir: "t", trunkGB: 2.5, cacheGB: 0.31, streamEmbed: true };
  const plan = makePlan({ ...estimatedInput(releasedK3(), floor, 4097, "auto"), prefillTokens: 4096, available: 8e9 });
  assert.deepEqual([plan.chunk, plan.prefill.segments], [4096, 1]);
});

Deno.test("plan: a long prompt's rows cost a tile's share of the arithmetic, whatever the segment; one segment where it fits", () => {
  // rowsCost: the decode batch's growth up to 8 rows, a tile's share per row from 64 on, so
  // a row never costs more in a taller segment, and two segments of n/2 cost what one of n does.
  for (const [small, tile] of [[0, 0.09], [0.02, 0.09], [0.17, 0.13], [0.5, 0.075]]) {
    let perRow = Infinity;
    for (const rows of [1, 2, 8, 9, 16, 37, 63, 64, 73, 1024, 4096]) {
      const c = rowsCost(small, tile, rows);
      assert.ok(c / rows <= perRow + 1e-12, `g ${small}/${tile}: ${rows} rows cost ${c}, more a row than fewer`);
      perRow = c / rows;
    }
    assert.ok(Math.abs(2 * rowsCost(small, tile, 2048) - rowsCost(small, tile, 4096)) < 1e-9);
    assert.equal(rowsCost(small, undefined, 100), 1 + small * 99, "without a tile growth: linear, as decode's");
  }
  // The real-width slice at its floor with row growths a noisy start-up probe measured (the
  // 8-row one below the 64-row one): a 4,096-id prompt still fits whole and runs as one
  // segment (an earlier model of the rows split it in two and read the slice twice).
  // The same for the 32-expert slice, whose products hide the reads of any segment count:
  // the predicted seconds of 1 and of 9 segments then differ only in their sums' last bits,
  // and that must not split the prompt (it read that slice 9 times in one bench run).
  const slice = { ...cfg, numLayers: 3, firstKDense: 1, layerKinds: ["kda", "kda", "mla"] } as typeof cfg;
  const slice32 = { ...slice, moe: { ...slice.moe, numExperts: 32 } };
  const floor = { trunkDir: "t", trunkGB: 2.35, cacheGB: 0.31 };
  for (const [model, disk] of [[slice, 3.7e9], [slice32, 1.37e9]] as const) {
    for (const [small, tile] of [[0, 0.09], [0.02, 0.09], [0.17, 0.13], [0.05, 0.075]]) {
      const r: PassRates = {
        disk,
        dense: 20e9,
        expert: 6e9,
        rowGrowth: small,
        expertRowGrowth: small,
        tileRowGrowth: tile,
      };
      const plan = makePlan({
        ...estimatedInput(model, floor, 4097, "auto"),
        prefillTokens: 4096,
        available: 20e9,
        rates: r,
      });
      const what = `${model.moe.numExperts} experts, g ${small}/${tile}`;
      assert.deepEqual([plan.chunk, plan.prefill.segments], [4096, 1], what);
    }
  }
});
