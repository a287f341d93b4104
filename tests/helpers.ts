/**
 * Test helpers: run the CLI as a subprocess, run the Python oracle, make temp dirs.
 *
 * @module
 */

import assert from "node:assert/strict";
import { K3_PERMISSIONS, PERMISSION_SETS, permissionFlags } from "../cli/permissions.ts";

export const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
export const TINY = `${ROOT}/tests/fixtures/tiny`;
/** The tiny shape trained on English (tools/train_tiny): real text, same layers and widths. */
export const TINY_EN = `${ROOT}/tests/fixtures/tiny-en`;
export const ORACLE = `${ROOT}/tests/oracle`;

/** Deterministic ids below the tiny model's vocabulary (a linear congruential walk from `seed`). */
export function ids(n: number, seed: number): number[] {
  let x = seed >>> 0;
  return Array.from({ length: n }, () => ((x = (x * 1103515245 + 12345) >>> 0) >>> 8) % 1000 + 10);
}

/** Output of a finished subprocess. */
export interface Output {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs a command to completion and collects its output. */
export async function runCmd(
  cmd: string,
  args: string[],
  opts: { cwd?: string; env?: Record<string, string>; stdin?: string; clearEnv?: boolean; seconds?: number } = {},
): Promise<Output> {
  const child = new Deno.Command(cmd, {
    args,
    cwd: opts.cwd ?? ROOT,
    env: opts.env,
    clearEnv: opts.clearEnv,
    stdin: opts.stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
    // A hang is a failure, not a stuck suite.
    signal: opts.seconds === undefined ? undefined : AbortSignal.timeout(opts.seconds * 1000),
  }).spawn();
  if (opts.stdin !== undefined) {
    const w = child.stdin.getWriter();
    await w.write(new TextEncoder().encode(opts.stdin));
    await w.close();
  }
  const out = await child.output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** The environment variables only tests set (fault injection, small sizes): what deno.json's
 * set "k3-test" grants beyond "k3". Apart from them the two sets are the same. */
const TEST_HOOKS: string[] = (() => {
  const { env: prod, ...rest } = PERMISSION_SETS.k3, { env: test, ...testRest } = PERMISSION_SETS["k3-test"];
  if (JSON.stringify(rest) !== JSON.stringify(testRest) || !Array.isArray(prod) || !Array.isArray(test)) {
    throw new Error('deno.json: "k3-test" must be "k3" with more environment variables');
  }
  return test.filter((v) => !prod.includes(v));
})();
const K3_TEST_PERMISSIONS = permissionFlags("k3-test");

/** Runs `k3 <args>` (main.ts under the current Deno) as a subprocess, with exactly the
 * permissions `deno task k3` and the one-file builds grant (deno.json's set "k3"), so every
 * CLI test also proves that set is enough; a child whose `env` sets a test hook
 * (K3_FAULT_EXPERT_READ, K3_TEST_HEAD_CHUNK, K3_FAULT_WRITE_ENOSPC) gets the set "k3-test",
 * which adds only those variables. */
export function k3(
  args: string[],
  opts: { env?: Record<string, string>; stdin?: string; cwd?: string; seconds?: number } = {},
): Promise<Output> {
  const hooked = Object.keys(opts.env ?? {}).some((v) => TEST_HOOKS.includes(v));
  return runCmd(Deno.execPath(), [
    "run",
    ...(hooked ? K3_TEST_PERMISSIONS : K3_PERMISSIONS),
    `${ROOT}/main.ts`,
    ...args,
  ], opts);
}

/** The generated ids of `k3 run --json` (its last stdout line is the summary). */
export function jsonIds(stdout: string): number[] {
  const lines = stdout.trimEnd().split("\n");
  return JSON.parse(lines[lines.length - 1]).generated_ids;
}

/** Runs a Python oracle script; throws with its stderr if it fails. */
export async function python(script: string, args: string[]): Promise<string> {
  const out = await runCmd("python3", [`${ORACLE}/${script}`, ...args]);
  if (out.code !== 0) throw new Error(`${script} ${args.join(" ")} failed (${out.code}): ${out.stderr}`);
  return out.stdout;
}

/** Resolves once `done()` holds, checking every 20 ms; fails naming `what` after `seconds`.
 * For what nothing announces when it happens (a metric, a counter, another reader's stream). */
export async function until(what: string, done: () => boolean | Promise<boolean>, seconds = 30): Promise<void> {
  const give = Date.now() + seconds * 1000;
  while (!(await done())) {
    if (Date.now() > give) throw new Error(`never happened: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A fresh temporary directory, removed by the returned disposer. */
export async function tempDir(prefix = "k3-test-"): Promise<{ path: string; [Symbol.asyncDispose](): Promise<void> }> {
  const path = await Deno.makeTempDir({ prefix });
  return { path, [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }) };
}

/** Copies every file of `src` into `dst` (flat). */
export async function copyDir(src: string, dst: string): Promise<void> {
  for await (const e of Deno.readDir(src)) {
    if (e.isFile) await Deno.copyFile(`${src}/${e.name}`, `${dst}/${e.name}`);
  }
}

/** The reference output written by tests/oracle/reference.py. */
export interface Reference {
  prompt_ids: number[];
  generated_ids: number[];
  argmax: number[];
}

/** Reads a reference JSON file. */
export async function readReference(path: string): Promise<Reference> {
  return JSON.parse(await Deno.readTextFile(path));
}

/** The `k3 run` flags of a floor budget from {@link packedFloor}: the trunk and its budget. */
export function floorFlags(floor: { trunkDir: string; trunkGB: number; cacheGB: number }): string[] {
  return ["--trunk", floor.trunkDir, "--trunk-gb", String(floor.trunkGB), "--cache-gb", String(floor.cacheGB)];
}

/** Packs `model`'s trunk into `trunk` (hashed pieces of `pieceBytes`, default the format's) and
 * returns the floor budget (the ring holds the largest layer, the cache top-k + 1 experts) with
 * the packed layer sizes. */
export async function packedFloor(
  model: string,
  trunk: string,
  pieceBytes?: number,
): Promise<{ floor: { trunkDir: string; trunkGB: number; cacheGB: number }; layerSizes: number[] }> {
  const { packTrunk } = await import("../pack/pack.ts");
  const { readManifest } = await import("../engine/weights/manifest.ts");
  const { loadConfig } = await import("../engine/model/config.ts");
  const { expertBytesOf, expertSlotBytes } = await import("../engine/weights/plan_experts.ts");
  await packTrunk(model, trunk, { log: null, pieceBytes });
  const layerSizes = (await readManifest(trunk)).layer.map((r) => r.size);
  const cfg = await loadConfig(model);
  return {
    floor: {
      trunkDir: trunk,
      trunkGB: Math.max(...layerSizes) / 1e9,
      cacheGB: (cfg.moe.topK + 1) * expertSlotBytes(expertBytesOf(cfg)) / 1e9,
    },
    layerSizes,
  };
}

/** Max |a - b| over two logit arrays. */
export function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

/**
 * Checks the engine against a reference run on `dir` (reference.py's JSON and logits):
 * teacher-forced argmax at every position (GATE 1), greedy decode by full recompute and
 * incremental (GATE 2), at the given memory plan (default resident). Returns the max
 * logit difference.
 */
export async function checkAgainstReference(
  dir: string,
  refPath: string,
  logitsPath: string,
  chunk = 16,
  memory?: import("../engine/weights/plan_input.ts").MemoryOptions,
): Promise<number> {
  const { generate, teacherForce } = await import("../engine/generate/generate.ts");
  const { openModel } = await import("../engine/open.ts");
  const ref = await readReference(refPath);
  const refLogits = new Float32Array((await Deno.readFile(logitsPath)).buffer);
  const seq = [...ref.prompt_ids, ...ref.generated_ids.slice(0, -1)];
  const opened = await openModel(dir, { capacity: seq.length + 1, chunk, memory });
  try {
    const V = opened.cfg.vocabSize;
    assert.equal(refLogits.length, seq.length * V, "reference logits cover every position");
    // GATE 1: teacher forcing, argmax at every position.
    let maxDiff = 0;
    const am = await teacherForce(opened.model, seq, (pos, row) => {
      maxDiff = Math.max(maxDiff, maxAbsDiff(row, refLogits.subarray(pos * V, (pos + 1) * V)));
    });
    assert.deepEqual(am, ref.argmax, "teacher-forced argmax at every position");
    // GATE 2: greedy decode, both modes.
    for (const incremental of [false, true]) {
      const steps = await generate(opened.model, ref.prompt_ids, { gen: ref.generated_ids.length, incremental });
      assert.deepEqual(
        steps.map((s) => s.token),
        ref.generated_ids,
        `greedy (${incremental ? "incremental" : "full recompute"})`,
      );
    }
    return maxDiff;
  } finally {
    opened.close();
  }
}

const KDIR = new URL("../kernels/", import.meta.url).pathname;
const EXT = Deno.build.os === "darwin" ? "dylib" : "so";

/**
 * Every build of the kernel library present, by name, opened for `symbols`: scalar (always:
 * it is the reference path), avx2 and avx512 where this CPU runs them, and the native build.
 * The builds are made before the tests (`make -s -C kernels all variants`, the first step of
 * every test task), so an in-process test starts no `make`.
 */
export function libraryBuilds<S extends Deno.ForeignLibraryInterface>(symbols: S): [string, Deno.DynamicLibrary<S>][] {
  const found: [string, Deno.DynamicLibrary<S>][] = [];
  for (const v of ["scalar", "avx2", "avx512", "native"]) {
    const p = v === "native" ? `${KDIR}build/libk3.${EXT}` : `${KDIR}build/libk3-${v}.${EXT}`;
    try {
      Deno.statSync(p);
    } catch {
      // The test tasks build first; a test file run alone needs the build made by hand.
      if (v === "scalar" || v === "native") throw new Error(`${p} is missing: run make -s -C kernels all variants`);
      continue;
    }
    found.push([v, Deno.dlopen(p, symbols)]);
  }
  return found;
}

const hex = (b: bigint) => b.toString(16).padStart(16, "0");

/** k3w64 of `bytes` in one call of a build's `k3io_hash`, as 16 hex digits. */
export function k3w64Hex(
  lib: { symbols: { k3io_hash(p: Deno.PointerValue, n: bigint): bigint } },
  bytes: Uint8Array,
): string {
  return hex(lib.symbols.k3io_hash(bytes.length ? Deno.UnsafePointer.of(bytes) : null, BigInt(bytes.length)));
}

/** The matrix check of rows [r0, r1) of `bytes` (all rows from row 0) by a build's
 * `k3_matrix_check`, as 16 hex digits. */
export function matrixCheckHex(
  lib: {
    symbols: {
      k3_matrix_check(w: Deno.PointerValue, rowbytes: number, r0: number, r1: number, out: Deno.PointerValue): void;
    };
  },
  bytes: Uint8Array,
  rowbytes: number,
  r0: number,
  r1: number,
): string {
  const sum = new BigUint64Array(1);
  lib.symbols.k3_matrix_check(
    Deno.UnsafePointer.of(bytes.subarray(r0 * rowbytes)),
    rowbytes,
    r0,
    r1,
    Deno.UnsafePointer.of(sum),
  );
  return hex(sum[0]);
}

/** Deterministic pseudo-random bytes (xorshift32). */
export function noise(n: number, seed: number): Uint8Array {
  const out = new Uint8Array(n);
  let x = seed | 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = x & 255;
  }
  return out;
}

/** A running `k3 <args>` subprocess (deno.json's set "k3", as {@link k3}) whose stderr is
 * collected as it arrives, so a test can wait for a line instead of sleeping or polling. */
export class K3Process {
  /** Everything written to stderr so far. */
  stderr = "";
  readonly child: Deno.ChildProcess;
  #waiters: { holds: (stderr: string) => boolean; resolve: () => void }[] = [];
  readonly #reading: Promise<void>;

  constructor(args: string[]) {
    this.child = new Deno.Command(Deno.execPath(), {
      args: ["run", ...K3_PERMISSIONS, `${ROOT}/main.ts`, ...args],
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const stderr = this.child.stderr;
    this.#reading = (async () => {
      const dec = new TextDecoder();
      for await (const chunk of stderr) {
        this.stderr += dec.decode(chunk, { stream: true });
        this.#waiters = this.#waiters.filter((w) => !(w.holds(this.stderr) && (w.resolve(), true)));
      }
    })();
  }

  /** Resolves once `holds(stderr)` is true (rejects if the process ends first). */
  async until(what: string, holds: (stderr: string) => boolean): Promise<void> {
    if (holds(this.stderr)) return;
    await Promise.race([
      new Promise<void>((resolve) => this.#waiters.push({ holds, resolve })),
      this.exit().then((s) => {
        if (!holds(this.stderr)) throw new Error(`k3 exited (${s.code}) before ${what}: ${this.stderr}`);
      }),
    ]);
  }

  /** Resolves with the match once stderr matches `re` (rejects if the process ends first). */
  async waitFor(re: RegExp): Promise<RegExpExecArray> {
    await this.until(String(re), (stderr) => re.test(stderr));
    return re.exec(this.stderr)!;
  }

  /** Exit status, after stderr has been read to the end. */
  async exit(): Promise<Deno.CommandStatus> {
    const s = await this.child.status;
    await this.#reading;
    return s;
  }
}

/** A `k3 serve` subprocess on the tiny model, ready: its base URL, and how to stop it. */
export interface ServeProcess {
  /** http://127.0.0.1:PORT */
  url: string;
  /** The server process (its pid for ps). */
  child: Deno.ChildProcess;
  /** SIGTERM, then its exit status once stderr is read to the end. */
  stop(): Promise<Deno.CommandStatus>;
}

/**
 * Starts `k3 serve TINY --port 0 ...args` with k3's own permissions (`denoFlags` before
 * them, e.g. V8 flags), and resolves once it prints its ready line.
 */
export async function serveTiny(
  args: string[],
  opts: { env?: Record<string, string>; denoFlags?: string[] } = {},
): Promise<ServeProcess> {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      ...(opts.denoFlags ?? []),
      ...K3_PERMISSIONS,
      `${ROOT}/main.ts`,
      "serve",
      TINY,
      "--port",
      "0",
      ...args,
    ],
    env: opts.env,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let err = "";
  const ready = /k3: ready: (http:\/\/127\.0\.0\.1:\d+)\/v1/;
  while (!ready.test(err)) {
    const r = await reader.read();
    if (r.done) throw new Error(`k3 serve exited before it was ready: ${err}`);
    err += r.value;
  }
  const draining = (async () => {
    while (!(await reader.read()).done);
  })();
  return {
    url: ready.exec(err)![1],
    child,
    stop: async () => {
      child.kill("SIGTERM");
      const status = await child.status;
      await draining;
      return status;
    },
  };
}

/** One call of a forced tools channel, as {@link forcedCalls} reads it. */
export interface ForcedCall {
  /** The tool's name (attribute unescaped). */
  name: string;
  /** The call's `index` attribute. */
  index: number;
  /** The arguments: each element's value, a string raw and any other type parsed as JSON. */
  args: Record<string, unknown>;
  /** Each element's `type` attribute, by key. */
  types: Record<string, string>;
}

/**
 * The calls of a reply's tools channel in the released encoder's trained form
 * (`<|open|>call tool="N" index="I"<|sep|>` then `<|open|>argument key="K" type="T"<|sep|>`
 * elements then `<|close|>call<|sep|>`); throws when the channel holds anything else.
 */
export function forcedCalls(text: string): ForcedCall[] {
  const unescape = (s: string) => s.replaceAll("&quot;", '"').replaceAll("&amp;", "&");
  const start = text.indexOf("<|open|>tools<|sep|>");
  if (start < 0) throw new Error(`no tools channel in ${text}`);
  let rest = text.slice(start + "<|open|>tools<|sep|>".length);
  const calls: ForcedCall[] = [];
  const call = /^<\|open\|>call tool="([^"]*)" index="(\d+)"<\|sep\|>/;
  const arg = /^<\|open\|>argument key="([^"]*)" type="([a-z]+)"<\|sep\|>([\s\S]*?)<\|close\|>argument<\|sep\|>/;
  for (let m = call.exec(rest); m !== null; m = call.exec(rest)) {
    rest = rest.slice(m[0].length);
    const c: ForcedCall = { name: unescape(m[1]), index: Number(m[2]), args: {}, types: {} };
    for (let a = arg.exec(rest); a !== null; a = arg.exec(rest)) {
      rest = rest.slice(a[0].length);
      const key = unescape(a[1]);
      c.types[key] = a[2];
      c.args[key] = a[2] === "string" ? a[3] : JSON.parse(a[3]);
    }
    if (!rest.startsWith("<|close|>call<|sep|>")) throw new Error(`a call does not close: ${rest}`);
    rest = rest.slice("<|close|>call<|sep|>".length);
    calls.push(c);
  }
  if (!/^<\|close\|>tools<\|sep\|><\|close\|>message<\|sep\|>(<\|end_of_msg\|>|\[EOS\])$/.test(rest)) {
    throw new Error(`the tools channel does not end as it must: ${rest}`);
  }
  return calls;
}

/** Where Debian's chromium package puts the browser the chat page's tests drive
 * (tests/browser/web_page.ts). */
export const CHROMIUM = "/usr/bin/chromium";
