/**
 * The lm_head of a streamed weight source runs on the compute the forward pass gives it (the
 * worker pool), not on the calling thread alone: resident in StreamedWeights, streamed from
 * a packed trunk (ultra), and streamed from the checkpoint; and streamed in many chunks, each
 * chunk's rows on the given compute. Every row of the head goes through the given compute
 * once, and the logits have the bits of the resident model's head computed on one thread. A
 * chunk is a product over part of a matrix's rows: split over the pool, it has the serial
 * bits and writes no other row.
 *
 * @module
 */

import assert from "node:assert/strict";
import { kernels, WTYPE } from "../../engine/native/ffi.ts";
import { NativeBuffer } from "../../engine/native/memory.ts";
import { type Compute, type RowRange, serialCompute, startCompute } from "../../engine/native/pool.ts";
import { noIoStats } from "../../engine/model/weight_source.ts";
import { configFingerprint, loadConfig } from "../../engine/model/config.ts";
import { Checkpoint } from "../../engine/weights/safetensors.ts";
import { openModel } from "../../engine/open.ts";
import { StreamedEmbedHead } from "../../engine/weights/head_stream.ts";
import { TrunkFile } from "../../engine/weights/trunk_file.ts";
import { expertBytesOf, expertSlotBytes } from "../../engine/weights/plan_experts.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";
import { readManifest, weightSample } from "../../engine/weights/manifest.ts";
import { packTrunk } from "../../pack/pack.ts";
import { tempDir, TINY } from "../helpers.ts";

/** A compute that hands every product to `inner` and records the rows each dense one asked for. */
function recording(inner: Compute): Compute & { rows: [number, number][] } {
  const rows: [number, number][] = [];
  return {
    rows,
    matmul(m, x, y, ntok, range?: RowRange) {
      rows.push(range ? [range[0], range[1]] : [0, m.rows]);
      inner.matmul(m, x, y, ntok, range);
    },
    mxfp4: (m, x, y, ntok, sums) => inner.mxfp4(m, x, y, ntok, sums),
    heads: (call, H, work) => inner.heads(call, H, work),
    close() {},
  };
}

/** True when the recorded products cover each of `rows` rows exactly once. */
function eachRowOnce(recorded: [number, number][], rows: number): boolean {
  const covered = new Uint8Array(rows);
  for (const [r0, r1] of recorded) for (let r = r0; r < r1; r++) covered[r]++;
  return covered.every((n) => n === 1);
}

/** The tiny model packed in 4 KiB pieces under `dir` (with 16 KiB chunks its 256 KiB head
 * streams in 16 chunks), with the kernels, its config and its checkpoint. */
async function packedTiny(dir: string) {
  const trunk = `${dir}/trunk`;
  await packTrunk(TINY, trunk, { log: null, pieceBytes: 4096 });
  return { trunk, k: kernels(), cfg: await loadConfig(TINY), ckpt: await Checkpoint.open(TINY) };
}

Deno.test("a streamed source's lm_head goes through the given compute, chunk by chunk, with the resident head's bits", async () => {
  await using d = await tempDir();
  const { trunk, k, cfg, ckpt } = await packedTiny(d.path);
  const pool = await startCompute(k, 3, 1); // split every product over three threads
  const V = cfg.vocabSize, D = cfg.hiddenSize, ntok = 3;
  const x = NativeBuffer.alloc(k, ntok * D * 4, "x");
  const want = NativeBuffer.alloc(k, ntok * V * 4, "logits (resident)");
  const got = NativeBuffer.alloc(k, ntok * V * 4, "logits");
  /** Runs `head` on a recording of the pool: `chunks` products, each row once, resident bits. */
  const check = async (name: string, chunks: number, head: (c: Compute) => void | Promise<void>) => {
    got.u8.fill(0);
    const spy = recording(pool);
    await head(spy);
    assert.equal(spy.rows.length, chunks, `${name}: one product per chunk`);
    assert.ok(eachRowOnce(spy.rows, V), `${name}: every row through the given compute once`);
    assert.deepEqual(got.u8, want.u8, `${name}: logits bit-identical to the resident head`);
  };
  try {
    new Float32Array(x.u8.buffer, x.u8.byteOffset, ntok * D).forEach((_, i, a) => (a[i] = Math.sin(0.37 * i)));
    const opts = { capacity: 8, chunk: 4, threads: 1 };
    const resident = await openModel(TINY, opts);
    try {
      await resident.model.weights.head(x.ptr, want.ptr, ntok, serialCompute(k));
    } finally {
      await resident.close();
    }
    // Through StreamedWeights (the tiny head is one chunk at the real chunk size).
    const m = await readManifest(trunk);
    const floorCache = ((cfg.moe.topK + 1) * expertSlotBytes(expertBytesOf(cfg))) / 1e9;
    const largest = Math.max(...m.layer.map((r) => r.size)) / 1e9;
    const budgets: [string, MemoryOptions][] = [
      ["packed trunk, head resident", { trunkDir: trunk, cacheGB: floorCache }],
      [
        "packed trunk, ultra (head streamed)",
        { trunkDir: trunk, trunkGB: largest, cacheGB: floorCache, streamEmbed: true, preset: "ultra" },
      ],
      ["no trunk, ultra (head streamed from the checkpoint)", { cacheGB: floorCache, streamEmbed: true }],
    ];
    for (const [name, mem] of budgets) {
      const opened = await openModel(TINY, { ...opts, memory: mem });
      try {
        assert.equal(opened.plan.mode, "streamed", name);
        assert.equal(opened.plan.embedHead.streamed, mem.streamEmbed === true, name);
        await check(name, 1, (c) => opened.model.weights.head(x.ptr, got.ptr, ntok, c));
      } finally {
        await opened.close();
      }
    }
    // Many chunks: 16 KiB each.
    const tf = await TrunkFile.open(k, trunk, cfg, await configFingerprint(cfg), await weightSample(k, cfg, ckpt));
    const streams: [string, StreamedEmbedHead][] = [
      ["16 chunks from a packed trunk", StreamedEmbedHead.fromTrunk(k, cfg, tf, noIoStats(), 16384)],
      ["16 chunks from the checkpoint", StreamedEmbedHead.fromCheckpoint(k, cfg, ckpt, noIoStats(), 16384)],
    ];
    try {
      for (const [name, s] of streams) await check(name, 16, (c) => s.matmul(x.ptr, got.ptr, ntok, c));
    } finally {
      for (const [, s] of streams) await s.close();
      tf.close();
    }
  } finally {
    pool.close();
    for (const b of [x, want, got]) b.free();
    ckpt.close();
  }
});

