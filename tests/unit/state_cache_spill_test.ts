/**
 * The spill directory looks after itself (issue 35): temporary spill files a killed
 * process left are removed whenever the directory is scanned (at start and before each
 * spill) when their process is gone (and counted), one of a running process is left alone
 * and counted against the disk budget; caches sharing one directory stay within its
 * budget together; a slow spill read does not turn the disk tier off for good: after
 * {@link REMEASURE_AFTER} declined reads one is read to measure the rate again.
 */

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { prefixKey, REMEASURE_AFTER, StateCache, tempSpillPid } from "../../engine/generate/state_cache.ts";
import { type ModelFingerprint, modelFingerprint, readStateFile } from "../../engine/generate/state_file.ts";
import type { K3Model } from "../../engine/model/model.ts";
import { type OpenedModel, openModel } from "../../engine/open.ts";
import { tempDir, TINY } from "../helpers.ts";

async function withModel(f: (o: OpenedModel) => Promise<void>): Promise<void> {
  const opened = await openModel(TINY, { capacity: 64, chunk: 16, sequences: 1, threads: 1 });
  try {
    await f(opened);
  } finally {
    await opened.close();
  }
}

/** A pid no process has: one past the largest pid_max Linux allows (2^22). */
function deadPid(): number {
  return 2 ** 22 + 1;
}

Deno.test("spill directory: temporary files of a gone process are removed at start and counted; a running one's kept", async () => {
  await using dir = await tempDir();
  await withModel(async (opened) => {
    const orphan = join(dir.path, `ab12.k3state.tmp-${deadPid()}-1700000000000`);
    const live = join(dir.path, `cd34.k3state.tmp-${Deno.pid}-1700000000000`);
    const other = join(dir.path, "notes.tmp-1-2");
    for (const f of [orphan, live, other]) await Deno.writeFile(f, new Uint8Array(1000));
    assert.equal(tempSpillPid(orphan), deadPid());
    assert.equal(tempSpillPid(other), undefined);
    const logs: string[] = [];
    const cache = new StateCache(opened.model, {
      ramBytes: 0,
      dir: dir.path,
      fingerprint: await modelFingerprint(opened),
      log: (l) => void logs.push(l),
    });
    await cache.index();
    const left = [];
    for await (const e of Deno.readDir(dir.path)) left.push(e.name);
    assert.deepEqual(left.sort(), ["cd34.k3state.tmp-" + Deno.pid + "-1700000000000", "notes.tmp-1-2"].sort());
    assert.equal(cache.stats.orphansRemoved, 1);
    assert.match(
      logs.join("\n"),
      /removed .*ab12\.k3state\.tmp-\d+-\d+ \(1\.0 kB\), left by process \d+, which is gone/,
    );
  });
});

/** The snapshot of a state that has processed `tokens`. */
async function snapshotOf(model: K3Model, tokens: number[]): Promise<Uint8Array> {
  const state = model.newState();
  try {
    await model.pass([{ state, ids: tokens, logits: "last" }]);
    return state.snapshot();
  } finally {
    state.free();
  }
}

/** Every byte a spill could leave in `dir` (state files and their temporaries). */
function spillBytes(dir: string): number {
  let n = 0;
  for (const f of Deno.readDirSync(dir)) if (f.name.includes(".k3state")) n += Deno.statSync(join(dir, f.name)).size;
  return n;
}

/** Prefixes of four ids whose spill files have one size (their ids print with as many digits). */
const prefixes = Array.from({ length: 12 }, (_, k) => [10 + k, 30 + k, 50 + k, 70 + k]);
const extra = [22, 42, 62, 82];

/** The size of the spill file of one of {@link prefixes}, measured in a directory of its own. */
async function spillFileBytes(model: K3Model, fingerprint: ModelFingerprint): Promise<number> {
  await using probe = await tempDir();
  const cache = new StateCache(model, { ramBytes: 0, dir: probe.path, fingerprint });
  cache.put(prefixes[0], await snapshotOf(model, prefixes[0]));
  await cache.settled();
  return spillBytes(probe.path);
}

