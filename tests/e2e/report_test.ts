/**
 * The one report schema (cli/report.ts) as users get it: `run --out`, the `run --json`
 * summary, `batch` result lines and `presets --json` are snake_case throughout and share
 * the head, settings and per-sequence fields; batch resume refuses changed settings;
 * prefill progress and the prompt eval / eval summary.
 */

import assert from "node:assert/strict";
import { VERSION } from "../../cli/version.ts";
import { layerProgress, prefillLayerLine, prefillLine, prefillProgress } from "../../cli/progress.ts";
import { settingsDiff, snakeKeys, snakeName } from "../../cli/report.ts";
import { k3, tempDir, TINY } from "../helpers.ts";

/** Every object key in `v`, with its path. */
function keys(v: unknown, path = ""): string[] {
  if (Array.isArray(v)) return v.flatMap((x, i) => keys(x, `${path}[${i}]`));
  if (v === null || typeof v !== "object") return [];
  return Object.entries(v).flatMap(([k, x]) => [`${path}.${k}`, ...keys(x, `${path}.${k}`)]);
}

function assertSnake(v: unknown, what: string): void {
  const bad = keys(v).filter((p) => !/^[a-z][a-z0-9_]*$/.test(p.slice(p.lastIndexOf(".") + 1)));
  assert.deepEqual(bad, [], `${what}: keys not in snake_case`);
}

function assertSequence(r: Record<string, any>, kind: string, promptTokens: number, what: string): void {
  assert.equal(r.schema_version, 1, what);
  assert.equal(r.k3_version, VERSION, what);
  assert.equal(r.kind, kind, what);
  assert.ok(["stop", "length", "interrupted"].includes(r.finish_reason), what);
  assert.equal(r.usage.prompt_tokens, promptTokens, what);
  assert.equal(r.usage.completion_tokens, r.generated_ids.length, what);
  assert.equal(r.usage.total_tokens, promptTokens + r.generated_ids.length, what);
  assert.ok(r.prefill_seconds > 0, `${what}: prefill_seconds`);
  assert.ok(r.decode_seconds_per_token > 0, `${what}: decode_seconds_per_token`);
  for (const k of ["gen", "sampling", "budget", "chunk", "parallel", "model_dir", "layers", "stop_ids"]) {
    assert.ok(k in r.settings, `${what}: settings.${k}`);
  }
  assertSnake(r, what);
}

Deno.test("snakeName and snakeKeys: camelCase keys become snake_case, NaN becomes null", () => {
  assert.equal(snakeName("trunkGB"), "trunk_gb");
  assert.equal(snakeName("kvPerPosition"), "kv_per_position");
  assert.equal(snakeName("ring_depth"), "ring_depth");
  assert.deepEqual(snakeKeys({ aB: [{ cD: NaN }], e: 1 }), { a_b: [{ c_d: null }], e: 1 });
});

Deno.test("run --out and the run --json summary: the report schema; a resident run pins every layer", async () => {
  await using dir = await tempDir();
  const out = `${dir.path}/r.json`;
  const res = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "4", "--out", out, "--json"]);
  assert.equal(res.code, 0, res.stderr);
  const r = JSON.parse(await Deno.readTextFile(out));
  assertSequence(r, "run", 3, "run --out");
  assert.equal(r.settings.gen, 4);
  assert.equal(r.settings.parallel, 1);
  assert.equal(r.settings.sampling.temperature, 0);
  assert.equal(r.trunk_layers_pinned, 13, "resident: all 13 layers in RAM");
  const last = JSON.parse(res.stdout.trim().split("\n").at(-1)!);
  assertSequence(last, "run_json_summary", 3, "run --json summary");
  assert.deepEqual(last.generated_ids, r.generated_ids);
  // The summary on stderr: prompt eval and eval apart, in the report's numbers.
  assert.match(
    res.stderr,
    /^k3: prompt eval 3 tokens in [\d.]+ s \([\d.]+ tokens\/s\); eval 3 tokens in [\d.]+ s \([\d.]+ s\/token\)/m,
  );
});

