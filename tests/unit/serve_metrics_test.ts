/**
 * The metrics of `k3 serve` (cli/server/metrics.ts) in-process: requests counted by a fixed
 * endpoint label and status, a client gone counted as a disconnect, generation timing
 * summed, and the Prometheus text naming each series once with its HELP and TYPE.
 */

import assert from "node:assert/strict";
import { CLIENT_GONE, endpointLabel, Metrics } from "../../cli/server/metrics.ts";
import type { ServeEngine } from "../../cli/server/tasks.ts";

Deno.test("serve metrics: labels, counts and the Prometheus text", () => {
  assert.equal(endpointLabel("/v1/completions"), "/v1/completions");
  assert.equal(endpointLabel("/v1/models/k3"), "/v1/models/{id}");
  assert.equal(endpointLabel("/../etc/passwd"), "other");
  const m = new Metrics();
  m.count("/v1/completions", 200);
  m.count("/v1/completions", 200);
  m.count("/nowhere", 404);
  m.count("/v1/chat/completions", CLIENT_GONE);
  m.internalError();
  m.generated(10, 5, 0.5, 2);
  m.generated(3, 0, 9, 9); // no token: no time to first token, no decode time
  const text = m.text(undefined, 1, 2);
  const value = (series: string) => {
    const line = text.split("\n").find((l) => l.startsWith(`${series} `));
    assert.ok(line, `${series} in\n${text}`);
    return Number(line.slice(series.length + 1));
  };
  assert.equal(value('k3_requests_total{endpoint="/v1/completions",status="200"}'), 2);
  assert.equal(value('k3_requests_total{endpoint="other",status="404"}'), 1);
  assert.equal(value("k3_client_disconnects_total"), 1);
  assert.equal(value("k3_internal_errors_total"), 1);
  assert.equal(value("k3_prompt_tokens_total"), 13);
  assert.equal(value("k3_completion_tokens_total"), 5);
  assert.equal(value("k3_time_to_first_token_seconds_total"), 0.5);
  assert.equal(value("k3_time_to_first_token_count"), 1);
  assert.equal(value("k3_decode_seconds_total"), 2);
  assert.equal(value("k3_decode_tokens_total"), 4);
  assert.equal(value("k3_requests_in_flight"), 1);
  assert.equal(value("k3_connections"), 2);
  assert.ok(!text.includes("k3_state_cache_"), "no state cache series without a state cache");
  for (const name of ["k3_requests_total", "k3_decode_seconds_total", "k3_connections"]) {
    assert.equal(text.split("\n").filter((l) => l.startsWith(`# TYPE ${name} `)).length, 1, name);
  }
  assert.ok(text.endsWith("\n"));
});

Deno.test("serve metrics: the engine's passes, prefill apart from decode, from its ledger", () => {
  const ledger = { prefillPassSeconds: 1.5, prefillPassRows: 600, decodePassSeconds: 0.25, decodePassRows: 9 };
  const engine = {
    scheduler: { submit: () => Promise.reject(new Error("unused")), queued: 0, active: 1 },
    capacity: 4096,
    vocabSize: 1024,
    bytesRead: () => 0,
    ledger: () => ledger,
  } as unknown as ServeEngine;
  const text = new Metrics().text(engine, 0, 0);
  const lines = text.split("\n");
  assert.ok(lines.includes('k3_pass_seconds_total{kind="prefill"} 1.5'), text);
  assert.ok(lines.includes('k3_pass_seconds_total{kind="decode"} 0.25'), text);
  assert.ok(lines.includes('k3_pass_rows_total{kind="prefill"} 600'), text);
  assert.ok(lines.includes('k3_pass_rows_total{kind="decode"} 9'), text);
  for (const name of ["k3_pass_seconds_total", "k3_pass_rows_total"]) {
    assert.equal(lines.filter((l) => l === `# TYPE ${name} counter`).length, 1, name);
  }
  // Read at each scrape: the counters follow the ledger.
  ledger.decodePassRows = 10;
  assert.ok(new Metrics().text(engine, 0, 0).split("\n").includes('k3_pass_rows_total{kind="decode"} 10'));
  assert.ok(!new Metrics().text(undefined, 0, 0).includes("k3_pass_"), "no pass series before the model is loaded");
});
