/**
 * Files: every user file k3 reads
 * is checked before it is read (a FIFO, directory or device never hangs or reads without
 * bound), every output is checked before the model loads and written atomically through
 * symlinks (FIFOs and devices directly, `-` to stdout), and a full disk is one line, exit 1,
 * no temporary file left.
 *
 * ENOSPC: a small tmpfs when the tests run as root and may mount one, else the injected
 * write failure of engine/native/files.ts (K3_FAULT_WRITE_ENOSPC).
 *
 * @module
 */

import assert from "node:assert/strict";
import { parseTiktokenModel } from "../../engine/text/tokenizer.ts";
import { K3Error } from "../../engine/errors.ts";
import { copyDir, k3, type Output, ROOT, tempDir, TINY } from "../helpers.ts";

/** k3 with a 30 s limit by default: the inputs here used to hang it. */
const k3t = (args: string[], opts: Parameters<typeof k3>[1] = {}) => k3(args, { seconds: 30, ...opts });

/** `k3 <args>` with a deadline: a hang fails the test instead of stalling the suite. */

/** Exit `code`, and the whole stderr is one `k3:` line matching `why` (nothing loaded first). */
function assertOneLine(out: Output, code: number, why: RegExp, what = ""): void {
  assert.equal(out.code, code, `${what}: ${out.stderr}`);
  const lines = out.stderr.trim().split("\n");
  assert.equal(lines.length, 1, `${what}: one line, got ${out.stderr}`);
  assert.match(lines[0], /^k3: /, what);
  assert.match(lines[0], why, what);
}

/** The last stderr line is a `k3:` line matching `why`; exit `code`; no internal error. */
function assertFails(out: Output, code: number, why: RegExp, what = ""): void {
  assert.equal(out.code, code, `${what}: ${out.stderr}`);
  assert.doesNotMatch(out.stderr, /internal error|Uncaught|panicked|^\s+at /m, what);
  const last = out.stderr.trim().split("\n").at(-1)!;
  assert.match(last, /^k3: /, what);
  assert.match(last, why, what);
}

function mkfifo(path: string): void {
  const r = new Deno.Command("mkfifo", { args: [path] }).outputSync();
  if (!r.success) throw new Error(`mkfifo ${path} failed`);
}

/** Files k3 leaves beside its outputs when something went wrong. */
async function leftovers(dir: string): Promise<string[]> {
  const out: string[] = [];
  for await (const e of Deno.readDir(dir)) if (/k3-tmp|k3-probe|\.partial$/.test(e.name)) out.push(e.name);
  return out;
}

/** A small tmpfs at `dir` (needs root); false when it cannot be mounted here. */
function mountTmpfs(dir: string, size: string): boolean {
  const r = new Deno.Command("mount", { args: ["-t", "tmpfs", "-o", `size=${size}`, "tmpfs", dir], stderr: "null" })
    .outputSync();
  return r.success;
}
const umount = (dir: string) => new Deno.Command("umount", { args: [dir] }).outputSync();