Deno.test("a product over a row range: split over threads with the serial bits; refused with an open check", async () => {
  const k = kernels();
  const rows = 97, cols = 64, ntok = 2, r0 = 13, r1 = 90;
  const w = NativeBuffer.alloc(k, rows * cols * 2, "w"), x = NativeBuffer.alloc(k, ntok * cols * 4, "x");
  const y0 = NativeBuffer.alloc(k, ntok * rows * 4, "y0"), y1 = NativeBuffer.alloc(k, ntok * rows * 4, "y1");
  const pool = await startCompute(k, 3, 1);
  try {
    new Uint16Array(w.u8.buffer, w.u8.byteOffset, rows * cols).forEach((
      _,
      i,
      a,
    ) => (a[i] = 0x3c00 | ((i * 7919) & 0x80ff)));
    new Float32Array(x.u8.buffer, x.u8.byteOffset, ntok * cols).forEach((_, i, a) => (a[i] = Math.cos(i)));
    const m = { ptr: w.ptr, wtype: WTYPE.bf16, rows, cols };
    serialCompute(k).matmul(m, x.ptr, y0.ptr, ntok);
    y1.u8.fill(0xff);
    pool.matmul(m, x.ptr, y1.ptr, ntok, [r0, r1]);
    const f0 = new Uint32Array(y0.u8.buffer, y0.u8.byteOffset, ntok * rows);
    const f1 = new Uint32Array(y1.u8.buffer, y1.u8.byteOffset, ntok * rows);
    for (let t = 0; t < ntok; t++) {
      for (let r = 0; r < rows; r++) {
        const inRange = r >= r0 && r < r1;
        assert.equal(f1[t * rows + r], inRange ? f0[t * rows + r] : 0xffffffff, `token ${t} row ${r}`);
      }
    }
    const checked = { ...m, check: { expect: "0123456789abcdef", verified: false, what: "w" } };
    for (const c of [serialCompute(k), pool]) {
      assert.throws(() => c.matmul(checked, x.ptr, y1.ptr, ntok, [r0, r1]), /internal: w: a check covers every row/);
    }
  } finally {
    pool.close();
    for (const b of [w, x, y0, y1]) b.free();
  }
});

Deno.test("a streamed embedding read in id order reads each verified piece once a run of rows, not once a row", async () => {
  await using d = await tempDir();
  const { trunk, k, cfg, ckpt } = await packedTiny(d.path);
  const V = cfg.vocabSize, D = cfg.hiddenSize;
  const want = NativeBuffer.alloc(k, D * 4, "row (resident)");
  const got = NativeBuffer.alloc(k, D * 4, "row");
  const x = NativeBuffer.alloc(k, D * 4, "x");
  const logits = NativeBuffer.alloc(k, V * 4, "logits");
  const resident = await openModel(TINY, { capacity: 8, chunk: 4, threads: 1 });
  const tf = await TrunkFile.open(k, trunk, cfg, await configFingerprint(cfg), await weightSample(k, cfg, ckpt));
  const stats = noIoStats();
  const s = StreamedEmbedHead.fromTrunk(k, cfg, tf, stats, 16384);
  try {
    const region = (await readManifest(trunk)).embed.size;
    /** Embeds `ids` in order, each row with the resident model's bits; the trunk bytes read. */
    const embedAll = async (ids: number[]) => {
      const before = stats.trunkBytes;
      for (const id of ids) {
        resident.model.weights.embed(id, want.ptr);
        await s.embedRow(id, got.ptr);
        assert.deepEqual(got.u8, want.u8, `row ${id}`);
      }
      return stats.trunkBytes - before;
    };
    const ids = Array.from({ length: 300 }, (_, i) => (i * 7919) % V);
    const sorted = [...ids].sort((a, b) => a - b);
    // Sorted, a piece is read at most twice (a row straddling two pieces reads both).
    const inOrder = await embedAll(sorted);
    assert.ok(inOrder <= 2 * region, `${inOrder} bytes read for a ${region}-byte table`);
    assert.ok(inOrder < sorted.length * 4096, "fewer bytes than a piece a row");
    // The lm_head's chunks reuse the buffer: the held piece is forgotten, the rows stay right.
    await s.matmul(x.ptr, logits.ptr, 1, serialCompute(k));
    assert.ok((await embedAll([sorted[0]])) > 0, "read again after the lm_head");
  } finally {
    await s.close();
    tf.close();
    await resident.close();
    for (const b of [want, got, x, logits]) b.free();
    ckpt.close();
  }
});
