/**
 * The state cache's exactness: a restored state gives the logit bits of the state it was
 * copied from; a sequence continued from a kept prefix gives the tokens and logit bits of
 * the same prompt prefilled from scratch, also after its entry was evicted, spilled and
 * read back; a damaged spill file is refused and its prefix recomputed; sequences sharing
 * a prefix prefill it once; states kept inside a pass equal those of passes ending there.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { Scheduler, type SequenceRequest } from "../../engine/generate/scheduler.ts";
import { StateCache } from "../../engine/generate/state_cache.ts";
import { modelFingerprint, readStateFile } from "../../engine/generate/state_file.ts";
import { type OpenedModel, openModel } from "../../engine/open.ts";
import { ids, packedFloor, tempDir, TINY } from "../helpers.ts";

const CAPACITY = 512;

/** Tokens and the raw bits of every row a token was chosen from. */
interface Run {
  tokens: number[];
  bits: Uint32Array[];
  cached: number;
}

async function generate(
  s: Scheduler,
  prompt: number[],
  gen: number,
  extra: Partial<SequenceRequest> = {},
): Promise<Run> {
  const bits: Uint32Array[] = [];
  const r = await s.submit({
    prompt,
    maxTokens: gen,
    onToken: (_t, logits) => void bits.push(new Uint32Array(logits.slice().buffer)),
    ...extra,
  });
  return { tokens: r.tokens, bits, cached: r.cachedTokens };
}

/** Runs `prompt` through `state` in passes of at most 16 rows; the last pass's logits. */
async function feed(
  model: OpenedModel["model"],
  state: ReturnType<OpenedModel["model"]["newState"]>,
  prompt: number[],
) {
  let logits: Float32Array | undefined;
  for (let i = 0; i < prompt.length; i += 16) {
    [logits] = await model.pass([{ state, ids: prompt.slice(i, i + 16), logits: "last" }]);
  }
  return new Uint32Array(logits!.slice().buffer);
}

async function withModel(f: (o: OpenedModel) => Promise<void>): Promise<void> {
  const opened = await openModel(TINY, { capacity: CAPACITY, chunk: 16, sequences: 4, threads: 1 });
  try {
    await f(opened);
  } finally {
    await opened.close();
  }
}

Deno.test("a restored snapshot gives the logit bits of the state it copies", async () => {
  await withModel(async ({ model }) => {
    const prompt = ids(40, 1);
    const a = model.newState(), b = model.newState();
    try {
      await feed(model, a, prompt.slice(0, 23));
      b.restore(a.snapshot(), a.pos);
      assert.equal(b.pos, 23);
      assert.deepEqual(await feed(model, b, prompt.slice(23)), await feed(model, a, prompt.slice(23)));
      // A state restored into one that held something else: every byte read is overwritten.
      const c = model.newState();
      await feed(model, c, ids(60, 9));
      c.restore(b.snapshot(), b.pos);
      assert.deepEqual(await feed(model, c, [5]), await feed(model, b, [5]));
      c.free();
      assert.throws(() => b.restore(new Uint8Array(3), 4), /bytes/);
    } finally {
      a.free();
      b.free();
    }
  });
});

Deno.test("a continued sequence equals its prompt prefilled from scratch, and prefills only the rest", async () => {
  await withModel(async ({ model }) => {
    const head = ids(100, 2);
    const p1 = [...head, ...ids(20, 3)], p2 = [...head, ...ids(30, 4)];
    const off = new Scheduler(model, { chunk: 16 });
    const want = await generate(off, p2, 6);
    const cache = new StateCache(model, { ramBytes: 1e9 });
    const rows: number[] = [];
    const on = new Scheduler(model, { chunk: 16, cache, onPass: (p) => void rows.push(p.rows) });
    const first = await generate(on, p1, 6, { cacheAt: [100] });
    assert.equal(first.cached, 0);
    assert.deepEqual(first, { ...(await generate(off, p1, 6)), cached: 0 });
    rows.length = 0;
    const got = await generate(on, p2, 6, { cacheAt: [100] });
    assert.equal(got.cached, 100);
    assert.deepEqual(got.tokens, want.tokens);
    assert.deepEqual(got.bits, want.bits);
    // 30 new prompt tokens, then 5 decode passes of one token.
    assert.equal(rows.reduce((a, b) => a + b, 0), 30 + 5);
    assert.deepEqual({ hits: cache.stats.hits, misses: cache.stats.misses }, { hits: 1, misses: 1 });
  });
});

