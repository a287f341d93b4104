/**
 * `k3 serve` soaked by careless and hostile clients: one server process (`--parallel 4`,
 * loopback only) on the tiny model for a bounded time and a bounded number of requests,
 * with a mix of clients at once:
 *
 * - well-behaved: streamed and whole chat answers (their time to first token measured
 *   at the client: request sent to the first chunk carrying text);
 * - aborting: a stream dropped after its first text, a whole answer whose client closes
 *   its socket while it generates (the body sent 50 ms after the head, the shape that
 *   once hid the close);
 * - slow: a body trickled one byte at a time (cut off at the body timeout);
 * - malformed: bad JSON, odd 8 kB paths without a key, heads that are not HTTP;
 * - non-reading: a stream asked for and never read, and /health requests pipelined
 *   without reading a byte (the server closes them at its send timeout, 2 s here);
 * - slow-reading: a stream and a whole answer read a few bytes at a time.
 *
 * Before the load, every second during it and after it (once the clients have stopped
 * and the server is idle) it samples the server's RSS, open connections and slots in
 * use (and answers per second during); it counts the slots still held at the end
 * (`slots_leaked`, which must be 0) and the connections left open besides its own.
 *
 *   deno run -P=bench bench/soak.ts [--seconds N (default 30, at most 1800)]
 *     [--requests N (default 20000)] [--clients N (default 12)] [--heap-mb N] [--json]
 *
 * --heap-mb caps the server's V8 old space: without it V8 grows its heap lazily, so RSS
 * growth mixes garbage not yet collected with memory held; under a cap only what is held
 * can grow.
 *
 * Prints the samples as a table; with --json one object as the last line:
 * rss_growth_bytes (last sample minus the first after a tenth of the run, when V8 has
 * grown its heap), slots_leaked, p99_ttft_seconds, answers, aborted, cut_off, refused.
 *
 * @module
 */

import { benchArgs } from "./args.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const { values } = benchArgs(
  "usage: deno run -P=bench bench/soak.ts [--seconds N] [--requests N] [--clients N] [--heap-mb N] [--json]",
  {
    seconds: { type: "string" },
    requests: { type: "string" },
    clients: { type: "string" },
    "heap-mb": { type: "string" },
    json: { type: "boolean" },
  },
);
/** A positive integer flag within [1, max]; exit 2 otherwise. */
function bounded(name: string, v: string | undefined, dflt: number, max: number): number {
  const n = v === undefined ? dflt : Number(v);
  if (!Number.isInteger(n) || n < 1 || n > max) {
    console.error(`bench/soak: --${name} must be an integer in 1..${max}, got ${v}`);
    Deno.exit(2);
  }
  return n;
}
const SECONDS = bounded("seconds", values.seconds, 30, 1800);
const MAX_REQUESTS = bounded("requests", values.requests, 20000, 1000000);
const CLIENTS = bounded("clients", values.clients, 12, 256);
/** The server's V8 old-space cap (MB), to tell garbage V8 has not collected from memory held. */
const HEAP_MB = values["heap-mb"] === undefined ? undefined : bounded("heap-mb", values["heap-mb"], 0, 65536);
const KEY = "soak-key";
const log = (s: string) => console.error(`bench/soak: ${s}`);

const child = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    ...(HEAP_MB ? [`--v8-flags=--max-old-space-size=${HEAP_MB}`] : []),
    "-P=k3",
    `${ROOT}/main.ts`,
    "serve",
    `${ROOT}/tests/fixtures/tiny`,
    "--host",
    "127.0.0.1",
    "--port",
    "0",
    "--parallel",
    "4",
    "--max-queue",
    "16",
    "--context",
    "1024",
    "--body-timeout",
    "3",
    "--header-timeout",
    "3",
    "--send-timeout",
    "2",
    // Idle keep-alive connections (fetch's pool) close soon after the load, so the
    // connections counted after it are those the server still holds.
    "--idle-timeout",
    "3",
    "--threads",
    "1",
  ],
  env: { K3_API_KEY: KEY },
  stdin: "null",
  stdout: "null",
  stderr: "piped",
}).spawn();
const lines = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
let err = "";
while (!/ready: http:\/\/127\.0\.0\.1:(\d+)\/v1/.test(err)) {
  const r = await lines.read();
  if (r.done) throw new Error(`k3 serve exited: ${err}`);
  err += r.value;
}
const PORT = Number(/ready: http:\/\/127\.0\.0\.1:(\d+)\/v1/.exec(err)![1]);
const BASE = `http://127.0.0.1:${PORT}`;
let serverLog = 0, stackTraces = 0, internalErrors = 0;
const draining = (async () => {
  for (let r = await lines.read(); !r.done; r = await lines.read()) {
    serverLog += r.value.split("\n").length - 1;
    stackTraces += (r.value.match(/\n\s+at /g) ?? []).length;
    internalErrors += (r.value.match(/internal error/g) ?? []).length;
  }
})();
const auth = { authorization: `Bearer ${KEY}`, "content-type": "application/json" };
const enc = new TextEncoder();

