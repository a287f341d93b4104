/**
 * Layer-major prefill: a long prompt in one pass (each layer read once for every row, the
 * wide temporaries in row tiles) gives the bits of token-by-token decoding and the float64
 * reference's answers, resident, pinned and at the floor, on 1 and 2 threads; segments,
 * several prompts in one pass and a restored state change no bit; the plan sizes the
 * segment from the memory.
 *
 * The prompt: 600 ids on the tiny model (13 layers, AttnRes block 3: 5 snapshots; MLA at
 * layers 4, 8, 12, 13; KDA elsewhere), crossing many tiles of 7 rows.
 */

import assert from "node:assert/strict";
import { generate } from "../../engine/generate/generate.ts";
import { MIN_PREFILL_ROWS, Scheduler } from "../../engine/generate/scheduler.ts";
import { openModel } from "../../engine/open.ts";
import { releasedK3 } from "../../engine/model/shapes.ts";
import { segmentRowBytes } from "../../engine/model/scratch.ts";
import { estimatedInput, makePlan } from "../../engine/weights/plan.ts";
import { autoSegment, segmentRows } from "../../engine/weights/plan_segment.ts";
import { expertBytesOf, routedExperts } from "../../engine/weights/plan_experts.ts";
import { packedFloor, tempDir, TINY } from "../helpers.ts";
import { CAPACITY, GEN, greedy, PROMPT, type Run } from "../layer_major.ts";

function assertSameBits(got: Run, want: Run, what: string): void {
  assert.deepEqual(got.tokens, want.tokens, `${what}: tokens`);
  got.logits.forEach((l, i) =>
    assert.deepEqual(new Uint8Array(l.buffer), new Uint8Array(want.logits[i].buffer), `${what}: logits of step ${i}`)
  );
}

let tokenByToken: Run | undefined;
/** Token-by-token decoding (chunk 1), resident, one thread: the bits every run must give. */
async function reference(): Promise<Run> {
  return tokenByToken ??= await greedy({ chunk: 1, threads: 1 });
}

Deno.test("layer-major: a 600-id prompt in one pass, in tiles of 7 or 64 rows, on 1 and 2 threads, gives token-by-token bits", async () => {
  const want = await reference();
  for (const tileRows of [7, 64]) {
    for (const threads of [1, 2]) {
      const got = await greedy({ chunk: PROMPT.length, rows: { tileRows }, threads, splitMin: 1 });
      assertSameBits(got, want, `one pass, tiles of ${tileRows}, ${threads} threads`);
    }
  }
});

Deno.test("layer-major: pinned and at the floor, one segment or three, the resident bits", async () => {
  const want = await reference();
  await using dir = await tempDir();
  const { floor } = await packedFloor(TINY, `${dir.path}/trunk`);
  const pinned = { trunkDir: floor.trunkDir };
  for (const [name, memory] of [["pinned", pinned], ["floor", floor]] as const) {
    for (const threads of [1, 2]) {
      const got = await greedy({ chunk: "auto", prefillTokens: PROMPT.length, memory, threads, splitMin: 1 });
      assertSameBits(got, want, `${name}, chunk auto, ${threads} threads`);
    }
  }
  // Memory for 250 rows of segment, not 600: --chunk auto takes three segments of 200,
  // each a read of the model.
  const sized = await openModel(TINY, { capacity: CAPACITY, chunk: 250, memory: floor, threads: 1 });
  const fits250 = sized.plan.totalBytes + sized.plan.overheadBytes;
  await sized.close();
  const opened = await openModel(TINY, {
    capacity: CAPACITY,
    chunk: "auto",
    prefillTokens: PROMPT.length,
    memory: floor,
    memoryAvailable: { bytes: fits250, source: "test" },
    threads: 1,
  });
  try {
    assert.equal(opened.plan.chunk, 200, "three balanced segments");
    assert.equal(opened.plan.prefill.segments, 3);
    const io0 = opened.model.weights.ioStats!();
    const logits: Float32Array[] = [];
    const steps = await generate(opened.model, PROMPT, {
      gen: 1,
      incremental: true,
      onLogits: (l) => void logits.push(l.slice()),
    });
    const io1 = opened.model.weights.ioStats!();
    assertSameBits({ tokens: steps.map((s) => s.token), logits }, {
      tokens: [want.tokens[0]],
      logits: [want.logits[0]],
    }, "floor, three segments of 200");
    const trunk = opened.plan.trunk.totalBytes;
    // Three segments read the streamed trunk three times (the decode token reads nothing:
    // --gen 1 stops before its pass).
    assert.equal(io1.trunkBytes - io0.trunkBytes, 3 * trunk, "three segments, three reads of the trunk");
  } finally {
    await opened.close();
  }
});