Deno.test("the reply is kept with its closing ids: the next turn continues after it", async () => {
  await withModel(async ({ model }) => {
    const p1 = ids(50, 5), tail = [7, 8, 9];
    const cache = new StateCache(model, { ramBytes: 1e9 });
    const on = new Scheduler(model, { chunk: 16, cache });
    const first = await generate(on, p1, 4, { replyTail: () => tail });
    await on.close();
    const next = [...p1, ...first.tokens, ...tail, ...ids(12, 6)];
    const got = await generate(on, next, 5);
    assert.equal(got.cached, p1.length + first.tokens.length + tail.length);
    const want = await generate(new Scheduler(model, { chunk: 16 }), next, 5);
    assert.deepEqual(got.tokens, want.tokens);
    assert.deepEqual(got.bits, want.bits);
  });
});

Deno.test("a reply the cache cannot read back still resolves (it only loses its kept state)", async () => {
  await withModel(async ({ model }) => {
    const prompt = ids(30, 31);
    const want = await generate(new Scheduler(model, { chunk: 16 }), prompt, 3);
    const cache = new StateCache(model, { ramBytes: 1e9 });
    const unreadable = () => {
      throw new Error("token id 8045 is outside the vocabulary (0..1023)");
    };
    const got = await generate(new Scheduler(model, { chunk: 16, cache }), prompt, 3, {
      cacheAt: [20],
      replyTail: unreadable,
      historyReply: unreadable,
    });
    assert.deepEqual(got.bits, want.bits);
    assert.equal(cache.stats.entries, 1, "only the prompt's state is kept");
  });
});

Deno.test("eviction under a tiny budget, a spill round trip and a damaged spill keep the tokens", async () => {
  await using dir = await tempDir();
  await withModel(async (opened) => {
    const { model } = opened;
    const head = ids(64, 7);
    const prompts = [1, 2, 3].map((s) => [...head, ...ids(10, 10 + s)]);
    const off = new Scheduler(model, { chunk: 16 });
    const want = [];
    for (const p of prompts) want.push(await generate(off, p, 4));
    const one = model.newState();
    await feed(model, one, prompts[0].slice(0, 74));
    const entryBytes = one.snapshot().length;
    one.free();

    // RAM for the longer entry only: it evicts the shorter, which is then prefilled again.
    const tiny = new StateCache(model, { ramBytes: entryBytes });
    const s1 = new Scheduler(model, { chunk: 16, cache: tiny });
    const a = await generate(s1, prompts[0], 4, { cacheAt: [64, 74] });
    assert.equal(tiny.stats.entries, 1);
    assert.equal(tiny.stats.evictions, 1);
    assert.deepEqual(a.tokens, want[0].tokens);
    const b = await generate(s1, prompts[1], 4, { cacheAt: [64] });
    assert.equal(b.cached, 0, "the evicted prefix is prefilled again");
    assert.deepEqual(b.bits, want[1].bits);

    // No RAM at all, a spill directory: every kept state goes to disk and comes back.
    const logs: string[] = [];
    const fingerprint = await modelFingerprint(opened);
    const spill = new StateCache(model, { ramBytes: 0, dir: dir.path, fingerprint, log: (l) => void logs.push(l) });
    const s2 = new Scheduler(model, { chunk: 16, cache: spill });
    await generate(s2, prompts[0], 4, { cacheAt: [64] });
    await spill.settled();
    assert.equal(spill.stats.diskEntries, 1);
    const files = [...Deno.readDirSync(dir.path)].map((f) => f.name);
    assert.equal(files.length, 1);
    const c = await generate(s2, prompts[1], 4);
    assert.equal(c.cached, 64);
    assert.equal(spill.stats.diskHits, 1);
    assert.deepEqual(c.bits, want[1].bits);
    assert.match(logs.join("\n"), /64 positions on disk.*reading it/);

    // One flipped payload byte: refused (checksum), removed, recomputed; same bits. (A
    // cache that found the file at start-up: with no read measured yet it reads, where
    // one that has measured may find prefilling cheaper on a loaded machine.)
    const path = join(dir.path, files[0]);
    const bytes = Deno.readFileSync(path);
    bytes[bytes.length - 100] ^= 1;
    Deno.writeFileSync(path, bytes);
    const found = new StateCache(model, { ramBytes: 0, dir: dir.path, fingerprint, log: (l) => void logs.push(l) });
    await found.index();
    const d = await generate(new Scheduler(model, { chunk: 16, cache: found }), prompts[2], 4);
    assert.equal(d.cached, 0);
    assert.equal(found.stats.refused, 1);
    assert.match(logs.join("\n"), /checksum mismatch.*recomputing its 64 positions/);
    assert.deepEqual(d.bits, want[2].bits);
    assert.equal([...Deno.readDirSync(dir.path)].length, 0);

    // A restarted cache finds a spilled file again, and the disk budget bounds it.
    await generate(s2, prompts[0], 1, { cacheAt: [64, 70] });
    await spill.settled();
    const again = new StateCache(model, { ramBytes: 0, dir: dir.path, fingerprint, diskBytes: 1e12 });
    await again.index();
    assert.equal(again.stats.diskEntries, 2);
    assert.equal(again.peek(prompts[0], 73), 70);
    // A disk hit is read only while reading is estimated cheaper than prefilling: once
    // prefill is measured (nearly) free, the same entry is prefilled instead, and said so.
    const choosyLog: string[] = [];
    const choosy = new StateCache(model, {
      ramBytes: 0,
      dir: dir.path,
      fingerprint,
      log: (l) => void choosyLog.push(l),
    });
    await choosy.index();
    assert.equal((await choosy.lookup(prompts[0], 73))?.from, "disk");
    choosy.notePrefillPass(1e-12, 1e9);
    assert.equal(await choosy.lookup(prompts[0], 73), undefined);
    assert.match(
      choosyLog.join("\n"),
      /no disk rate measured yet: reading it[^]*read ~.* vs prefill ~.*: prefilling instead/,
    );
    const bounded = new StateCache(model, { ramBytes: 0, dir: dir.path, fingerprint, diskBytes: 1 });
    await bounded.index();
    assert.equal(bounded.stats.diskEntries, 0);
    assert.equal([...Deno.readDirSync(dir.path)].length, 0);
  });
});

