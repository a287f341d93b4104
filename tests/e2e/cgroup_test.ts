/**
 * The cgroup memory limit (engine/native/cgroup.ts): the parser on fake v1 and v2 trees
 * (read through the native reader, k3io_read_small), and a real run inside a v1 (or v2)
 * memory cgroup whose limit the plan does not fit: exit 1 before allocating, one line
 * naming the limit. When this machine refuses a real cgroup, the test's name says why.
 */

import assert from "node:assert/strict";
import { K3_PERMISSIONS } from "../../cli/permissions.ts";
import { cgroupMemory, parseMountinfo, parseProcCgroup } from "../../engine/native/cgroup.ts";
import { readSmallFile } from "../../engine/native/io.ts";
import { k3, ROOT, runCmd, tempDir, TINY } from "../helpers.ts";

/** Writes `files` (path relative to `root` -> content) under `root`. */
async function tree(root: string, files: Record<string, string>): Promise<void> {
  for (const [path, text] of Object.entries(files)) {
    const full = `${root}/${path}`;
    await Deno.mkdir(full.slice(0, full.lastIndexOf("/")), { recursive: true });
    await Deno.writeTextFile(full, text);
  }
}

const MOUNTS_V1 = [
  "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755",
  "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu",
  "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory",
  "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw",
].join("\n") + "\n";

const UNLIMITED_V1 = "9223372036854771712\n";

Deno.test("cgroup: the native reader reads small regular files and refuses the rest", async () => {
  await using dir = await tempDir();
  await Deno.writeTextFile(`${dir.path}/a`, "12345\n");
  assert.equal(readSmallFile(`${dir.path}/a`), "12345\n");
  assert.equal(readSmallFile(`${dir.path}/a`, 3), "123");
  assert.equal(readSmallFile(`${dir.path}/missing`), undefined);
  assert.equal(readSmallFile(dir.path), undefined, "a directory");
  await runCmd("mkfifo", [`${dir.path}/fifo`]);
  assert.equal(readSmallFile(`${dir.path}/fifo`), undefined, "a FIFO is refused, never waited on");
  // /proc itself (the k3 permission set cannot read it through the runtime).
  assert.match(readSmallFile("/proc/self/cgroup") ?? "", /^\d+:/m);
});

Deno.test("cgroup: the parsers of /proc/self/cgroup and mountinfo", () => {
  assert.deepEqual(parseProcCgroup("9:name=systemd:/\n4:cpu,memory:/a/b\n0::/c\n"), { v1: "/a/b", v2: "/c" });
  assert.deepEqual(parseProcCgroup("0::/\n"), { v2: "/" });
  assert.deepEqual(parseProcCgroup("garbage\n\n"), {});
  assert.deepEqual(parseMountinfo(MOUNTS_V1), [
    { version: "v1", root: "/", point: "/sys/fs/cgroup/memory" },
    { version: "v2", root: "/", point: "/sys/fs/cgroup/unified" },
  ]);
  // Octal escapes, optional fields, a mount showing part of the hierarchy.
  assert.deepEqual(
    parseMountinfo("50 1 0:40 /docker/x /my\\040cg rw shared:1 master:2 - cgroup2 cgroup2 rw,nsdelegate\nshort line\n"),
    [{ version: "v2", root: "/docker/x", point: "/my cg" }],
  );
});

