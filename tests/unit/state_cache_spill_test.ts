/**
 * The spill directory looks after itself (issue 35): temporary spill files a killed
 * process left are removed at start when their process is gone (and counted), one of a
 * running process is left alone; a slow spill read does not turn the disk tier off for
 * good: after {@link REMEASURE_AFTER} declined reads one is read to measure the rate again.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { REMEASURE_AFTER, StateCache, tempSpillPid } from "../../engine/generate/state_cache.ts";
import { modelFingerprint, readStateFile } from "../../engine/generate/state_file.ts";
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