Deno.test("a disk hit is read while another sequence keeps decoding; both keep their tokens", async () => {
  await using dir = await tempDir();
  await withModel(async (opened) => {
    const { model } = opened;
    const head = ids(64, 21);
    const pA = ids(20, 23), pB = [...head, ...ids(8, 22)];
    const off = new Scheduler(model, { chunk: 16 });
    const wantA = await generate(off, pA, 12), wantB = await generate(off, pB, 4);

    // The spill read is held open until A has decoded 3 tokens after it started (events,
    // not time): a pass loop that waited for the read would never get there.
    let held = false, open!: () => void;
    const gate = new Promise<void>((r) => open = r);
    const openGate = () => {
      held = false;
      open();
    };
    const logs: string[] = [];
    const cache = new StateCache(model, {
      ramBytes: 0,
      dir: dir.path,
      fingerprint: await modelFingerprint(opened),
      log: (l) => void logs.push(l),
      read: async (path) => {
        held = true;
        await gate;
        return await readStateFile(path);
      },
    });
    const s = new Scheduler(model, { chunk: 16, maxSequences: 2, cache });
    await generate(s, [...head, ...ids(8, 24)], 1, { cacheAt: [64] });
    await cache.settled();
    assert.equal(cache.stats.diskEntries, 1);

    const aTokens: number[] = [];
    let duringRead = 0, b: Promise<Run> | undefined;
    // Only so that a regression fails instead of hanging: a loop blocked by the read
    // never finishes A, and then duringRead stays 0.
    const guard = setTimeout(openGate, 60_000);
    const a = await s.submit({
      prompt: pA,
      maxTokens: 12,
      onToken: (t) => {
        aTokens.push(t);
        if (aTokens.length === 1) b = generate(s, pB, 4); // B arrives while A decodes
        if (held && ++duringRead === 3) openGate();
      },
    });
    openGate();
    const got = await b!;
    clearTimeout(guard);
    assert.ok(duringRead >= 3, `A decoded ${duringRead} tokens while B's state was read`);
    assert.deepEqual(a.tokens, wantA.tokens);
    assert.equal(got.cached, 64);
    assert.equal(cache.stats.diskHits, 1);
    assert.deepEqual(got.bits, wantB.bits);
    assert.match(logs.join("\n"), /64 positions on disk.*reading it[^]*read 64 positions .* from disk in/);
  });
});

