/**
 * `k3 pull` end to end against tests/hub_server.ts (the hub's protocol on 127.0.0.1, with
 * a CDN on a second port): the tiny checkpoint downloaded and verified byte for byte; the
 * token sent to the hub and never to the CDN; a dropped connection resumed with a Range
 * request; a killed pull resumed by the next run; a corrupted transfer fetched again (and
 * refused when it stays wrong); 401, 404 and 429 with Retry-After; a full disk refused
 * before the first shard (a small tmpfs) and one that fills mid-transfer (the write fault
 * hook), resumed after; an existing directory repaired file by file; --text-only.
 */

import assert from "node:assert/strict";
import { k3, ROOT, tempDir, TINY } from "../helpers.ts";
import { K3_PERMISSIONS } from "../../cli/permissions.ts";
import { COMMIT, repoFromDir, startHub } from "../hub_server.ts";

const VISION = { "preprocessor_config.json": '{"image_processor_type": "KimiK3ImageProcessor"}\n' };
const SHARD2 = "model-00002-of-00003.safetensors";

async function sameFiles(dir: string, names: string[]): Promise<void> {
  for (const n of names) {
    assert.deepEqual(await Deno.readFile(`${dir}/${n}`), await Deno.readFile(`${TINY}/${n}`), n);
  }
}

async function tinyNames(): Promise<string[]> {
  const out: string[] = [];
  for await (const e of Deno.readDir(TINY)) if (e.isFile) out.push(e.name);
  return out.sort();
}

function pull(endpoint: string, args: string[], env: Record<string, string> = {}) {
  return k3(["pull", ...args], { env: { HF_ENDPOINT: endpoint, ...env }, seconds: 120 });
}