Deno.test("layer-major: several prompts prefilled in one pass equal each alone", async () => {
  const prompts = [PROMPT.slice(0, 150), PROMPT.slice(200, 450), PROMPT.slice(100, 300).reverse()];
  const alone: Run[] = [];
  for (const p of prompts) alone.push(await greedy({ chunk: 1, threads: 1 }, p, 2));
  const total = prompts.reduce((n, p) => n + p.length, 0);
  const opened = await openModel(TINY, { capacity: CAPACITY, chunk: total, sequences: 3, threads: 2, splitMin: 1 });
  try {
    const passes: number[] = [];
    const scheduler = new Scheduler(opened.model, {
      maxSequences: 3,
      chunk: total,
      onPass: (p) => void passes.push(p.rows),
    });
    const runs = await Promise.all(prompts.map(async (prompt) => {
      const logits: Float32Array[] = [];
      const r = await scheduler.submit({
        prompt,
        maxTokens: 2,
        onToken: (_t, l) => void logits.push(l.slice()),
      });
      return { tokens: r.tokens, logits };
    }));
    assert.equal(passes[0], total, "the first pass carries all three prompts");
    runs.forEach((r, i) => assertSameBits(r, alone[i], `prompt ${i} beside the others`));
  } finally {
    await opened.close();
  }
});

Deno.test("layer-major: beside a running decode, a prompt's rows a pass are bounded by the stall limit, with the same bits", async () => {
  const late = PROMPT.slice(0, 300);
  const alone = await greedy({ chunk: 1, threads: 1 }, late, 2);
  const opened = await openModel(TINY, { capacity: CAPACITY, chunk: PROMPT.length, sequences: 2, threads: 1 });
  try {
    const passes: number[] = [];
    // A limit of 0 s: the fewest rows, MIN_PREFILL_ROWS, whatever the measured rate.
    const scheduler = new Scheduler(opened.model, {
      maxSequences: 2,
      maxStallSeconds: 0,
      draft: { mode: "off" },
      onPass: (p) => void passes.push(p.rows),
    });
    let lateRun: Promise<Run> | undefined;
    let decoded = 0;
    const first = scheduler.submit({
      prompt: PROMPT.slice(0, 20),
      maxTokens: 40,
      onToken: () => {
        // The long prompt arrives while the first sequence decodes.
        if (++decoded === 1) {
          const logits: Float32Array[] = [];
          lateRun = scheduler.submit({ prompt: late, maxTokens: 2, onToken: (_t, l) => void logits.push(l.slice()) })
            .then((r) => ({ tokens: r.tokens, logits }));
        }
      },
    });
    await first;
    const got = await lateRun!;
    assertSameBits(got, alone, "a prompt prefilled beside a decode");
    const beside = passes.slice(1, 1 + Math.ceil(late.length / MIN_PREFILL_ROWS));
    assert.ok(beside.every((rows) => rows <= 1 + MIN_PREFILL_ROWS), `passes beside the decode: ${beside}`);
    assert.ok(beside.some((rows) => rows === 1 + MIN_PREFILL_ROWS), "the prompt's rows ran beside the decode");
  } finally {
    await opened.close();
  }
});

Deno.test("layer-major: drafted passes in tiles of 2 rows (the speculation record taken at a segment's first row) keep the plain bits", async () => {
  const prompt = Array.from({ length: 40 }, (_, i) => [5, 17, 300, 42, 99, 123, 640, 7][i % 8]);
  const plain = await greedy({ chunk: 1, threads: 1 }, prompt, 16);
  const opened = await openModel(TINY, { capacity: CAPACITY, chunk: 16, rows: { tileRows: 2 }, threads: 1 });
  try {
    const logits: Float32Array[] = [];
    const r = await new Scheduler(opened.model, { draft: { mode: "lookup", force: true } }).submit({
      prompt,
      maxTokens: 16,
      onToken: (_t, l) => void logits.push(l.slice()),
    });
    assert.ok((r.draft?.drafted ?? 0) > 0, "drafts were verified");
    assertSameBits({ tokens: r.tokens, logits }, plain, "forced drafts, tiles of 2");
  } finally {
    await opened.close();
  }
});