Deno.test("sequences sharing a prefix prefill it once, in flight together", async () => {
  await withModel(async ({ model }) => {
    const head = ids(200, 8);
    const prompts = [0, 1, 2, 3].map((s) => [...head, ...ids(5 + s, 20 + s)]);
    const off = new Scheduler(model, { chunk: 16 });
    const want = [];
    for (const p of prompts) want.push(await generate(off, p, 3));
    const cache = new StateCache(model, { ramBytes: 1e9 });
    let prefillRows = 0;
    const on = new Scheduler(model, { chunk: 16, maxSequences: 4, cache, onPass: (p) => void (prefillRows += p.rows) });
    const got = await Promise.all(prompts.map((p) => generate(on, p, 3, { cacheAt: [200] })));
    assert.deepEqual(got.map((g) => g.tokens), want.map((w) => w.tokens));
    assert.deepEqual(got.map((g) => g.bits), want.map((w) => w.bits));
    assert.deepEqual(got.map((g) => g.cached), [0, 200, 200, 200]);
    // The prefix once, each suffix, two decode tokens each.
    assert.equal(prefillRows, 200 + (5 + 6 + 7 + 8) + 4 * 2);
  });
});

Deno.test("states kept inside one pass have the bytes of passes ending there, and cost no pass of their own", async () => {
  const opened = await openModel(TINY, { capacity: CAPACITY, chunk: 128, sequences: 2, threads: 1 });
  try {
    const { model } = opened;
    const prompt = ids(120, 40), at = [17, 64, 120];
    const a = model.newState(), b = model.newState();
    try {
      // The plain way: a pass ending at each kept position, the snapshot after it.
      const want: Uint8Array[] = [];
      let from = 0;
      for (const p of at) {
        await model.pass([{ state: a, ids: prompt.slice(from, p), logits: "none" }]);
        want.push(a.snapshot());
        from = p;
      }
      b.keepDuringPass(at);
      await model.pass([{ state: b, ids: prompt, logits: "none" }]);
      const kept = b.takeKept();
      assert.deepEqual(kept.map((k) => k.pos), at);
      kept.forEach((k, i) => {
        const differ = k.payload.length === want[i].length ? k.payload.findIndex((x, j) => x !== want[i][j]) : 0;
        assert.equal(differ, -1, `the state kept at ${k.pos} differs at byte ${differ}`);
      });
      assert.deepEqual(b.takeKept(), []);
    } finally {
      a.free();
      b.free();
    }
    // The scheduler keeps a request's states inside its prefill pass, as many as the
    // cache's RAM budget holds (at least one: with none, the pass ends at the second).
    for (const [ramBytes, passes] of [[1e9, 1], [0, 2]]) {
      const cache = new StateCache(model, { ramBytes });
      let n = 0;
      const s = new Scheduler(model, { chunk: 128, cache, onPass: () => void n++ });
      await generate(s, prompt, 1, { cacheAt: [17, 64] });
      assert.equal(n, passes, `passes with a ${ramBytes}-byte budget`);
      if (ramBytes > 0) assert.ok(cache.has(prompt.slice(0, 17)) && cache.has(prompt.slice(0, 64)));
    }
  } finally {
    await opened.close();
  }
});

Deno.test("at the floor budget with 2 threads, a continued sequence has the resident cache-off bits", async () => {
  await using trunk = await tempDir();
  const { floor } = await packedFloor(TINY, trunk.path);
  const head = ids(90, 30);
  const p1 = [...head, ...ids(9, 31)], p2 = [...head, ...ids(17, 32)];
  let want: Run;
  await withModel(async ({ model }) => void (want = await generate(new Scheduler(model, { chunk: 16 }), p2, 5)));
  const opened = await openModel(TINY, { capacity: CAPACITY, chunk: 16, sequences: 2, threads: 2, memory: floor });
  try {
    const cache = new StateCache(opened.model, { ramBytes: 1e9 });
    const s = new Scheduler(opened.model, { chunk: 16, maxSequences: 2, cache });
    await generate(s, p1, 3, { cacheAt: [90] });
    const got = await generate(s, p2, 5);
    assert.equal(got.cached, 90);
    assert.deepEqual(got.bits, want!.bits);
    assert.deepEqual(got.tokens, want!.tokens);
  } finally {
    await opened.close();
  }
});