Deno.test("pull: the whole repository through a redirect, verified; the token goes to the hub only", async () => {
  await using hub = startHub(await repoFromDir(TINY, VISION));
  await using tmp = await tempDir();
  hub.faults.token = "secret-token";
  const dir = `${tmp.path}/model`;
  const out = await pull(hub.endpoint, [hub.repo, dir], { HF_TOKEN: "secret-token" });
  assert.equal(out.code, 0, out.stderr);
  await sameFiles(dir, await tinyNames());
  assert.ok((await Deno.stat(`${dir}/preprocessor_config.json`)).isFile);
  assert.match(out.stderr, new RegExp(`commit ${COMMIT.slice(0, 12)}`));
  assert.match(out.stderr, /10 files, .* every one verified \(10 downloaded/);
  const cdn = hub.seen.filter((r) => r.server === "cdn");
  assert.equal(cdn.length, 3, "the three shards came from the CDN");
  assert.ok(cdn.every((r) => r.authorization === null), "no token sent to the CDN");
  assert.ok(hub.seen.filter((r) => r.server === "hub").every((r) => r.authorization === "Bearer secret-token"));
  assert.equal([...Deno.readDirSync(dir)].filter((e) => e.name.endsWith(".part")).length, 0);
});

Deno.test("pull: a dropped connection resumes with a Range request; a corrupted file is fetched again", async () => {
  await using hub = startHub(await repoFromDir(TINY));
  await using tmp = await tempDir();
  hub.faults.cut = { path: SHARD2, bytes: 300_000 };
  hub.faults.corrupt = { path: "model-00003-of-00003.safetensors", times: 1 };
  const out = await pull(hub.endpoint, [hub.repo, tmp.path]);
  assert.equal(out.code, 0, out.stderr);
  await sameFiles(tmp.path, await tinyNames());
  assert.match(out.stderr, /model-00002-of-00003\.safetensors: transfer interrupted at 300000 bytes/);
  assert.ok(hub.seen.some((r) => r.server === "cdn" && r.range === "bytes=300000-"), JSON.stringify(hub.seen));
  assert.match(
    out.stderr,
    /model-00003-of-00003\.safetensors: SHA-256 [0-9a-f]{64}, the hub's is [0-9a-f]{64}; downloading it again/,
  );
});

Deno.test("pull: a file that stays corrupt is refused with one line and not kept", async () => {
  await using hub = startHub(await repoFromDir(TINY));
  await using tmp = await tempDir();
  hub.faults.corrupt = { path: SHARD2, times: 2 };
  const out = await pull(hub.endpoint, [hub.repo, tmp.path, "--jobs", "1"]);
  assert.equal(out.code, 1);
  assert.match(out.stderr, /^k3: pull: model-00002-of-00003\.safetensors: SHA-256 [0-9a-f]+ twice, the hub lists/m);
  assert.throws(() => Deno.statSync(`${tmp.path}/${SHARD2}`));
  assert.doesNotMatch(out.stderr, /internal error|\n\s+at /);
});

Deno.test("pull: a killed pull resumes where its part ends", async () => {
  await using hub = startHub(await repoFromDir(TINY));
  await using tmp = await tempDir();
  let reached!: () => void;
  const stalled = new Promise<void>((r) => reached = r);
  hub.faults.stall = { path: SHARD2, bytes: 400_000, reached };
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", ...K3_PERMISSIONS, `${ROOT}/main.ts`, "pull", hub.repo, tmp.path, "--jobs", "1"],
    env: { HF_ENDPOINT: hub.endpoint },
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  await stalled;
  // The part holds what was sent once the client has written it (a bounded wait).
  const part = `${tmp.path}/${SHARD2}.part`;
  for (let i = 0; i < 600 && ((await Deno.stat(part).catch(() => undefined))?.size ?? 0) < 400_000; i++) {
    await new Promise((r) => setTimeout(r, 50));
  }
  child.kill("SIGKILL");
  await child.status;
  assert.equal((await Deno.stat(part)).size, 400_000);
  const out = await pull(hub.endpoint, [hub.repo, tmp.path]);
  assert.equal(out.code, 0, out.stderr);
  await sameFiles(tmp.path, await tinyNames());
  assert.ok(hub.seen.some((r) => r.range === "bytes=400000-"), "resumed with a Range request");
  assert.match(out.stderr, /model-00002-of-00003\.safetensors: resumed, verified/);
});

Deno.test("pull: 401, 404 and 429 with Retry-After", async () => {
  await using hub = startHub(await repoFromDir(TINY));
  await using tmp = await tempDir();
  hub.faults.token = "right";
  let out = await pull(hub.endpoint, [hub.repo, `${tmp.path}/a`], { HF_TOKEN: "wrong" });
  assert.equal(out.code, 1);
  assert.match(out.stderr, /^k3: pull: k3test\/tiny@main: the hub refused access \(401\): HF_TOKEN is set but/m);
  assert.equal(out.stderr.trim().split("\n").length, 1, out.stderr);
  hub.faults.token = undefined;
  out = await pull(hub.endpoint, ["k3test/nothing", `${tmp.path}/b`]);
  assert.equal(out.code, 1);
  assert.match(out.stderr, /^k3: pull: k3test\/nothing@main: not found \(404\): check the repository id/m);
  hub.faults.rateLimited = 1;
  out = await pull(hub.endpoint, [hub.repo, `${tmp.path}/c`]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, /rate limited \(429\); retrying in 1\.0 s/);
  await sameFiles(`${tmp.path}/c`, await tinyNames());
  out = await k3(["pull", "not a repo", tmp.path]);
  assert.equal(out.code, 2);
  assert.match(out.stderr, /is not a repository id; expected OWNER\/NAME/);
});

Deno.test("pull: a disk too small is refused before the first shard; one that fills mid-way resumes", async () => {
  await using hub = startHub(await repoFromDir(TINY));
  await using tmp = await tempDir();
  const small = `${tmp.path}/small`;
  Deno.mkdirSync(small);
  const mount = await new Deno.Command("mount", { args: ["-t", "tmpfs", "-o", "size=2m", "tmpfs", small] }).output();
  if (mount.code === 0) {
    try {
      const out = await pull(hub.endpoint, [hub.repo, `${small}/m`]);
      assert.equal(out.code, 1);
      assert.match(
        out.stderr,
        /^k3: pull: .*\/m needs 3\.\d MB \(3\.\d MB for the files\), its disk has [\d.]+ MB free/m,
      );
      assert.ok(!hub.seen.some((r) => r.server === "cdn"), "no shard byte was fetched");
    } finally {
      await new Deno.Command("umount", { args: [small] }).output();
    }
  } else console.error("pull_test: tmpfs mount failed (not root?); the free-space refusal is not checked here");
  // A disk that fills while writing (the write fault hook stands in for the filling disk).
  const dir = `${tmp.path}/full`;
  let out = await pull(hub.endpoint, [hub.repo, dir, "--jobs", "1"], { K3_FAULT_WRITE_ENOSPC: "1500000" });
  assert.equal(out.code, 1);
  assert.match(out.stderr, /no space left on the device .*; the part so far is kept: run k3 pull again to resume/);
  out = await pull(hub.endpoint, [hub.repo, dir]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, /resumed, verified/);
  await sameFiles(dir, await tinyNames());
});

Deno.test("pull: an existing directory is verified and only the wrong or missing files fetched", async () => {
  await using hub = startHub(await repoFromDir(TINY, VISION));
  await using tmp = await tempDir();
  let out = await pull(hub.endpoint, [hub.repo, tmp.path, "--text-only"]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, /1 vision-only skipped/);
  assert.throws(() => Deno.statSync(`${tmp.path}/preprocessor_config.json`));
  // Damage: one shard flipped, one cut short, one file gone.
  const one = `${tmp.path}/model-00001-of-00003.safetensors`;
  const bytes = await Deno.readFile(one);
  bytes[bytes.length - 7] ^= 1;
  await Deno.writeFile(one, bytes);
  await Deno.truncate(`${tmp.path}/${SHARD2}`, 500_000);
  await Deno.remove(`${tmp.path}/config.json`);
  hub.seen.length = 0;
  out = await pull(hub.endpoint, [hub.repo, tmp.path, "--text-only"]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(
    out.stderr,
    /model-00001-of-00003\.safetensors: its SHA-256 does not match the hub's; downloading it again/,
  );
  assert.match(out.stderr, /model-00002-of-00003\.safetensors: 500000 of \d+ bytes on disk; resuming it/);
  assert.match(out.stderr, /\(1 downloaded, 0 resumed, 2 repaired, 6 already there; 1 vision-only skipped\)/);
  await sameFiles(tmp.path, await tinyNames());
  const fetched = hub.seen.filter((r) => r.server === "cdn" || r.path.includes("/resolve/")).map((r) => r.path);
  assert.ok(!fetched.some((p) => p.endsWith("model-00003-of-00003.safetensors")), "an intact shard is not fetched");
  assert.ok(hub.seen.some((r) => r.range === "bytes=500000-"));
});