Deno.test("input files: a FIFO in place of any input file is refused at once, never read", async () => {
  await using d = await tempDir();
  for (const victim of ["config.json", "tiktoken.model", "tokenizer_config.json", "model-00002-of-00003.safetensors"]) {
    const m = `${d.path}/m-${victim}`;
    await Deno.mkdir(m);
    await copyDir(TINY, m);
    await Deno.remove(`${m}/${victim}`);
    mkfifo(`${m}/${victim}`);
    const args = victim.startsWith("tok") || victim.startsWith("tik")
      ? ["run", m, "--prompt", "hi", "--gen", "1"]
      : ["run", m, "--ids", "5", "--gen", "1"];
    const out = await k3t(args);
    assertFails(out, victim === "config.json" ? 2 : 1, /FIFO, expected a regular file/, victim);
  }
  const fifo = `${d.path}/fifo`;
  mkfifo(fifo);
  assertOneLine(await k3t(["run", TINY, "--prompt-file", fifo]), 2, /--prompt-file: cannot read .*a FIFO/);
  assertOneLine(await k3t(["tokenize", "--tok", TINY, "--file", fifo]), 2, /--file: cannot read .*a FIFO/);
  assertOneLine(await k3t(["run", TINY, "--prompt-file", d.path]), 2, /is a directory, not a file/);
  // `-` is stdin where the flag documents it.
  const viaStdin = await k3t(["tokenize", "--tok", TINY, "--file", "-"], { stdin: "The capital of France is" });
  const viaText = await k3t(["tokenize", "--tok", TINY, "--text", "The capital of France is"]);
  assert.equal(viaStdin.code, 0, viaStdin.stderr);
  assert.equal(viaStdin.stdout, viaText.stdout);
  const run = await k3t(["run", TINY, "--prompt-file", "-", "--gen", "2"], { stdin: "Once upon a time" });
  const runText = await k3t(["run", TINY, "--prompt", "Once upon a time", "--gen", "2"]);
  assert.equal(run.code, 0, run.stderr);
  assert.equal(run.stdout, runText.stdout);
});

Deno.test("usage: ordinary mistakes get a message, not an internal error", async () => {
  await using d = await tempDir();
  // pack onto a device, a file where a directory is expected.
  assertOneLine(
    await k3t(["pack", TINY, "/dev/null"]),
    2,
    /\/dev\/null is a character device; the trunk needs a directory/,
  );
  assertOneLine(
    await k3t(["run", `${ROOT}/README.md`, "--ids", "1"]),
    2,
    /README\.md is not a model directory: it is a file/,
  );
  assertFails(await k3t(["tokenize", "--tok", `${ROOT}/README.md`, "--text", "x"]), 2, /is not a tokenizer directory/);
  // A shard symlinked to a directory.
  const m = `${d.path}/m`;
  await Deno.mkdir(m);
  await copyDir(TINY, m);
  await Deno.symlink(d.path, `${m}/model-00004-of-00004.safetensors`);
  assertFails(
    await k3t(["run", m, "--ids", "5", "--gen", "1"]),
    1,
    /checkpoint shard: .* a directory, expected a regular file/,
  );
  // 200,000 batch lines: parsed and planned without exhausting the stack (the plan is then
  // refused on purpose, so nothing is generated).
  const input = `${d.path}/in.jsonl`;
  await Deno.writeTextFile(input, Array.from({ length: 200_000 }, (_, i) => `{"id":${i},"ids":[5,17]}`).join("\n"));
  const big = await k3t(["batch", TINY, "--input", input, "--output", `${d.path}/out.jsonl`], {
    seconds: 120,
    env: { K3_MEM_AVAILABLE_GB: "0.001" },
  });
  assertFails(big, 1, /available/);
  assert.doesNotMatch(big.stderr, /call stack/);
});