async function metrics(): Promise<Record<string, number>> {
  const text = await (await fetch(`${BASE}/metrics`, { headers: auth })).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^(k3_\w+)(?:\{[^}]*\})? (\S+)$/gm)) out[m[1]] = (out[m[1]] ?? 0) + Number(m[2]);
  return out;
}

async function rss(): Promise<number> {
  const ps = await new Deno.Command("ps", { args: ["-o", "rss=", "-p", String(child.pid)], stdout: "piped" }).output();
  return 1024 * Number(new TextDecoder().decode(ps.stdout).trim());
}

const counts = { answers: 0, aborted: 0, cutOff: 0, refused: 0, busy: 0, failed: 0, nonReading: 0, slowReading: 0 };
const ttfts: number[] = [];
const question = (i: number) => [{ role: "user", content: `Question ${i}: what is the capital of France?` }];

/** A streamed chat answer; `dropAfterFirst`: the client goes away at its first text. */
async function streamed(i: number, dropAfterFirst: boolean): Promise<void> {
  const ac = new AbortController();
  const t0 = performance.now();
  const res = await fetch(`${BASE}/v1/chat/completions`, {
    method: "POST",
    headers: auth,
    body: JSON.stringify({ messages: question(i), max_tokens: 12, stream: true }),
    signal: ac.signal,
  });
  if (res.status === 429) return void (counts.busy++, await res.body?.cancel());
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let first = true;
  try {
    for (let r = await reader.read(); !r.done; r = await reader.read()) {
      if (first && /"(content|reasoning_content)":"[^"]/.test(r.value)) {
        first = false;
        ttfts.push((performance.now() - t0) / 1000);
        if (dropAfterFirst) {
          ac.abort();
          counts.aborted++;
          return;
        }
      }
    }
    counts.answers++;
  } catch {
    if (!dropAfterFirst) counts.failed++;
  }
}

async function whole(i: number): Promise<void> {
  const res = await fetch(`${BASE}/v1/chat/completions`, {
    method: "POST",
    headers: auth,
    body: JSON.stringify({ messages: question(i), max_tokens: 8 }),
  });
  await res.body?.cancel();
  if (res.status === 200) counts.answers++;
  else if (res.status === 429) counts.busy++;
  else counts.failed++;
}

/** Raw socket: head, 50 ms, body, then the client closes while the answer generates. */
async function splitAndClose(i: number): Promise<void> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: PORT });
  conn.setNoDelay(true);
  const body = JSON.stringify({ messages: question(i), max_tokens: 400, ignore_eos: true });
  await conn.write(enc.encode(
    `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:${PORT}\r\nauthorization: Bearer ${KEY}\r\n` +
      `content-type: application/json\r\ncontent-length: ${enc.encode(body).length}\r\n\r\n`,
  ));
  await new Promise((r) => setTimeout(r, 50));
  await conn.write(enc.encode(body));
  await new Promise((r) => setTimeout(r, 150));
  conn.close();
  counts.aborted++;
}

