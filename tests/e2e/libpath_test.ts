/**
 * The kernel-library loader (engine/native/libpath.ts): resolution order, and every step of the
 * embedded-library path of a compiled `k3` (hash, extract, reuse, corrupt cache), run
 * here without `deno compile` by pointing the loader at a real file as if it were the
 * embedded one.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import {
  cacheDir,
  chooseEmbedded,
  extractLibrary,
  HASH_PREFIX,
  LIB_EXT,
  moduleLibraryPath,
  resolveLibrary,
  sha256Hex,
} from "../../engine/native/libpath.ts";
import { openKernels } from "../../engine/native/ffi.ts";
import { permissionFlags } from "../../cli/permissions.ts";
import { k3, ROOT, runCmd, tempDir } from "../helpers.ts";

const envOf = (vars: Record<string, string>) => (name: string) => vars[name];
const LIB = `${ROOT}/kernels/build/libk3.${LIB_EXT}`;

Deno.test("sha256Hex matches node:crypto and a known vector", () => {
  assert.equal(
    sha256Hex(new TextEncoder().encode("abc")),
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
  );
  const bytes = crypto.getRandomValues(new Uint8Array(4096));
  assert.equal(sha256Hex(bytes), createHash("sha256").update(bytes).digest("hex"));
});

Deno.test("cacheDir: XDG_CACHE_HOME, else ~/.cache, else an error naming the variables", () => {
  assert.equal(cacheDir(envOf({ XDG_CACHE_HOME: "/x/cache", HOME: "/home/u" })), "/x/cache/k3");
  assert.equal(cacheDir(envOf({ HOME: "/home/u" })), "/home/u/.cache/k3");
  // A relative XDG_CACHE_HOME is invalid per the XDG spec and ignored.
  assert.equal(cacheDir(envOf({ XDG_CACHE_HOME: "rel", HOME: "/home/u" })), "/home/u/.cache/k3");
  assert.throws(() => cacheDir(envOf({})), /XDG_CACHE_HOME or HOME/);
});

Deno.test("moduleLibraryPath is the checkout's kernels/build library", () => {
  assert.equal(moduleLibraryPath(), LIB);
});

Deno.test("extract: written, reused, rewritten when corrupt or truncated; atomic (no temp files left)", async () => {
  await using dir = await tempDir();
  const bytes = await Deno.readFile(LIB);
  const cache = `${dir.path}/cache/k3`;
  const first = extractLibrary(bytes, cache);
  assert.equal(first.action, "written");
  assert.equal(first.path, `${cache}/lib-${sha256Hex(bytes).slice(0, HASH_PREFIX)}.${LIB_EXT}`);
  assert.deepEqual(await Deno.readFile(first.path), bytes);
  assert.equal((await Deno.stat(cache)).mode! & 0o777, 0o700);

  const mtime = (await Deno.stat(first.path)).mtime!.getTime();
  const again = extractLibrary(bytes, cache);
  assert.deepEqual(again, { path: first.path, action: "reused" });
  assert.equal(
    (await Deno.stat(first.path)).mtime!.getTime(),
    mtime,
    "a matching copy is not rewritten",
  );

  // A flipped byte (same size): re-extracted.
  const bad = bytes.slice();
  bad[bad.length >> 1] ^= 0xff;
  await Deno.writeFile(first.path, bad);
  assert.equal(extractLibrary(bytes, cache).action, "rewritten");
  assert.deepEqual(await Deno.readFile(first.path), bytes);

  // Truncated (a crash mid-copy by something other than us): re-extracted.
  await Deno.truncate(first.path, 100);
  assert.equal(extractLibrary(bytes, cache).action, "rewritten");
  assert.deepEqual(await Deno.readFile(first.path), bytes);

  // Different content gets a different name; nothing else is left in the directory.
  const other = extractLibrary(new TextEncoder().encode("another build"), cache);
  assert.notEqual(other.path, first.path);
  const names = [];
  for await (const e of Deno.readDir(cache)) names.push(e.name);
  assert.deepEqual(names.sort(), [first.path, other.path].map((p) => p.split("/").pop()).sort());

  // The extracted copy is a loadable kernel library.
  const lib = openKernels(first.path);
  try {
    assert.ok(lib.symbols.k3_isa());
  } finally {
    lib.close();
  }
});

Deno.test("extract: an unwritable cache dir is a one-line error naming the way out", async () => {
  await using dir = await tempDir();
  await Deno.writeTextFile(`${dir.path}/file`, "not a directory");
  assert.throws(
    () => extractLibrary(new Uint8Array([1, 2, 3]), `${dir.path}/file/k3`),
    /cannot extract the kernel library .*XDG_CACHE_HOME or K3_LIB/,
  );
});

Deno.test("resolve: K3_LIB first, then the checkout, else a build hint", async () => {
  await using dir = await tempDir();
  assert.deepEqual(
    resolveLibrary({ env: envOf({ K3_LIB: "/some/lib.so" }), modulePath: LIB, standalone: true }),
    { path: "/some/lib.so", source: "env" },
  );
  assert.deepEqual(resolveLibrary({ env: envOf({}), modulePath: LIB, standalone: false }), {
    path: LIB,
    source: "checkout",
  });
  assert.throws(
    () => resolveLibrary({ env: envOf({}), modulePath: `${dir.path}/missing.so`, standalone: false }),
    /not found .*make -C kernels/,
  );
  // Default arguments: this process is a checkout.
  if (!Deno.env.get("K3_LIB")) assert.equal(resolveLibrary().source, "checkout");
});

Deno.test("resolve in a compiled binary: the embedded file is extracted to the cache and reused", async () => {
  await using dir = await tempDir();
  // Stand-in for the embedded file: deno compile's file system serves it at the module path.
  const embedded = `${dir.path}/vfs/kernels/build/libk3.${LIB_EXT}`;
  await Deno.mkdir(`${dir.path}/vfs/kernels/build`, { recursive: true });
  await Deno.copyFile(LIB, embedded);
  const env = envOf({ XDG_CACHE_HOME: `${dir.path}/xdg`, HOME: `${dir.path}/home` });
  const r1 = resolveLibrary({ env, modulePath: embedded, standalone: true });
  assert.equal(r1.source, "embedded");
  assert.equal(r1.action, "written");
  assert.ok(r1.path.startsWith(`${dir.path}/xdg/k3/lib-`), r1.path);
  const r2 = resolveLibrary({ env, modulePath: embedded, standalone: true });
  assert.deepEqual(r2, { ...r1, action: "reused" });
  await Deno.writeTextFile(r1.path, "garbage");
  assert.equal(resolveLibrary({ env, modulePath: embedded, standalone: true }).action, "rewritten");
  // No embedded file: an error pointing at deno task compile / K3_LIB.
  assert.throws(
    () => resolveLibrary({ env, modulePath: `${dir.path}/nope.so`, standalone: true }),
    /no embedded kernel library.*deno task compile/,
  );
});

Deno.test("embedded builds: the fastest the CPU runs (x86-64), else the native one", () => {
  const all = (_: string) => true;
  const avx512 = new Set(["avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"]);
  assert.equal(chooseEmbedded(all, avx512, "x86_64"), `libk3-avx512.${LIB_EXT}`);
  assert.equal(
    chooseEmbedded(all, new Set(["avx2", "avx512f"]), "x86_64"),
    `libk3-avx2.${LIB_EXT}`,
  );
  assert.equal(chooseEmbedded(all, new Set(["sse4_2"]), "x86_64"), `libk3-scalar.${LIB_EXT}`);
  assert.equal(
    chooseEmbedded((f) => !f.includes("avx512"), avx512, "x86_64"),
    `libk3-avx2.${LIB_EXT}`,
  );
  assert.equal(chooseEmbedded(() => false, avx512, "x86_64"), undefined);
  assert.equal(chooseEmbedded(all, new Set(["asimd"]), "aarch64"), undefined);
});

Deno.test("resolve in a compiled binary with per-ISA builds: picks by CPU flags, extracts that one", async () => {
  await using dir = await tempDir();
  const build = `${dir.path}/vfs/kernels/build`;
  await Deno.mkdir(build, { recursive: true });
  await Deno.copyFile(LIB, `${build}/libk3.${LIB_EXT}`);
  const variants: Record<string, Uint8Array> = {};
  for (const v of ["avx512", "avx2", "scalar"]) {
    variants[v] = new TextEncoder().encode(`stand-in ${v} build`);
    await Deno.writeFile(`${build}/libk3-${v}.${LIB_EXT}`, variants[v]);
  }
  const env = envOf({ XDG_CACHE_HOME: `${dir.path}/xdg` });
  const at = (flags: string[], arch = "x86_64") =>
    resolveLibrary({
      env,
      modulePath: `${build}/libk3.${LIB_EXT}`,
      standalone: true,
      cpuFlags: new Set(flags),
      arch,
    });
  const r = at(["avx2"]);
  assert.equal(r.file, `libk3-avx2.${LIB_EXT}`);
  assert.deepEqual(await Deno.readFile(r.path), variants.avx2);
  assert.deepEqual(await Deno.readFile(at([]).path), variants.scalar);
  assert.deepEqual(
    await Deno.readFile(at(["avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"]).path),
    variants.avx512,
  );
  assert.equal(at(["asimd"], "aarch64").file, `libk3.${LIB_EXT}`);
});

Deno.test("CLI: a bad K3_LIB is one line and exit 1", async () => {
  const out = await k3(["run", `${ROOT}/tests/fixtures/tiny`, "--ids", "1,2", "--gen", "1"], {
    env: { K3_LIB: "/nonexistent/libk3.so" },
  });
  assert.equal(out.code, 1, out.stderr);
  assert.equal(out.stderr.trim().split("\n").length, 1, out.stderr);
  assert.match(out.stderr, /^k3: cannot load kernel library \/nonexistent\/libk3\.so: .*K3_LIB/);
});

Deno.test("deno task compile: the library is embedded verbatim, and a binary that is not k3 is refused", async () => {
  // The deno binary standing in for denort produces a file laid out like the real one
  // (runtime + embedded files) whose runtime ignores the payload. The build itself is
  // checked with compile.ts's own argument list: this Deno accepts the flags and embeds
  // libk3 byte for byte. The task then proves its result: that stand-in prints Deno's
  // version, not k3's, so the task fails and leaves no file.
  const { compileArgs, PERMISSIONS } = await import("../../cli/compile.ts");
  await using dir = await tempDir();
  const out = `${dir.path}/k3`;
  const res = await runCmd(Deno.execPath(), compileArgs(out), { env: { DENORT_BIN: Deno.execPath() } });
  assert.equal(res.code, 0, res.stderr);
  assert.ok(PERMISSIONS.includes("--allow-ffi") && PERMISSIONS.some((p) => p.startsWith("--allow-env=K3_LIB,")));
  // deno compile lists the embedded files as a tree: no node_modules in it.
  // deno-lint-ignore no-control-regex
  const tree = res.stderr.replace(/\x1b\[[0-9;]*m/g, "");
  assert.match(tree, /^[│├└─┬\s]*kernels\b/m);
  assert.doesNotMatch(tree, /^[│├└─┬\s]*node_modules/m, "no npm packages in the binary");
  const bin = await Deno.readFile(out);
  for (const f of [`libk3.${LIB_EXT}`, `libk3-scalar.${LIB_EXT}`]) {
    assert.ok(compileArgs(out).join(" ").includes(`--include kernels/build/${f}`), f);
    assert.ok(
      indexOf(bin, await Deno.readFile(`${ROOT}/kernels/build/${f}`)) > 0,
      `${f} bytes inside the binary`,
    );
  }
  const task = await compileTask(`${dir.path}/k3b`, { DENORT_BIN: Deno.execPath() });
  assert.equal(task.code, 1, task.stderr);
  assert.match(task.stderr, /compile: the built binary is not k3: .*--version printed "deno \d+\.\d+\.\d+.*not "k3 \d/);
  assert.match(
    task.stderr,
    /--allow-read --allow-write --allow-ffi --allow-sys=statfs,systemMemoryInfo --allow-env=K3_LIB,/,
  );
  assert.deepEqual([...Deno.readDirSync(dir.path)].map((e) => e.name).sort(), ["k3"], "nothing written");
});

Deno.test("deno task compile without denort: a clear message naming DENORT_BIN, exit 1", async () => {
  await using dir = await tempDir();
  // An unreachable proxy makes the runtime download fail the same way offline does.
  const res = await compileTask(`${dir.path}/k3`, {
    HTTPS_PROXY: "http://127.0.0.1:9",
    HTTP_PROXY: "http://127.0.0.1:9",
    DENORT_BIN: "",
  });
  assert.equal(res.code, 1, res.stderr);
  assert.match(
    res.stderr,
    /deno compile needs Deno's runtime "denort" \d+\.\d+\.\d+.*\n.*\n.*DENORT_BIN=\$PWD\/denort npm run compile/,
  );
  const bad = await compileTask(`${dir.path}/k3`, { DENORT_BIN: `${dir.path}/nope` });
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /DENORT_BIN=.*nope does not exist/);
});

/** `deno task compile --output <output>` (its permission set, deno.json's "compile") with `env`. */
function compileTask(output: string, env: Record<string, string>) {
  return runCmd(Deno.execPath(), ["run", ...permissionFlags("compile"), `${ROOT}/cli/compile.ts`, "--output", output], {
    env,
  });
}

/** First index of `needle` in `hay`, or -1. */
function indexOf(hay: Uint8Array, needle: Uint8Array): number {
  const first = needle[0];
  outer: for (
    let i = hay.indexOf(first);
    i >= 0 && i <= hay.length - needle.length;
    i = hay.indexOf(first, i + 1)
  ) {
    for (let j = 1; j < needle.length; j++) if (hay[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}
