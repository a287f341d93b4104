/**
 * `k3 batch` lines that share a 200-token prefix prefill it once: the first line keeps
 * its state there, every other line starts from it (`cached_tokens` 200 in its result
 * line, the run's report counting them), and every line's tokens equal a run with the
 * state cache off.
 */

import assert from "node:assert/strict";
import { ids, k3, tempDir, TINY } from "../helpers.ts";

Deno.test("batch lines sharing a 200-token prefix prefill it once, with the cache-off tokens", async () => {
  await using dir = await tempDir();
  const head = ids(200, 1);
  const lines = Array.from({ length: 8 }, (_, i) => ({ id: `l${i}`, ids: [...head, ...ids(3 + i, 10 + i)] }));
  // One line with nothing in common: never waits, never hits.
  lines.push({ id: "alone", ids: ids(40, 99) });
  const input = `${dir.path}/in.jsonl`;
  Deno.writeTextFileSync(input, lines.map((l) => JSON.stringify(l)).join("\n") + "\n");
  const results = async (name: string, extra: string[]) => {
    const out = `${dir.path}/${name}.jsonl`, report = `${dir.path}/${name}.report.json`;
    const r = await k3([
      "batch",
      TINY,
      "--input",
      input,
      "--output",
      out,
      "--gen",
      "4",
      "--parallel",
      "4",
      "--report",
      report,
      ...extra,
    ]);
    assert.equal(r.code, 0, r.stderr);
    const rows = Deno.readTextFileSync(out).trim().split("\n").map((l) => JSON.parse(l));
    return {
      byId: new Map(rows.map((x) => [x.id, x])),
      report: JSON.parse(Deno.readTextFileSync(report)),
      stderr: r.stderr,
    };
  };
  const on = await results("on", []);
  const off = await results("off", ["--state-cache-gb", "0"]);
  for (const l of lines) {
    assert.deepEqual(on.byId.get(l.id).generated_ids, off.byId.get(l.id).generated_ids, l.id);
    assert.equal(off.byId.get(l.id).cached_tokens, 0);
  }
  const cached = lines.map((l) => on.byId.get(l.id).cached_tokens);
  // One line of the eight prefilled the prefix; the other seven started from its state.
  assert.deepEqual(cached.slice(0, 8).sort((a, b) => a - b), [0, 200, 200, 200, 200, 200, 200, 200]);
  assert.equal(on.byId.get("alone").cached_tokens, 0);
  assert.equal(on.report.cached_tokens, 7 * 200);
  assert.equal(off.report.cached_tokens, 0);
  assert.match(on.stderr, /1400 prompt tokens from kept states, not prefilled/);
  assert.ok(on.report.ledger.state_cache_seconds > 0);
  assert.equal(on.report.ledger.cached_tokens, 7 * 200);
});