Deno.test("output files: outputs are checked before the model loads and written through symlinks; FIFOs and devices directly", async () => {
  await using d = await tempDir();
  const base = ["run", TINY, "--ids", "5,17,300", "--gen", "2"];
  // A directory given as a file, a missing directory: exit 2, one line, nothing loaded.
  assertOneLine(await k3t([...base, "--out", d.path]), 2, /--out: .* is a directory, expected a file/);
  assertOneLine(
    await k3t([...base, "--dump-logits", `${d.path}/no/such/x.f32`]),
    2,
    /--dump-logits: cannot write .* does not exist/,
  );
  // Through a symlink: the link stays, its target is replaced (with the target's mode).
  await Deno.mkdir(`${d.path}/real`);
  await Deno.writeTextFile(`${d.path}/real/report.json`, "old");
  await Deno.chmod(`${d.path}/real/report.json`, 0o600);
  await Deno.symlink("real/report.json", `${d.path}/link.json`);
  let out = await k3t([...base, "--out", `${d.path}/link.json`, "--dump-logits", `${d.path}/link.f32`]);
  assert.equal(out.code, 0, out.stderr);
  assert.ok(Deno.lstatSync(`${d.path}/link.json`).isSymlink, "the symlink is kept");
  const report = JSON.parse(await Deno.readTextFile(`${d.path}/real/report.json`));
  assert.deepEqual(report.prompt_ids, [5, 17, 300]);
  assert.equal(Deno.statSync(`${d.path}/real/report.json`).mode! & 0o777, 0o600);
  assert.equal(Deno.statSync(`${d.path}/link.f32`).size, 2 * 1024 * 4);
  // A dangling symlink: the file is created where it points.
  await Deno.symlink("real/new.json", `${d.path}/dangling.json`);
  out = await k3t([...base, "--out", `${d.path}/dangling.json`]);
  assert.equal(out.code, 0, out.stderr);
  assert.ok(Deno.lstatSync(`${d.path}/dangling.json`).isSymlink);
  assert.ok(Deno.statSync(`${d.path}/real/new.json`).isFile);
  // /dev/stdout (a symlink to a pipe here) stays what it is; `-` is stdout too.
  out = await k3t([...base, "--out", "/dev/stdout"]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stdout, /"prompt_ids"/);
  // Deno refuses to stat /dev under the test permissions; stat(1) may.
  const kind = await new Deno.Command("stat", { args: ["-c", "%F", "/dev/stdout"], stdout: "piped" }).output();
  assert.equal(new TextDecoder().decode(kind.stdout).trim(), "symbolic link", "/dev/stdout is untouched");
  out = await k3t([...base, "--out", "-"]);
  assert.match(out.stdout, /"generated_ids"/);
  // A FIFO is written directly (a reader gets the report).
  const fifo = `${d.path}/fifo`;
  mkfifo(fifo);
  const reader = Deno.readTextFile(fifo);
  out = await k3t([...base, "--out", fifo]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(await reader, /"generated_ids"/);
  assert.ok(Deno.statSync(fifo).isFifo);
  // A write error on a device: one line, exit 1.
  assertFails(await k3t([...base, "--out", "/dev/full"]), 1, /cannot write \/dev\/full: no space left/);
  assert.deepEqual(await leftovers(d.path), []);
  assert.deepEqual(await leftovers(`${d.path}/real`), []);
});

Deno.test("output files: batch --output /dev/zero or /dev/full is written, never read", async () => {
  await using d = await tempDir();
  const input = `${d.path}/in.jsonl`;
  await Deno.writeTextFile(input, '{"id":1,"ids":[5,17]}\n{"id":2,"ids":[300]}\n');
  const zero = await k3t(["batch", TINY, "--input", input, "--output", "/dev/zero", "--gen", "2"], { seconds: 30 });
  assert.equal(zero.code, 0, zero.stderr);
  const full = await k3t(["batch", TINY, "--input", input, "--output", "/dev/full", "--gen", "2"], { seconds: 30 });
  assertFails(full, 1, /cannot write \/dev\/full: no space left/);
  // `-` is stdout, with nothing to resume.
  const stdout = await k3t(["batch", TINY, "--input", input, "--output", "-", "--gen", "2"]);
  assert.equal(stdout.code, 0, stdout.stderr);
  assert.equal(stdout.stdout.trim().split("\n").length, 2);
  // A directory as output: exit 2 before the model loads.
  assertOneLine(await k3t(["batch", TINY, "--input", input, "--output", d.path]), 2, /is a directory/);
});

Deno.test("full disk: a full disk in pack, --out, --dump-logits and batch output: one line, exit 1, no temporary files, rerun works", async () => {
  await using d = await tempDir();
  const mnt = `${d.path}/mnt`;
  await Deno.mkdir(mnt);
  // 1.6 MB holds neither the tiny trunk (2.8 MB) nor a second copy of the logits dump.
  const tmpfs = mountTmpfs(mnt, "1600k");
  const inject = (bytes: number): Record<string, string> => (tmpfs ? {} : { K3_FAULT_WRITE_ENOSPC: String(bytes) });
  try {
    if (tmpfs) {
      const packed = await k3t(["pack", TINY, `${mnt}/trunk`]);
      // Refused before the first byte: the trunk does not fit in what the disk has free.
      assertFails(packed, 1, /pack: the trunk needs [\d.]+ GB in \S+, its disk has [\d.]+ GB free/);
      assert.throws(() => Deno.statSync(`${mnt}/trunk`), Deno.errors.NotFound, "no trunk directory left behind");
    }
    // Fill the disk (or inject) so that the report does not fit.
    if (tmpfs) await Deno.writeFile(`${mnt}/filler`, new Uint8Array(1600 * 1024)).catch(() => {});
    const out = await k3t(["run", TINY, "--ids", "5,17", "--gen", "2", "--out", `${mnt}/r.json`], { env: inject(100) });
    assertFails(out, 1, /cannot write .*r\.json: no space left on the device \(\d+ bytes needed\)/);
    const logits = await k3t(["run", TINY, "--ids", "5,17", "--gen", "8", "--dump-logits", `${mnt}/l.f32`], {
      env: inject(100),
    });
    assertFails(logits, 1, /cannot write .*l\.f32: no space left/);
    assert.deepEqual(await leftovers(mnt), []);
    // Batch: the line that does not fit is cut away whole; the results before it stay.
    const input = `${d.path}/in.jsonl`;
    await Deno.writeTextFile(input, Array.from({ length: 6 }, (_, i) => `{"id":${i},"ids":[5,${i}]}`).join("\n"));
    // (Injected in every case: a result line is far smaller than a tmpfs page.)
    const res = `${mnt}/res.jsonl`;
    if (tmpfs) await Deno.remove(`${mnt}/filler`);
    const b = await k3t(["batch", TINY, "--input", input, "--output", res, "--gen", "2"], {
      env: { K3_FAULT_WRITE_ENOSPC: "700" },
    });
    assertFails(b, 1, /cannot write .*res\.jsonl: no space left/);
    const kept = (await Deno.readTextFile(res).catch(() => "")).split("\n").filter((l) => l);
    for (const l of kept) assert.ok(JSON.parse(l).generated_ids, "every kept line is whole");
    assert.ok(kept.length < 6);
    // Space again: the rerun resumes without --force and finishes the rest.
    const again = await k3t(["batch", TINY, "--input", input, "--output", res, "--gen", "2"]);
    assert.equal(again.code, 0, again.stderr);
    assert.equal((await Deno.readTextFile(res)).trim().split("\n").length, 6);
    if (tmpfs) {
      // After the failed pack nothing valid was replaced: with room, the same command works
      // without --force.
      umount(mnt);
      assert.ok(mountTmpfs(mnt, "8m"));
      await Deno.mkdir(`${mnt}/trunk`);
      const ok = await k3t(["pack", TINY, `${mnt}/trunk`]);
      assert.equal(ok.code, 0, ok.stderr);
    }
  } finally {
    if (tmpfs) umount(mnt);
  }
});

Deno.test("tiktoken.model: ranks must be dense and unique, checked before anything is sized by them", () => {
  const refuse = (text: string, why: RegExp) =>
    assert.throws(() => parseTiktokenModel(text), (e: unknown) => e instanceof K3Error && why.test(e.message));
  const good = "QQ== 0\nQg== 1\n";
  // The refusal names the line count, not the rank: the rank was checked against the lines
  // before anything was sized by it.
  refuse(good + "Qw== 999999999\n", /line 3: rank 999999999 is beyond the 4 lines/);
  refuse(good + "Qw== 3\n", /not dense: 3 ranks but the largest is 3 \(rank 2 is missing\)/);
  refuse(good + "Qw== 1\n", /line 3: duplicate rank 1/);
  refuse(good + "Q!== 2\n", /line 3: bad base64/);
  refuse(good + "QQ".repeat(4000) + "== 2\n", /line 3: line of \d+ bytes, at most 4096/);
  assert.equal(parseTiktokenModel(good + "Qw== 2\n").size, 3);
});