Deno.test("presets --json: the schema head, snake_case throughout, what each preset needs", async () => {
  const res = await k3(["presets", "--json"]);
  assert.equal(res.code, 0, res.stderr);
  const p = JSON.parse(res.stdout);
  assert.equal(p.schema_version, 1);
  assert.equal(p.kind, "presets");
  assertSnake(p, "presets --json");
  const laptop = p.presets.find((x: { name: string }) => x.name === "laptop");
  assert.ok(laptop.needs_bytes > laptop.plan.total_bytes, "needs = plan + runtime");
});

Deno.test("batch: result lines in the schema; a resume with other token-deciding settings is refused unless --force-resume", async () => {
  await using dir = await tempDir();
  const input = `${dir.path}/in.jsonl`, output = `${dir.path}/out.jsonl`;
  await Deno.writeTextFile(input, '{"id": "a", "ids": [1, 2, 3]}\n{"id": "b", "ids": [4, 5]}\n');
  const first = await k3(["batch", TINY, "--input", input, "--output", output, "--gen", "3"]);
  assert.equal(first.code, 0, first.stderr);
  assert.match(first.stderr, /2 prompts in /);
  const lines = (await Deno.readTextFile(output)).trim().split("\n").map((l) => JSON.parse(l));
  assert.equal(lines.length, 2);
  for (const l of lines) assertSequence(l, "batch_result", l.id === "a" ? 3 : 2, `batch line ${l.id}`);
  assert.equal(lines[0].settings.gen, 3);

  // Another --gen: refused, nothing appended.
  await Deno.writeTextFile(input, '{"id": "c", "ids": [7]}\n', { append: true });
  const other = await k3(["batch", TINY, "--input", input, "--output", output, "--gen", "5"]);
  assert.equal(other.code, 2, other.stderr);
  assert.match(other.stderr, /holds results made with other settings \(gen 3 there, 5 now\); .*--force-resume/);
  assert.equal((await Deno.readTextFile(output)).trim().split("\n").length, 2);
  // A budget never changes a token: a resume at another budget is fine.
  const budget = await k3(["batch", TINY, "--input", input, "--output", output, "--gen", "3", "--cache-gb", "0.001"]);
  assert.equal(budget.code, 0, budget.stderr);
  assert.match(budget.stderr, /3 prompts in .*, 2 already in .*; 1 to run/);
  // --force-resume adds under the new settings, saying so.
  await Deno.writeTextFile(input, '{"id": "d", "ids": [8]}\n', { append: true });
  const forced = await k3(["batch", TINY, "--input", input, "--output", output, "--gen", "5", "--force-resume"]);
  assert.equal(forced.code, 0, forced.stderr);
  assert.match(forced.stderr, /--force-resume: adding to .* despite gen 3 there, 5 now/);
  const all = (await Deno.readTextFile(output)).trim().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(all.map((l) => l.id), ["a", "b", "c", "d"]);
  assert.equal(all[3].settings.gen, 5);
});

Deno.test("settingsDiff: model, layers, gen, stops and sampling count; budget, chunk, threads, parallel do not", () => {
  const base = {
    model_dir: "m",
    model_path: "/m",
    layers: 13,
    gen: 8,
    stop_ids: [],
    stop: [],
    sampling: { temperature: 0, top_p: 1, top_k: 0, min_p: 0, seed: 0 },
    incremental: true,
    budget: { trunk_dir: null, trunk_gb: null, cache_gb: null, preset: null },
    chunk: 16,
    threads: 2,
    parallel: 1,
  };
  const free = {
    ...base,
    budget: { ...base.budget, cache_gb: 1 },
    chunk: 4,
    threads: 1,
    parallel: 4,
    incremental: false,
  };
  assert.deepEqual(settingsDiff(base, free), []);
  assert.equal(settingsDiff(base, { ...base, model_path: "/other" }).length, 1);
  assert.equal(settingsDiff(base, { ...base, sampling: { ...base.sampling, seed: 1 } }).length, 1);
  assert.equal(settingsDiff(base, { ...base, stop_ids: [3] }).length, 1);
});

