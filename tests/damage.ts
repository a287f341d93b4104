/**
 * Helpers for bad-input tests: damaged copies of the tiny model, edited shard headers, and
 * the refusal assertion (exit code, one `k3:` line, no stack trace, no ids), and the checks
 * `k3 run` and `k3 pack --verify` make, called in-process.
 *
 * @module
 */

import assert from "node:assert/strict";
import { K3Error } from "../engine/errors.ts";
import { generate } from "../engine/generate/generate.ts";
import type { MemoryOptions } from "../engine/weights/plan_input.ts";
import { openModel } from "../engine/open.ts";
import { verifyExperts } from "../pack/experts.ts";
import { verifyTrunk } from "../pack/verify.ts";
import { copyDir, k3, type Output, tempDir, TINY } from "./helpers.ts";

/** A safetensors JSON header. */
export type Header = Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;

/** Shard files of a model dir, sorted. */
export async function shards(dir: string): Promise<string[]> {
  const out: string[] = [];
  for await (const e of Deno.readDir(dir)) if (e.name.endsWith(".safetensors")) out.push(`${dir}/${e.name}`);
  return out.sort();
}

/** Rewrites a shard's JSON header with `edit`, keeping the data bytes. */
export async function editHeader(file: string, edit: (h: Header) => void): Promise<void> {
  const bytes = await Deno.readFile(file);
  const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  edit(header);
  const json = new TextEncoder().encode(JSON.stringify(header));
  const out = new Uint8Array(8 + json.length + bytes.length - 8 - n);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  out.set(bytes.subarray(8 + n), 8 + json.length);
  await Deno.writeFile(file, out);
}

/** A shard holding `name`, and its header. */
export async function shardWith(dir: string, pattern: RegExp): Promise<{ file: string; name: string }> {
  for (const file of await shards(dir)) {
    const bytes = await Deno.readFile(file);
    const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
    const name = Object.keys(header).find((k) => pattern.test(k));
    if (name) return { file, name };
  }
  throw new Error(`no tensor matches ${pattern}`);
}

/** Runs `k3 run` on a damaged copy of the tiny model. */
export async function runDamaged(damage: (dir: string) => Promise<void>, extra: string[] = []): Promise<Output> {
  await using dir = await tempDir();
  await copyDir(TINY, dir.path);
  await damage(dir.path);
  return await k3(["run", dir.path, "--ids", "1,2,3", "--gen", "2", ...extra]);
}

/** The process failed with `code` and one line on stderr matching `pattern`, no output ids. */
export function assertRefused(out: Output, code: number, pattern: RegExp): void {
  const lines = out.stderr.trim().split("\n");
  assert.equal(out.code, code, `exit code (stderr: ${out.stderr})`);
  assert.equal(lines.length, 1, `one line on stderr, got: ${out.stderr}`);
  assert.match(lines[0], /^k3: /);
  assert.match(lines[0], pattern);
  assert.doesNotMatch(out.stderr, /\s+at .*:\d+:\d+/, "no stack trace");
  assert.equal(out.stdout.trim(), "", "no generated ids");
}

/** A refusal after the run printed its plan: the exit code, no ids on stdout, the last stderr
 * line the one `k3:` error matching `why`, and no internal error or stack trace. */
export function assertRefusedLast(out: Output, code: number, why: RegExp): void {
  assert.equal(out.code, code, out.stderr);
  assert.equal(out.stdout.trim(), "", "no ids are printed");
  assert.doesNotMatch(out.stderr, /internal error|panicked|Stack backtrace|^\s+at /m);
  const last = out.stderr.trim().split("\n").at(-1)!;
  assert.match(last, /^k3: /);
  assert.match(last, why);
}

/** What `k3 pack --verify <trunk> [model]` checks, in-process: the trunk, then its expert table. */
export async function verifyPacked(trunk: string, model?: string): Promise<void> {
  await verifyTrunk(trunk, { modelDir: model, log: () => {} });
  await verifyExperts(trunk, model, () => {});
}

/** What `k3 run <model> --ids <ids> --gen <gen>` (greedy, incremental) generates with these
 * memory options (`--trunk`, `--trunk-gb`, `--cache-gb`), in-process. */
export async function runIds(model: string, ids: number[], gen: number, memory?: MemoryOptions): Promise<number[]> {
  const opened = await openModel(model, { capacity: ids.length + gen, memory });
  try {
    return (await generate(opened.model, ids, { gen, incremental: true })).map((s) => s.token);
  } finally {
    await opened.close();
  }
}

/** The in-process side of {@link assertRefusedLast}: `work` fails with what `k3` reports as a
 * `k3:` line and exit `code` (a K3Error of that exit code, not an internal error), its last
 * line matching `why`. */
export async function assertRejectsLast(work: Promise<unknown>, code: number, why: RegExp): Promise<void> {
  await assert.rejects(work, (e: unknown) => {
    assert.ok(e instanceof K3Error, `a K3Error, not an internal error: ${(e as Error)?.stack ?? e}`);
    assert.equal(e.exitCode, code, e.message);
    assert.match(e.message.split("\n").at(-1)!, why);
    return true;
  });
}