Deno.test("cgroup v1 (fake tree): the smallest remaining limit of the cgroup and its ancestors wins; inactive cache counts as free", async () => {
  await using dir = await tempDir();
  const m = "sys/fs/cgroup/memory";
  await tree(dir.path, {
    "proc/self/cgroup": "9:name=systemd:/\n4:memory:/outer/inner\n0::/\n",
    "proc/self/mountinfo": MOUNTS_V1,
    [`${m}/memory.limit_in_bytes`]: UNLIMITED_V1,
    [`${m}/memory.usage_in_bytes`]: "5000000000\n",
    [`${m}/outer/memory.limit_in_bytes`]: "1000000000\n",
    [`${m}/outer/memory.usage_in_bytes`]: "900000000\n",
    [`${m}/outer/memory.stat`]: "cache 1\ninactive_file 7\ntotal_inactive_file 50000000\n",
    [`${m}/outer/inner/memory.limit_in_bytes`]: "300000000\n",
    [`${m}/outer/inner/memory.usage_in_bytes`]: "100000000\n",
    [`${m}/outer/inner/memory.stat`]: "total_inactive_file 0\n",
  });
  // inner leaves 200 MB; outer leaves 1000 - 900 + 50 = 150 MB: the ancestor is tighter.
  assert.deepEqual(cgroupMemory(dir.path), {
    version: "v1",
    cgroup: "/outer",
    limit: 1e9,
    usage: 9e8,
    reclaimable: 5e7,
    remaining: 1.5e8,
  });
  // Loosen the ancestor: the process's own cgroup is the tightest.
  await Deno.writeTextFile(`${dir.path}/${m}/outer/memory.limit_in_bytes`, UNLIMITED_V1);
  assert.equal(cgroupMemory(dir.path)?.cgroup, "/outer/inner");
  assert.equal(cgroupMemory(dir.path)?.remaining, 2e8);
  // Over the limit: nothing left, never negative.
  await Deno.writeTextFile(`${dir.path}/${m}/outer/inner/memory.usage_in_bytes`, "400000000\n");
  assert.equal(cgroupMemory(dir.path)?.remaining, 0);
  // No limit anywhere: undefined (MemAvailable alone decides).
  await Deno.writeTextFile(`${dir.path}/${m}/outer/inner/memory.limit_in_bytes`, UNLIMITED_V1);
  assert.equal(cgroupMemory(dir.path), undefined);
  // Unreadable /proc: undefined, not an error.
  assert.equal(cgroupMemory(`${dir.path}/nowhere`), undefined);
});

Deno.test('cgroup v2 (fake tree): memory.max up to the mount\'s top, "max" is no limit, a mount of part of the hierarchy', async () => {
  await using dir = await tempDir();
  const c = "sys/fs/cgroup";
  await tree(dir.path, {
    "proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
    // The mount shows /kubepods and below (as in a container with its own view).
    "proc/self/mountinfo": "30 1 0:27 /kubepods /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
    [`${c}/memory.max`]: "max\n",
    [`${c}/memory.current`]: "1\n",
    [`${c}/pod1/memory.max`]: "300000000\n",
    [`${c}/pod1/memory.current`]: "290000000\n",
    [`${c}/pod1/memory.stat`]: "anon 1\nactive_file 99999999\ninactive_file 10000000\n",
    [`${c}/pod1/ctr/memory.max`]: "max\n",
    [`${c}/pod1/ctr/memory.current`]: "280000000\n",
  });
  assert.deepEqual(cgroupMemory(dir.path), {
    version: "v2",
    cgroup: "/kubepods/pod1",
    limit: 3e8,
    usage: 2.9e8,
    reclaimable: 1e7,
    remaining: 2e7,
  });
  // A limit file that is not a number is ignored, not trusted.
  await Deno.writeTextFile(`${dir.path}/${c}/pod1/memory.max`, "lots\n");
  assert.equal(cgroupMemory(dir.path), undefined);
  // A process outside what the mount shows: nothing readable, no limit claimed.
  await Deno.writeTextFile(`${dir.path}/proc/self/cgroup`, "0::/elsewhere\n");
  assert.equal(cgroupMemory(dir.path), undefined);
});

/** A memory cgroup this test may create under the process's own (v1, or v2 with the memory
 * controller), or why not. The runtime may not write under /sys, so a shell does. */
async function cgroupParent(): Promise<{ dir: string; version: "v1" | "v2"; limitFile: string } | string> {
  // (Deno.uid needs a permission the test set does not grant.)
  if (!/^Uid:\s+0\s/m.test(readSmallFile("/proc/self/status") ?? "")) return "not root";
  const own = parseProcCgroup(readSmallFile("/proc/self/cgroup") ?? "");
  for (const m of parseMountinfo(readSmallFile("/proc/self/mountinfo", 1 << 20) ?? "")) {
    const path = m.version === "v1" ? own.v1 : own.v2;
    if (path === undefined || m.root !== "/") continue;
    const dir = `${m.point}${path === "/" ? "" : path}`;
    if (m.version === "v2" && !(readSmallFile(`${dir}/cgroup.subtree_control`) ?? "").includes("memory")) continue;
    const probe = await runCmd("sh", ["-c", 'mkdir "$1" && rmdir "$1"', "sh", `${dir}/k3-probe-${Deno.pid}`]);
    if (probe.code !== 0) return `creating a cgroup under ${dir} failed: ${probe.stderr.trim()}`;
    return { dir, version: m.version, limitFile: m.version === "v1" ? "memory.limit_in_bytes" : "memory.max" };
  }
  return "no memory cgroup to create a child in (v1 memory mount, or v2 with the memory controller delegated)";
}