/** A body trickled one byte every 400 ms: the server cuts it off at its body timeout. */
async function trickle(): Promise<void> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: PORT });
  try {
    await conn.write(enc.encode(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:${PORT}\r\nauthorization: Bearer ${KEY}\r\n` +
        `content-type: application/json\r\ncontent-length: 1000\r\n\r\n`,
    ));
    const answer = conn.read(new Uint8Array(4096));
    let closed = false;
    answer.then(() => (closed = true), () => (closed = true));
    for (let k = 0; k < 100 && !closed; k++) {
      await new Promise((r) => setTimeout(r, 400));
      if (!closed) await conn.write(enc.encode(" ")).catch(() => (closed = true));
    }
    await answer.catch(() => null);
    counts.cutOff++;
  } finally {
    conn.close();
  }
}

/** A raw request head (and body) on a new connection. */
async function rawRequest(method: string, path: string, body = ""): Promise<Deno.TcpConn> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: PORT });
  await conn.write(enc.encode(
    `${method} ${path} HTTP/1.1\r\nhost: 127.0.0.1:${PORT}\r\nauthorization: Bearer ${KEY}\r\n` +
      `content-type: application/json\r\ncontent-length: ${enc.encode(body).length}\r\n\r\n${body}`,
  ));
  return conn;
}

/**
 * A client that never reads: a long stream asked for and left unread for 4 s, or /health
 * pipelined without reading until the server closes the connection (its send timeout).
 */
async function nonReading(i: number): Promise<void> {
  counts.nonReading++;
  if (i % 2 === 0) {
    const body = JSON.stringify({ messages: question(i), max_tokens: 600, ignore_eos: true, stream: true });
    const conn = await rawRequest("POST", "/v1/chat/completions", body);
    await new Promise((r) => setTimeout(r, 4000));
    return conn.close();
  }
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: PORT });
  const many = enc.encode(`GET /health HTTP/1.1\r\nhost: 127.0.0.1:${PORT}\r\n\r\n`.repeat(2000));
  const until = performance.now() + 20_000;
  try {
    while (performance.now() < until) await conn.write(many);
  } catch {
    counts.cutOff++; // closed by the server: its writes made no progress
  }
  conn.close();
}

/** A client that reads a few bytes at a time: a stream (SSE) or a whole answer (JSON). */
async function slowReading(i: number): Promise<void> {
  const stream = i % 2 === 0;
  const body = JSON.stringify({ messages: question(i), max_tokens: 24, stream });
  const conn = await rawRequest("POST", "/v1/chat/completions", body);
  const chunk = new Uint8Array(64);
  let text = "";
  try {
    for (let n = await conn.read(chunk); n !== null; n = await conn.read(chunk)) {
      text += new TextDecoder().decode(chunk.subarray(0, n));
      if (stream ? text.includes("data: [DONE]") : /\r\n\r\n\{[^]*\}$/.test(text)) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    if (/^HTTP\/1\.1 200 /.test(text)) counts.slowReading++;
    else if (/^HTTP\/1\.1 429 /.test(text)) counts.busy++;
    else counts.failed++;
  } finally {
    conn.close();
  }
}

async function malformed(i: number): Promise<void> {
  const k = i % 3;
  if (k === 0) {
    const r = await fetch(`${BASE}/v1/chat/completions`, { method: "POST", headers: auth, body: "{not json" });
    await r.body?.cancel();
  } else if (k === 1) {
    const r = await fetch(`${BASE}/v1/${i}-${"%0a\u00e9".repeat(1000)}`);
    await r.body?.cancel();
  } else {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: PORT });
    await conn.write(enc.encode("\u0016\u0003\u0001 not http at all\r\n\r\n")).catch(() => {});
    await conn.read(new Uint8Array(1024)).catch(() => null);
    conn.close();
  }
  counts.refused++;
}

const KINDS = [
  (i: number) => streamed(i, false),
  (i: number) => streamed(i, false),
  (i: number) => whole(i),
  (i: number) => streamed(i, true),
  (i: number) => splitAndClose(i),
  (i: number) => malformed(i),
  (i: number) => malformed(i),
  () => trickle(),
  (i: number) => nonReading(i),
  (i: number) => slowReading(i),
];

/** RSS, connections (besides the sampler's own) and slots now. */
async function snapshot(): Promise<{ rss: number; connections: number; slots: number }> {
  const m = await metrics();
  return { rss: await rss(), connections: m.k3_connections - 1, slots: m.k3_sequences_in_flight };
}
const before = await snapshot();

const t0 = performance.now();
const deadline = t0 + SECONDS * 1000;
let issued = 0;
const workers = Array.from({ length: CLIENTS }, async (_, w) => {
  while (performance.now() < deadline && issued < MAX_REQUESTS) {
    const i = issued++;
    try {
      await KINDS[(i + w) % KINDS.length](i);
    } catch {
      counts.failed++;
    }
  }
});

interface Sample {
  t: number;
  rss: number;
  connections: number;
  slots: number;
  answersPerSecond: number;
}
const samples: Sample[] = [];
let lastAnswers = 0;
let running = true;
const sampler = (async () => {
  while (running) {
    await new Promise((r) => setTimeout(r, 1000));
    const m = await metrics();
    samples.push({
      t: (performance.now() - t0) / 1000,
      rss: await rss(),
      connections: m.k3_connections,
      slots: m.k3_sequences_in_flight,
      answersPerSecond: counts.answers - lastAnswers,
    });
    lastAnswers = counts.answers;
  }
})();
await Promise.all(workers);
running = false;
await sampler;

// Idle: every client has stopped; the server must give every slot back.
let end = await metrics();
for (let k = 0; k < 50 && (end.k3_sequences_in_flight > 0 || end.k3_requests_in_flight > 0); k++) {
  await new Promise((r) => setTimeout(r, 200));
  end = await metrics();
}
// Connections the clients left close within the send and idle timeouts.
let after = await snapshot();
for (let k = 0; k < 50 && after.connections > 0; k++) {
  await new Promise((r) => setTimeout(r, 200));
  after = await snapshot();
}
const finalRss = after.rss;
child.kill("SIGTERM");
const status = await child.status;
await draining;

const sorted = [...ttfts].sort((a, b) => a - b);
const p = (q: number) => sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] : NaN;
const settled = samples.find((s) => s.t >= SECONDS / 10) ?? samples[0];
const result = {
  seconds: Math.round((performance.now() - t0) / 100) / 10,
  requests: issued,
  clients: CLIENTS,
  heap_mb: HEAP_MB ?? null,
  answers: counts.answers,
  aborted: counts.aborted,
  cut_off: counts.cutOff,
  refused: counts.refused,
  busy_429: counts.busy,
  non_reading: counts.nonReading,
  slow_reading_answers: counts.slowReading,
  send_timeouts: end.k3_send_timeouts_total,
  before: before,
  during_max: {
    rss: Math.max(...samples.map((s) => s.rss)),
    connections: Math.max(...samples.map((s) => s.connections)),
    slots: Math.max(...samples.map((s) => s.slots)),
  },
  after: after,
  connections_left: after.connections,
  client_failures: counts.failed,
  rss_start_bytes: settled?.rss ?? finalRss,
  rss_end_bytes: finalRss,
  rss_growth_bytes: finalRss - (settled?.rss ?? finalRss),
  rss_max_bytes: Math.max(...samples.map((s) => s.rss), finalRss),
  max_connections: Math.max(...samples.map((s) => s.connections)),
  slots_leaked: end.k3_sequences_in_flight + end.k3_requests_in_flight,
  client_disconnects: end.k3_client_disconnects_total,
  internal_errors: end.k3_internal_errors_total,
  stack_traces_logged: stackTraces,
  internal_error_lines: internalErrors,
  log_lines: serverLog,
  p50_ttft_seconds: p(0.5),
  p99_ttft_seconds: p(0.99),
  exit_code: status.code,
  loadavg: Deno.loadavg(),
};

console.log("   t s    RSS MB  conns  slots  answers/s");
for (const s of samples) {
  console.log(
    `${s.t.toFixed(0).padStart(6)}  ${(s.rss / 2 ** 20).toFixed(1).padStart(8)}  ${
      String(s.connections).padStart(5)
    }  ${String(s.slots).padStart(5)}  ${String(s.answersPerSecond).padStart(9)}`,
  );
}
const mb = (b: number) => `${(b / 2 ** 20).toFixed(1)} MB`;
for (const [when, s] of [["before", before], ["during (max)", result.during_max], ["after", after]] as const) {
  log(`${when}: RSS ${mb(s.rss)}, ${s.connections} connections, ${s.slots} slots`);
}
log(
  `${result.requests} requests in ${result.seconds} s: ${result.answers} answers, ${result.aborted} aborted, ${result.cut_off} cut off, ${result.refused} refused, ${result.non_reading} non-reading (${result.send_timeouts} send timeouts), ${result.slow_reading_answers} slow-reading answers; RSS growth ${
    (result.rss_growth_bytes / 2 ** 20).toFixed(1)
  } MB; slots leaked ${result.slots_leaked}; p99 TTFT ${result.p99_ttft_seconds.toFixed(3)} s`,
);
if (values.json) console.log(JSON.stringify(result));
