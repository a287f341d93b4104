/**
 * `k3 pull --pack` end to end against tests/hub_server.ts: the trunk laid out from the
 * shards' headers (ranged GETs before the shards) and packed region by region as each shard
 * lands, in the pull's own run. A pull killed mid-shard leaves a partial trunk that does not
 * look whole; the next run keeps the regions packed before and packs the rest, and the
 * result is byte for byte the trunk `k3 pack` makes of the whole checkpoint (raw and
 * split-coded). A shard whose hash is wrong is never packed; a disk that fills while packing
 * keeps what is packed for the next run. A header longer than the first request takes a
 * second, and a server that ignores Range still gives it. A re-pull of the untouched
 * directory trusts the record of verified files; --verify hashes them again.
 */

import assert from "node:assert/strict";
import { k3, ROOT, tempDir, TINY } from "../helpers.ts";
import { K3_PERMISSIONS } from "../../cli/permissions.ts";
import { COMMIT, repoFromDir, startHub } from "../hub_server.ts";
import { shardHead } from "../../cli/pull/pack_as_landed.ts";
import { hubFromEnv } from "../../cli/pull/hub.ts";
import { packTrunk } from "../../pack/pack.ts";
import { HEAD_NAME, PREFIX } from "../../engine/model/tensors.ts";
import type { TrunkManifest } from "../../engine/weights/manifest.ts";
import type { Region } from "../../engine/weights/trunk_geometry.ts";

const SHARD = (i: number) => `model-0000${i}-of-00003.safetensors`;

function pull(endpoint: string, args: string[], env: Record<string, string> = {}) {
  return k3(["pull", ...args], { env: { HF_ENDPOINT: endpoint, ...env }, seconds: 120 });
}

/** The trunk packTrunk (`k3 pack`) makes of the whole tiny checkpoint with `codec`. */
async function reference(dir: string, codec: "raw" | "split"): Promise<string> {
  await packTrunk(TINY, dir, { log: null, codec });
  return dir;
}

/** The trunk in `got` is the one in `want`: the data byte for byte, the manifest but for
 * its time and the source directory's path. */
async function sameTrunk(got: string, want: string): Promise<void> {
  const [a, b] = [await Deno.readFile(`${got}/trunk.bin`), await Deno.readFile(`${want}/trunk.bin`)];
  assert.equal(a.length, b.length, "trunk.bin has the reference's length");
  assert.ok(a.every((x, i) => x === b[i]), "trunk.bin is byte for byte the reference's");
  const strip = (m: TrunkManifest) => ({ ...m, created: "", source: { ...m.source, dir: "" } });
  const read = async (d: string) => JSON.parse(await Deno.readTextFile(`${d}/manifest.json`));
  assert.deepEqual(strip(await read(got)), strip(await read(want)));
}

/** Each tensor of the tiny checkpoint: the shard that holds it (the index's map). */
async function shardOf(): Promise<Record<string, string>> {
  return JSON.parse(await Deno.readTextFile(`${TINY}/model.safetensors.index.json`)).weight_map;
}

/** The regions an interrupted pull --pack recorded as packed (null: not packed). */
async function recorded(trunk: string): Promise<(Region | null)[]> {
  return JSON.parse(await Deno.readTextFile(`${trunk}/trunk.bin.partial.json`)).regions;
}

/** The shards a region's tensors come from. */
function shardsOf(r: Region, map: Record<string, string>): Set<string> {
  return new Set(r.tensors.map((t) => map[t.name === HEAD_NAME ? t.name : PREFIX + t.name]));
}