Deno.test("prefill progress: tokens, chunks, tokens/s, ETA; a line every 5 s off a terminal, self-overwriting on one", () => {
  assert.equal(prefillLine(64, 9802, 16, 2), "prefill: 64/9802 tokens (chunk 4/613), 32 tokens/s, ETA 5 min 04 s");
  assert.equal(prefillLine(9802, 9802, 16, 20), "prefill: 9802/9802 tokens (chunk 613/613), 490 tokens/s, in 20 s");
  let t = 0;
  const log: string[] = [];
  const report = prefillProgress(16, { terminal: false, write: (s) => log.push(s), now: () => t });
  for (let done = 16; done <= 160; done += 16) {
    t += 1000; // one chunk a second
    report(done, 160);
  }
  assert.deepEqual(log, [
    "k3: prefill: 80/160 tokens (chunk 5/10), 16 tokens/s, ETA 5.0 s\n",
    "k3: prefill: 160/160 tokens (chunk 10/10), 16 tokens/s, in 10 s\n",
  ]);
  const quick: string[] = [];
  const short = prefillProgress(16, { terminal: false, write: (s) => quick.push(s), now: () => 0 });
  short(16, 32);
  short(32, 32);
  assert.deepEqual(quick, [], "a short prefill prints nothing into a log");
  const tty: string[] = [];
  t = 0;
  const term = prefillProgress(16, { terminal: true, write: (s) => tty.push(s), now: () => t });
  t = 200;
  term(16, 32);
  t = 400;
  term(32, 32);
  assert.equal(tty.length, 2);
  assert.ok(tty[0].startsWith("\r\x1b[Kprefill: 16/32 tokens (chunk 1/2)"), tty[0]);
  assert.match(tty[1], /in 0\.4 s\n$/);
});

Deno.test("prefill progress by layer: layer L of N, segment, tokens, bytes read, ETA; short passes say nothing", () => {
  const line = { layer: 36, layers: 93, segment: 1, segments: 2, tokens: 4096, total: 8192, bytesRead: 41.2e9 };
  // 37 layers in 74 s: 2 s a layer, 56 layers left here and 93 in the next segment: 298 s.
  assert.equal(
    prefillLayerLine({ ...line, segmentSeconds: 74 }),
    "prefill: layer 37/93 of segment 1/2 (4096/8192 tokens), 41.20 GB read, ETA 4 min 58 s",
  );
  assert.match(
    prefillLayerLine({ ...line, layer: 92, segment: 2, segmentSeconds: 10 }),
    /layer 93\/93 of segment 2\/2 .*, in 10 s$/,
  );
  let t = 0, bytes = 1000;
  const log: string[] = [];
  const report = layerProgress(600, 600, () => bytes, { terminal: false, write: (s) => log.push(s), now: () => t });
  report({ layer: 0, layers: 13, rows: 16, seconds: 1 });
  for (let layer = 0; layer < 13; layer++) {
    t += 1000; // a layer a second
    bytes += 1e6;
    report({ layer, layers: 13, rows: 600, seconds: layer + 1 });
  }
  assert.deepEqual(log, [
    "k3: prefill: layer 5/13 of segment 1/1 (600/600 tokens), 5.0 MB read, ETA 8.0 s\n",
    "k3: prefill: layer 10/13 of segment 1/1 (600/600 tokens), 10.0 MB read, ETA 3.0 s\n",
    "k3: prefill: layer 13/13 of segment 1/1 (600/600 tokens), 13.0 MB read, in 13 s\n",
  ]);
});
