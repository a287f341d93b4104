/**
 * Hashed reads survive garbage collection: the array a nonblocking read hands to its I/O
 * thread (the digest) stays alive until the thread is done with it. Found on a real-width
 * slice as an intermittent expert checksum mismatch, when expert reads were hashed on their
 * I/O thread: the part list was unused after the call, a GC during the read freed it, and
 * the thread hashed ranges read from freed memory. Pinned trunk reads still hash on the I/O
 * thread (preadHashed). The child forces collections while reads are in flight.
 */

import assert from "node:assert/strict";
import { K3_PERMISSIONS } from "../../cli/permissions.ts";
import { ROOT, runCmd, tempDir } from "../helpers.ts";

Deno.test("hashed reads give the bytes' own digests while GCs run during the reads", async () => {
  await using dir = await tempDir();
  const out = await runCmd(
    Deno.execPath(),
    ["run", "--v8-flags=--expose-gc", ...K3_PERMISSIONS, `${ROOT}/tests/gc_reads_child.ts`, dir.path, "130"],
    { seconds: 120 },
  );
  assert.equal(out.code, 0, out.stderr);
  const counts = JSON.parse(out.stdout.trim().split("\n").pop()!);
  assert.deepEqual(counts, { calls: 130 * 8, badHash: 0 });
});