Deno.test("spill budget: a running process's temporaries count against it, a gone one's go at the next spill", async () => {
  await using dir = await tempDir();
  await withModel(async (opened) => {
    const { model } = opened;
    const fingerprint = await modelFingerprint(opened);
    const F = await spillFileBytes(model, fingerprint);
    const cap = Math.floor(2.5 * F);
    const logs: string[] = [];
    const cache = new StateCache(model, {
      ramBytes: 0,
      dir: dir.path,
      diskBytes: cap,
      fingerprint,
      log: (l) => void logs.push(l),
    });
    await cache.index();
    const spill = async (k: number) => {
      cache.put(prefixes[k], await snapshotOf(model, prefixes[k]));
      await cache.settled();
      assert.ok(spillBytes(dir.path) <= cap, `${spillBytes(dir.path)} bytes on disk, budget ${cap}`);
    };
    await spill(0);
    assert.equal(cache.stats.diskEntries, 1);

    // A spill being written by this process (or another running one), and one a killed
    // process left (ten times the budget), planted after the start-up scan.
    const live = join(dir.path, `aa.k3state.tmp-${Deno.pid}-1700000000000`);
    const orphan = join(dir.path, `bb.k3state.tmp-${deadPid()}-1700000000000`);
    await Deno.writeFile(live, new Uint8Array(F));
    await Deno.writeFile(orphan, new Uint8Array(10 * F));
    await spill(1);
    assert.equal(cache.stats.orphansRemoved, 1, "removed at the spill's scan, not only at start");
    assert.equal(cache.stats.diskOtherBytes, F, "the running one's temporary is counted");
    assert.equal(cache.stats.diskEntries, 1, "the older spill file made room for the new one");
    assert.equal(cache.peek(prefixes[0], 100), 0);
    assert.equal(cache.peek(prefixes[1], 100), 4);
    assert.ok(Deno.statSync(live).isFile, "a running process's temporary is left alone");

    // Two temporaries being written hold 2F of 2.5F: no spill file fits beside them.
    await Deno.writeFile(join(dir.path, `cc.k3state.tmp-${Deno.pid}-1700000000001`), new Uint8Array(F));
    await spill(2);
    assert.equal(cache.stats.diskEntries, 0);
    assert.equal(cache.stats.diskOtherBytes, 2 * F);
    assert.match(logs.join("\n"), /no room for 4 positions .* held by temporaries being written; dropping them/);
  });
});

Deno.test("spill budget: two caches sharing one directory stay within it together", async () => {
  await using dir = await tempDir();
  await withModel(async (opened) => {
    const { model } = opened;
    const fingerprint = await modelFingerprint(opened);
    const F = await spillFileBytes(model, fingerprint);
    const cap = 3 * F;
    const logs: string[] = [];
    const [a, b] = [0, 1].map(() =>
      new StateCache(model, { ramBytes: 0, dir: dir.path, diskBytes: cap, fingerprint, log: (l) => void logs.push(l) })
    );
    await Promise.all([a.index(), b.index()]);
    // Both spill at once, round after round: each makes room for the other's files too.
    for (let k = 0; k + 1 < prefixes.length; k += 2) {
      const [pa, pb] = await Promise.all([snapshotOf(model, prefixes[k]), snapshotOf(model, prefixes[k + 1])]);
      a.put(prefixes[k], pa);
      b.put(prefixes[k + 1], pb);
      await Promise.all([a.settled(), b.settled()]);
      assert.ok(spillBytes(dir.path) <= cap, `round ${k / 2}: ${spillBytes(dir.path)} bytes on disk, budget ${cap}`);
    }
    assert.equal(spillBytes(dir.path), cap, "the directory is used up to its budget");
    // Each takes in what the other spilled; a file the other evicted since is recomputed,
    // not counted as damaged.
    await a.index();
    const known = prefixes.filter((p) => a.peek(p, 100) === 4);
    assert.equal(known.length, 3, "a knows every file in the directory, b's included");
    b.put(extra, await snapshotOf(model, extra));
    await b.settled();
    assert.equal(spillBytes(dir.path), cap);
    const gone = known.filter((p) => !existsSync(join(dir.path, `${prefixKey(p)}.k3state`)));
    assert.equal(gone.length, 1, "b evicted one of the files a knows");
    assert.equal(await a.lookup(gone[0], 100), undefined);
    assert.match(logs.join("\n"), /is gone \(evicted by another process sharing the directory\)/);
    assert.equal(a.stats.refused + b.stats.refused, 0);
  });
});

Deno.test("spill reads: after a slow read, a disk entry is read again after REMEASURE_AFTER declines", async () => {
  await using dir = await tempDir();
  await withModel(async (opened) => {
    const { model } = opened;
    let reads = 0;
    const logs: string[] = [];
    const cache = new StateCache(model, {
      ramBytes: 0,
      dir: dir.path,
      fingerprint: await modelFingerprint(opened),
      log: (l) => void logs.push(l),
      read: async (path) => {
        // The first read is slow (a busy disk); the rest are not.
        if (reads++ === 0) await new Promise((r) => setTimeout(r, 300));
        return await readStateFile(path);
      },
    });
    const state = model.newState();
    const tokens = [11, 12, 13, 14];
    await model.pass([{ state, ids: tokens, logits: "last" }]);
    cache.put(tokens, state.snapshot());
    state.free();
    await cache.settled();
    assert.equal(cache.stats.diskEntries, 1);
    assert.ok(await cache.lookup(tokens, 100), "the first read: no rate measured yet");
    assert.equal(reads, 1);
    // Prefill measured as nearly free: the slow rate says every read is slower.
    cache.notePrefillPass(1e-9, 1000);
    for (let i = 1; i < REMEASURE_AFTER; i++) assert.equal(await cache.lookup(tokens, 100), undefined);
    assert.equal(reads, 1);
    assert.ok(await cache.lookup(tokens, 100), "read again to measure the rate");
    assert.equal(reads, 2);
    assert.match(logs.join("\n"), /reading it to measure the disk rate again/);
  });
});