Deno.test("pull --pack: killed mid-shard, then resumed: packed regions kept, the trunk byte for byte k3 pack's", async () => {
  await using hub = startHub(await repoFromDir(TINY));
  await using tmp = await tempDir();
  const model = `${tmp.path}/m`, trunk = `${tmp.path}/t`;
  let reached!: () => void;
  const stalled = new Promise<void>((r) => reached = r);
  hub.faults.stall = { path: SHARD(3), bytes: 400_000, reached };
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      ...K3_PERMISSIONS,
      `${ROOT}/main.ts`,
      "pull",
      hub.repo,
      model,
      "--pack",
      trunk,
      "--codec",
      "raw",
      "--jobs",
      "1",
    ],
    env: { HF_ENDPOINT: hub.endpoint },
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  await stalled;
  child.kill("SIGKILL");
  await child.status;

  // The headers came first, with ranged requests, before any shard's body.
  const firstBody = hub.seen.findIndex((r) => r.server === "cdn" && r.range === null);
  const headers = hub.seen.filter((r, i) => r.server === "cdn" && r.range?.startsWith("bytes=0-") && i < firstBody);
  assert.equal(headers.length, 3, JSON.stringify(hub.seen));
  // Shards 1 and 2 landed and their regions were packed; nothing looks like a whole trunk.
  const map = await shardOf();
  const before = await recorded(trunk);
  const packed = before.filter((r) => r !== null) as Region[];
  assert.ok(packed.length > 0 && packed.length < before.length, `${packed.length} of ${before.length} packed`);
  for (const r of packed) assert.ok(!shardsOf(r, map).has(SHARD(3)), "no region of the shard in flight");
  assert.throws(() => Deno.statSync(`${trunk}/manifest.json`));
  assert.throws(() => Deno.statSync(`${trunk}/trunk.bin`));

  hub.seen.length = 0;
  const out = await pull(hub.endpoint, [hub.repo, model, "--pack", trunk, "--codec", "raw"]);
  assert.equal(out.code, 0, out.stderr);
  // The shards verified before give their own headers: only the third's is asked for.
  const heads = hub.seen.filter((r) => r.server === "hub" && r.range === "bytes=0-65535").map((r) => r.path);
  assert.deepEqual(heads.map((p) => p.slice(p.lastIndexOf("/") + 1)), [SHARD(3)]);
  assert.match(
    out.stderr,
    new RegExp(`pack: ${packed.length} of ${before.length} trunk regions already packed by an earlier run; kept`),
  );
  assert.match(
    out.stderr,
    new RegExp(`pack: ${before.length - packed.length} trunk regions packed once ${SHARD(3)} landed; all packed`),
  );
  assert.match(out.stderr, new RegExp(`${SHARD(1)}: already there, unchanged since it was verified`));
  assert.match(out.stderr, /pack: wrote .*: 13 layers/);
  assert.throws(() => Deno.statSync(`${trunk}/trunk.bin.partial.json`), "the partial record is gone");
  await sameTrunk(trunk, await reference(`${tmp.path}/ref`, "raw"));

  // Run again on the finished pair: nothing is fetched, hashed or packed.
  const before2 = await Deno.stat(`${trunk}/trunk.bin`);
  const again = await pull(hub.endpoint, [hub.repo, model, "--pack", trunk]);
  assert.equal(again.code, 0, again.stderr);
  assert.match(again.stderr, /pack: .* already holds the trunk of this model .*; nothing to do/);
  assert.doesNotMatch(again.stderr, /packed once/);
  assert.equal((await Deno.stat(`${trunk}/trunk.bin`)).mtime?.getTime(), before2.mtime?.getTime());
});

Deno.test("pull --pack: a shard whose hash is wrong is not packed; fetched again, the split-coded trunk is k3 pack's", async () => {
  await using hub = startHub(await repoFromDir(TINY));
  await using tmp = await tempDir();
  const model = `${tmp.path}/m`, trunk = `${tmp.path}/t`;
  // Wrong twice: the pull gives up on shard 2, having packed only what shard 1 completes.
  hub.faults.corrupt = { path: SHARD(2), times: 2 };
  let out = await pull(hub.endpoint, [hub.repo, model, "--pack", trunk, "--codec", "split", "--jobs", "1"]);
  assert.equal(out.code, 1);
  assert.match(out.stderr, new RegExp(`^k3: pull: ${SHARD(2)}: SHA-256 [0-9a-f]+ twice, the hub lists`, "m"));
  assert.doesNotMatch(out.stderr, new RegExp(`packed once ${SHARD(2)}`));
  const map = await shardOf();
  const regions = await recorded(trunk);
  assert.ok(regions.some((r) => r !== null), "shard 1's regions were packed");
  for (const r of regions) if (r) assert.ok(!shardsOf(r, map).has(SHARD(2)), "nothing of the wrong shard packed");
  assert.throws(() => Deno.statSync(`${trunk}/manifest.json`));

  // Wrong once: fetched again, verified, and only then packed.
  hub.faults.corrupt = { path: SHARD(2), times: 1 };
  out = await pull(hub.endpoint, [hub.repo, model, "--pack", trunk, "--codec", "split"]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(
    out.stderr,
    new RegExp(`${SHARD(2)}: SHA-256 [0-9a-f]{64}, the hub's is [0-9a-f]{64}; downloading it again`),
  );
  assert.match(out.stderr, /layers split-coded/);
  await sameTrunk(trunk, await reference(`${tmp.path}/ref`, "split"));
});

Deno.test("pull --pack: a disk that fills while packing keeps what is there; the next run finishes the trunk", async () => {
  await using hub = startHub(await repoFromDir(TINY));
  await using tmp = await tempDir();
  const model = `${tmp.path}/m`, trunk = `${tmp.path}/t`;
  // The write fault hook stands in for the filling disk: the small files and the first
  // shard fit (1.4 MB), the regions it completes do not.
  const args = [hub.repo, model, "--pack", trunk, "--codec", "raw", "--jobs", "1"];
  let out = await pull(hub.endpoint, args, { K3_FAULT_WRITE_ENOSPC: "1600000" });
  assert.equal(out.code, 1);
  assert.match(
    out.stderr,
    /^k3: pull: cannot write .*\/trunk\.bin\.partial: no space left on the device .*; what is packed so far is kept: run k3 pull again to resume$/m,
  );
  assert.doesNotMatch(out.stderr, /internal error|\n\s+at /);
  assert.throws(() => Deno.statSync(`${trunk}/manifest.json`));
  out = await pull(hub.endpoint, args);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, new RegExp(`${SHARD(1)}: already there, unchanged since it was verified`));
  await sameTrunk(trunk, await reference(`${tmp.path}/ref`, "raw"));
});