const parent = await cgroupParent();
const LIMIT = 150 * 1024 * 1024;

/** Creates cgroup $1 with limit file $2 = LIMIT, runs the rest of the arguments inside it,
 * removes the cgroup; exits with the command's code (90-92: the cgroup could not be set up). */
const IN_CGROUP = `d=$1; f=$2; shift 2
mkdir "$d" || exit 90
if echo ${LIMIT} > "$d/$f"; then
  sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$d" "$@"; rc=$?
else rc=91; fi
rmdir "$d" || rc=92
exit $rc`;

Deno.test(
  typeof parent === "string"
    ? `cgroup (a real cgroup is refused here: ${parent}; the fake tree asserts the limit instead)`
    : `cgroup ${parent.version} (real): inside a ${
      LIMIT >> 20
    } MiB memory cgroup the tiny plan (163 MB with the runtime) exits 1 before allocating, naming the limit`,
  async () => {
    if (typeof parent === "string") {
      // Not a silent pass: the fake v1 tree proves the limit reaches the parser.
      await using dir = await tempDir();
      await tree(dir.path, {
        "proc/self/cgroup": "4:memory:/t\n",
        "proc/self/mountinfo": MOUNTS_V1,
        "sys/fs/cgroup/memory/t/memory.limit_in_bytes": `${LIMIT}\n`,
        "sys/fs/cgroup/memory/t/memory.usage_in_bytes": "1000\n",
      });
      assert.equal(cgroupMemory(dir.path)?.remaining, LIMIT - 1000);
      return;
    }
    const child = `${parent.dir}/k3-test-${Deno.pid}`;
    const out = await runCmd("sh", [
      "-c",
      IN_CGROUP,
      "sh",
      child,
      parent.limitFile,
      Deno.execPath(),
      "run",
      ...K3_PERMISSIONS,
      `${ROOT}/main.ts`,
      "run",
      TINY,
      "--ids",
      "1,2,3",
      "--gen",
      "2",
    ], { seconds: 60 });
    assert.equal((await runCmd("sh", ["-c", 'test ! -e "$1"', "sh", child])).code, 0, "the test cgroup is removed");
    assert.equal(out.code, 1, out.stderr);
    const lines = out.stderr.trimEnd().split("\n").filter((l) => l.startsWith("k3: "));
    assert.equal(lines.length, 1, out.stderr);
    assert.match(
      lines[0],
      new RegExp(
        `^k3: memory plan needs .* but only .* is available \\(cgroup ${parent.version} /.*k3-test-${Deno.pid} limit 157\\.3 MB, `,
      ),
    );
    assert.equal(out.stdout, "", "nothing generated");
    assert.ok(!out.stderr.includes("ready in"), "refused before the model was loaded");
    // k3 doctor inside the cgroup shows the limit, and uses it as the available memory.
    const doc = await runCmd("sh", [
      "-c",
      IN_CGROUP,
      "sh",
      child,
      parent.limitFile,
      Deno.execPath(),
      "run",
      ...K3_PERMISSIONS,
      `${ROOT}/main.ts`,
      "doctor",
      "--no-read",
    ], { seconds: 60 });
    assert.ok(doc.code === 0 || doc.code === 1, doc.stderr);
    assert.match(
      doc.stdout,
      new RegExp(
        `^cgroup +cgroup ${parent.version} /.*k3-test-${Deno.pid} limit 157\\.3 MB, .*\\(the smaller: used\\)$`,
        "m",
      ),
    );
    assert.match(doc.stdout, /^memory +1\d\d\.\d MB available/m);
    // The same run outside the cgroup fits, and the override still decides when set.
    const free = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "2"]);
    assert.equal(free.code, 0, free.stderr);
    const over = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "2"], { env: { K3_MEM_AVAILABLE_GB: "0.1" } });
    assert.equal(over.code, 1);
    assert.match(over.stderr, /is available \(K3_MEM_AVAILABLE_GB\)/);
  },
);
