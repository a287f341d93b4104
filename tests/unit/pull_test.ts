/**
 * `k3 pull`'s pieces without a server: which files --text-only keeps, the trunk estimate,
 * Retry-After, the repository id check, and the progress block (bytes, rate and ETA in all
 * and per file, redrawn in place on a terminal).
 */

import assert from "node:assert/strict";
import { selectFiles, trunkEstimate } from "../../cli/pull/main.ts";
import { checkRepo, type HubFile, retryAfterSeconds } from "../../cli/pull/hub.ts";
import { PullProgress } from "../../cli/pull/progress.ts";
import { CHECKPOINT_BYTES, TRUNK_BYTES } from "../../cli/doctor/facts.ts";
import { transferLine } from "../../cli/progress.ts";

const file = (path: string, size = 10): HubFile => ({ path, size });

Deno.test("pull: --text-only drops the vision processor files and the shards holding only vision tensors", () => {
  const files = [
    file("config.json"),
    file("preprocessor_config.json"),
    file("image_processing_kimi_k3.py"),
    file("model-00001-of-00003.safetensors"),
    file("model-00002-of-00003.safetensors"),
    file("model-00003-of-00003.safetensors"),
  ];
  const map = {
    "language_model.model.embed_tokens.weight": "model-00001-of-00003.safetensors",
    "vision_tower.blocks.0.weight": "model-00002-of-00003.safetensors",
    "mm_projector.proj.weight": "model-00002-of-00003.safetensors",
    "vision_tower.blocks.1.weight": "model-00003-of-00003.safetensors",
    "language_model.lm_head.weight": "model-00003-of-00003.safetensors",
  };
  assert.deepEqual(selectFiles(files, false, map), files);
  assert.deepEqual(selectFiles(files, true, map).map((f) => f.path), [
    "config.json",
    "model-00001-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
  ]);
});

Deno.test("pull: the trunk estimate is the released trunk for the released shards, else the shards' size", () => {
  assert.equal(trunkEstimate([file("a.safetensors", CHECKPOINT_BYTES), file("config.json", 5)]), TRUNK_BYTES);
  assert.equal(trunkEstimate([file("a.safetensors", 300), file("b.safetensors", 200), file("x.json", 5)]), 500);
});

Deno.test("pull: Retry-After in seconds or as an HTTP date; repository ids", () => {
  assert.equal(retryAfterSeconds("7"), 7);
  assert.equal(retryAfterSeconds(null), undefined);
  assert.equal(retryAfterSeconds("soon"), undefined);
  const now = Date.parse("2026-12-06T08:00:00Z");
  assert.equal(retryAfterSeconds("Sun, 06 Dec 2026 08:00:30 GMT", now), 30);
  checkRepo("moonshotai/Kimi-K3");
  for (const bad of ["Kimi-K3", "a/b/c", "../x", "a/..", "https://x/y"]) {
    assert.throws(() => checkRepo(bad), /is not a repository id; expected OWNER\/NAME/, bad);
  }
});

Deno.test("pull: progress shows bytes, rate and ETA in all and per file, redrawn in place on a terminal", () => {
  assert.equal(transferLine("pull", 250e6, 1e9, 50e6), "pull: 250.0 MB / 1.0 GB (25%), 50.0 MB/s, ETA 15 s");
  let out = "";
  const p = new PullProgress(true, (t) => void (out += t));
  p.setTotal(2e9);
  p.begin("model-00001-of-00002.safetensors", 1e9);
  p.begin("model-00002-of-00002.safetensors", 1e9);
  p.bytes("model-00001-of-00002.safetensors", 1e8, true);
  // The first draw: the total and one line per file in flight.
  assert.match(out, /^pull: 100\.0 MB \/ 2\.0 GB \(5\.0%\)/);
  assert.match(out, /\n {2}model-00001-of-00002\.safetensors: 100\.0 MB \/ 1\.0 GB \(10%\)/);
  assert.match(out, /\n {2}model-00002-of-00002\.safetensors: 0 B \/ 1\.0 GB \(0\.0%\)/);
  out = "";
  p.note("pull: a note");
  // A note goes above the block: the block is cleared (cursor up over its 3 lines), then redrawn.
  // deno-lint-ignore no-control-regex
  assert.match(out, /^\x1b\[2A\r\x1b\[Jpull: 100\.0 MB \/ 2\.0 GB/, JSON.stringify(out));
  out = "";
  p.finish();
  assert.equal(out, "\x1b[2A\r\x1b[J");
});

Deno.test("pull: with --pack the progress block shows the trunk packed under the download", () => {
  let out = "";
  const p = new PullProgress(true, (t) => void (out += t));
  p.setTotal(2e9);
  p.packTotal = 1e9;
  p.begin("model-00001-of-00002.safetensors", 1e9);
  p.bytes("model-00001-of-00002.safetensors", 1e9, true);
  out = "";
  p.packed(250e6);
  p.note("pack: 3 trunk regions packed once model-00001-of-00002.safetensors landed; 2 to go");
  // The redrawn block: the download in all, the pack, then each file in flight.
  // deno-lint-ignore no-control-regex
  const block = /\x1b\[Jpull: 1\.0 GB \/ 2\.0 GB \(50%\), [^\n]*\npack: 250\.0 MB \/ 1\.0 GB \(25%\)\n {2}model-00001/;
  assert.match(out, block);
});