Deno.test("layer-major: a state restored after 300 ids prefills the other 300 in one pass with the same bits", async () => {
  const want = await reference();
  const opened = await openModel(TINY, { capacity: CAPACITY, chunk: PROMPT.length, threads: 1 });
  try {
    const model = opened.model;
    const first = model.newState();
    await model.forward(first, PROMPT.slice(0, 300));
    const restored = model.newState();
    restored.restore(first.snapshot(), first.pos);
    first.free();
    const logits: Float32Array[] = [];
    const passes: number[] = [];
    const rows0 = model.ledger.prefillPassRows, decode0 = model.ledger.decodePassRows;
    const r = await new Scheduler(model, { onPass: (p) => void passes.push(p.rows) }).submit({
      prompt: PROMPT.slice(300),
      state: restored,
      maxTokens: GEN,
      onToken: (_t, l) => void logits.push(l.slice()),
    });
    assert.equal(passes[0], 300, "the rest of the prompt in one pass");
    assert.equal(model.ledger.prefillPassRows - rows0, 300, "the ledger counts the prefill pass's rows");
    assert.equal(model.ledger.decodePassRows - decode0, GEN - 1, "and the decode passes' rows apart");
    assertSameBits({ tokens: r.tokens, logits }, want, "restored after 300");
  } finally {
    await opened.close();
  }
});

Deno.test("plan: a segment row's bytes, balanced segments, and auto sizes the released model's 4,096 ids at the floor", () => {
  // The residual stream and 9 AttnRes sources, the experts' latent input and 16 outputs,
  // the routing and where each output landed: 4 x (9 x 7168 + 3584 + 16 x 3584) + 12 x 16.
  assert.equal(segmentRowBytes(releasedK3()), 501_952);
  assert.deepEqual(segmentRows(600, 250), { rows: 200, segments: 3 });
  assert.deepEqual(segmentRows(600, 600), { rows: 600, segments: 1 });
  assert.deepEqual(autoSegment(600, (rows) => rows <= 250), { rows: 200, segments: 3 });
  assert.deepEqual(autoSegment(600, undefined), { rows: 600, segments: 1 }, "unknown memory: up to 1024");
  const cfg = releasedK3();
  // The ultra preset (the 8 GB floor): 2.5 GB of trunk, 0.31 GB of experts, embedding streamed.
  const floor = { trunkDir: "t", trunkGB: 2.5, cacheGB: 0.31, streamEmbed: true };
  const at = (available: number) =>
    makePlan({ ...estimatedInput(cfg, floor, 4097, "auto"), prefillTokens: 4096, available });
  const eight = at(8e9);
  assert.equal(eight.chunk, 4096, "4,096 ids fit one segment in 8 GB");
  assert.equal(eight.prefill.segments, 1);
  assert.ok(eight.totalBytes + eight.overheadBytes <= 8e9);
  const five = at(5e9);
  assert.ok(five.prefill.segments >= 2, `5 GB: ${five.prefill.segments} segments`);
  assert.ok(five.totalBytes + five.overheadBytes <= 5e9);
  assert.equal(five.chunk, Math.ceil(4096 / five.prefill.segments), "balanced segments");
  // One segment reads the streamed trunk and each expert at most once; an explicit
  // 16-token segment is kept, and reads the model 256 times.
  const model = eight.trunk.totalBytes + routedExperts(cfg) * expertBytesOf(cfg);
  assert.ok(eight.prefill.readBytes <= model, `${eight.prefill.readBytes} <= ${model}`);
  const sixteen = makePlan({ ...estimatedInput(cfg, floor, 4097, 16), prefillTokens: 4096 }).prefill;
  assert.equal(sixteen.segments, 256);
  assert.ok(sixteen.readBytes > 50 * eight.prefill.readBytes, "16-token segments read the model over and over");
});