Deno.test("pull: a re-pull of an untouched directory trusts the verified record; --verify hashes every file again", async () => {
  await using hub = startHub(await repoFromDir(TINY));
  await using tmp = await tempDir();
  let out = await pull(hub.endpoint, [hub.repo, tmp.path]);
  assert.equal(out.code, 0, out.stderr);
  out = await pull(hub.endpoint, [hub.repo, tmp.path]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, new RegExp(`${SHARD(1)}: already there, unchanged since it was verified`));
  assert.doesNotMatch(out.stderr, /already there, verified/);
  // A file rewritten (a new time) is hashed again even without --verify ...
  const one = `${tmp.path}/${SHARD(1)}`;
  const bytes = await Deno.readFile(one);
  bytes[bytes.length - 3] ^= 1;
  await Deno.writeFile(one, bytes);
  await Deno.utime(one, new Date(), new Date(Date.now() + 5000));
  out = await pull(hub.endpoint, [hub.repo, tmp.path]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, new RegExp(`${SHARD(1)}: its SHA-256 does not match the hub's; downloading it again`));
  // ... and --verify hashes every file, the recorded ones too.
  out = await pull(hub.endpoint, [hub.repo, tmp.path, "--verify"]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, new RegExp(`${SHARD(3)}: already there, verified`));
  assert.doesNotMatch(out.stderr, /unchanged since it was verified/);
});

Deno.test("pull: --codec needs --pack and takes auto, raw or split (usage errors)", async () => {
  let out = await k3(["pull", "k3test/tiny", "/nonexistent/m", "--codec", "raw"]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /^k3: pull: --codec needs --pack$/m);
  out = await k3(["pull", "k3test/tiny", "/nonexistent/m", "--pack", "/nonexistent/t", "--codec", "zip"]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /^k3: pull: --codec "zip": expected auto, raw or split$/m);
});

Deno.test("pull --pack: a shard's header read by ranged GETs, in two when it is longer than the first; a server ignoring Range too", async () => {
  await using hub = startHub(await repoFromDir(TINY));
  const client = { ...hubFromEnv(() => {}), endpoint: hub.endpoint };
  const name = SHARD(2);
  const bytes = await Deno.readFile(`${TINY}/${name}`);
  const want = bytes.subarray(0, 8 + Number(new DataView(bytes.buffer).getBigUint64(0, true)));
  const file = { path: name, size: bytes.length };
  for (const noRanges of [false, true]) {
    hub.faults.noRanges = noRanges;
    hub.seen.length = 0;
    // One request when the header fits the first, two when it does not (the released
    // shards' headers are longer than the first request's 64 kB).
    assert.deepEqual(await shardHead(client, hub.repo, COMMIT, file), want);
    assert.deepEqual(await shardHead(client, hub.repo, COMMIT, file, 1000), want);
    const cdn = hub.seen.filter((r) => r.server === "cdn").map((r) => r.range);
    assert.deepEqual(cdn, ["bytes=0-65535", "bytes=0-999", `bytes=1000-${want.length - 1}`]);
  }
});
