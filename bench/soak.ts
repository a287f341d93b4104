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
 * The load runs `--rounds` times (default 2) on the same server. Before the first round,
 * every second during each and after each (once the clients have stopped and the server
 * is idle) it samples the server's RSS, V8 heap (used and total), external memory (array
 * buffers and the like), open connections and slots in use (and answers per second
 * during). The memory figures come from the server itself (`Deno.memoryUsage()` through
 * the V8 inspector, which the server runs with `--inspect` on a loopback port), and before
 * and after each round a full garbage collection is forced first, so they are what is
 * held, not garbage not yet collected. It counts the slots still held at the end
 * (`slots_leaked`, which must be 0) and the connections left open besides its own.
 *
 * Held memory shows as heap and external memory after a round above their values before
 * the load. A server holds by design what its bounded caches keep: the state cache's
 * states (array buffers: external memory, its size read from /metrics) and the drafter's
 * pool of finished texts (heap); `--caches-off` turns both off, so that anything else held
 * would show. RSS that stays up while heap and external memory are back is pages the
 * allocator and V8 keep for reuse: then the next round's RSS after is flat against the
 * first's (a plateau), where a leak would grow it again.
 *
 *   deno run -P=bench bench/soak.ts [--seconds N (default 30, at most 1800)]
 *     [--rounds N (default 2)] [--requests N (default 20000)] [--clients N (default 12)]
 *     [--caches-off] [--heap-mb N] [--heap-snapshot PREFIX] [--json]
 *
 * --heap-mb caps the server's V8 old space; --heap-snapshot PREFIX writes a heap snapshot
 * of the server after each round (PREFIX-N.heapsnapshot, for Chrome DevTools' Memory tab;
 * taking one grows the server's RSS, so compare RSS in runs without it).
 *
 * Prints the samples as a table and before/during/after lines per round; with --json one
 * object as the last line: per round its before, during (max) and after figures, then
 * rss_plateau_bytes and heap_plateau_bytes (the last round's RSS and heap used after minus
 * the first's), heap_held_bytes and external_held_bytes (after the last round minus before
 * the load; external_held_besides_state_cache_bytes without the state cache's growth),
 * slots_leaked, connections_left, p99_ttft_seconds, answers, aborted, cut_off, refused.
 *
 * @module
 */

import { benchArgs } from "./args.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const { values } = benchArgs(
  "usage: deno run -P=bench bench/soak.ts [--seconds N] [--rounds N] [--requests N] [--clients N] [--caches-off] [--heap-mb N] [--heap-snapshot PREFIX] [--json]",
  {
    seconds: { type: "string" },
    rounds: { type: "string" },
    requests: { type: "string" },
    clients: { type: "string" },
    "heap-mb": { type: "string" },
    "heap-snapshot": { type: "string" },
    "caches-off": { type: "boolean" },
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
const ROUNDS = bounded("rounds", values.rounds, 2, 20);
const MAX_REQUESTS = bounded("requests", values.requests, 20000, 1000000);
const CLIENTS = bounded("clients", values.clients, 12, 256);
/** The server's V8 old-space cap (MB). */
const HEAP_MB = values["heap-mb"] === undefined ? undefined : bounded("heap-mb", values["heap-mb"], 0, 65536);
const KEY = "soak-key";
const log = (s: string) => console.error(`bench/soak: ${s}`);

const child = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    // The inspector on a loopback port: the bench reads the server's own memory figures
    // and forces a full collection through it (see the module doc).
    "--inspect=127.0.0.1:0",
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
    // The server's two memory caches, each bounded, off: the state cache (kept states up
    // to its RAM budget) and the drafter's pool of finished texts (up to 65,536 tokens).
    ...(values["caches-off"] ? ["--state-cache-gb", "0", "--draft", "off"] : []),
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

/** The server's V8 inspector: one request at a time, answered by id. */
const inspector = await (async () => {
  const url = /Debugger listening on (ws:\/\/\S+)/.exec(err)?.[1];
  if (!url) throw new Error(`k3 serve did not print its inspector's address: ${err}`);
  const ws = new WebSocket(url);
  await new Promise((resolve, reject) => (ws.onopen = resolve, ws.onerror = reject));
  const waiting = new Map<number, (result: Record<string, unknown>) => void>();
  let id = 0;
  const call = (method: string, params = {}) =>
    new Promise<Record<string, unknown>>((resolve) => {
      waiting.set(++id, resolve);
      ws.send(JSON.stringify({ id, method, params }));
    });
  const self = { call, close: () => ws.close(), onChunk: undefined as ((chunk: string) => void) | undefined };
  ws.onmessage = (e) => {
    const m = JSON.parse(e.data);
    if (m.method === "HeapProfiler.addHeapSnapshotChunk") self.onChunk?.(m.params.chunk);
    if (m.id !== undefined) waiting.get(m.id)?.(m.result ?? {}), waiting.delete(m.id);
  };
  return self;
})();

/** The server's memory as it sees it: RSS, V8 heap used and total, external (bytes). */
interface Memory {
  rss: number;
  heapUsed: number;
  heapTotal: number;
  external: number;
}
/** Writes a heap snapshot of the server to `path` (Chrome DevTools' format). */
async function heapSnapshot(path: string): Promise<void> {
  const file = await Deno.open(path, { write: true, create: true, truncate: true });
  const writer = file.writable.getWriter();
  inspector.onChunk = (chunk) => void writer.write(new TextEncoder().encode(chunk));
  await inspector.call("HeapProfiler.takeHeapSnapshot", { reportProgress: false });
  inspector.onChunk = undefined;
  await writer.close();
}

/** The server's memory now; `collect` forces a full garbage collection first. */
async function memory(collect = false): Promise<Memory> {
  if (collect) await inspector.call("HeapProfiler.collectGarbage");
  const r = await inspector.call("Runtime.evaluate", { expression: "JSON.stringify(Deno.memoryUsage())" });
  return JSON.parse((r.result as { value: string }).value);
}

const auth = { authorization: `Bearer ${KEY}`, "content-type": "application/json" };
const enc = new TextEncoder();

async function metrics(): Promise<Record<string, number>> {
  let text: string;
  try {
    text = await (await fetch(`${BASE}/metrics`, { headers: auth })).text();
  } catch {
    // A pooled keep-alive connection the server closed at its idle timeout as it was
    // reused: the request was never read; ask again on a new one.
    text = await (await fetch(`${BASE}/metrics`, { headers: auth })).text();
  }
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^(k3_\w+)(?:\{[^}]*\})? (\S+)$/gm)) out[m[1]] = (out[m[1]] ?? 0) + Number(m[2]);
  return out;
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

/** Memory, connections (besides the sampler's own) and slots now. */
interface Snapshot extends Memory {
  connections: number;
  slots: number;
  /** Bytes of states the state cache keeps in RAM (held by design, up to its budget). */
  stateCache: number;
}
async function snapshot(collect: boolean): Promise<Snapshot> {
  const m = await metrics();
  return {
    ...await memory(collect),
    connections: m.k3_connections - 1,
    slots: m.k3_sequences_in_flight,
    stateCache: m.k3_state_cache_bytes ?? 0,
  };
}

interface Sample extends Snapshot {
  round: number;
  t: number;
  answersPerSecond: number;
}
const samples: Sample[] = [];
const t0 = performance.now();
let issued = 0;
let lastMetrics: Record<string, number> = {};

/** One round of load for SECONDS (or until MAX_REQUESTS), then idle: its before, samples and after. */
async function round(r: number): Promise<{ before: Snapshot; during: Sample[]; after: Snapshot }> {
  const before = await snapshot(true);
  const deadline = performance.now() + SECONDS * 1000;
  const budget = issued + Math.ceil((MAX_REQUESTS - issued) / (ROUNDS - r));
  const workers = Array.from({ length: CLIENTS }, async (_, w) => {
    while (performance.now() < deadline && issued < budget) {
      const i = issued++;
      try {
        await KINDS[(i + w) % KINDS.length](i);
      } catch {
        counts.failed++;
      }
    }
  });
  const during: Sample[] = [];
  let lastAnswers = counts.answers;
  let running = true;
  const sampler = (async () => {
    while (running) {
      await new Promise((r) => setTimeout(r, 1000));
      const s = await snapshot(false);
      during.push({
        ...s,
        round: r,
        t: (performance.now() - t0) / 1000,
        answersPerSecond: counts.answers - lastAnswers,
      });
      lastAnswers = counts.answers;
    }
  })();
  await Promise.all(workers);
  running = false;
  await sampler;
  samples.push(...during);

  // Idle: every client has stopped; the server must give every slot back.
  lastMetrics = await metrics();
  for (let k = 0; k < 50 && (lastMetrics.k3_sequences_in_flight > 0 || lastMetrics.k3_requests_in_flight > 0); k++) {
    await new Promise((r) => setTimeout(r, 200));
    lastMetrics = await metrics();
  }
  // Connections the clients left close within the send and idle timeouts.
  let after = await snapshot(true);
  for (let k = 0; k < 50 && after.connections > 0; k++) {
    await new Promise((r) => setTimeout(r, 200));
    after = await snapshot(true);
  }
  return { before, during, after };
}

const rounds = [];
for (let r = 0; r < ROUNDS; r++) {
  rounds.push(await round(r));
  if (values["heap-snapshot"]) await heapSnapshot(`${values["heap-snapshot"]}-${r + 1}.heapsnapshot`);
}
const end = lastMetrics;
inspector.close();
child.kill("SIGTERM");
const status = await child.status;
await draining;

const sorted = [...ttfts].sort((a, b) => a - b);
const p = (q: number) => sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] : NaN;
const most = (during: Sample[]) => ({
  rss: Math.max(...during.map((s) => s.rss)),
  heapUsed: Math.max(...during.map((s) => s.heapUsed)),
  heapTotal: Math.max(...during.map((s) => s.heapTotal)),
  external: Math.max(...during.map((s) => s.external)),
  connections: Math.max(...during.map((s) => s.connections)),
  slots: Math.max(...during.map((s) => s.slots)),
});
const first = rounds[0], last = rounds[rounds.length - 1];
const result = {
  seconds: Math.round((performance.now() - t0) / 100) / 10,
  rounds: rounds.map(({ before, during, after }) => ({ before, during_max: most(during), after })),
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
  connections_left: last.after.connections,
  client_failures: counts.failed,
  rss_before_bytes: first.before.rss,
  rss_after_first_round_bytes: first.after.rss,
  rss_after_bytes: last.after.rss,
  rss_plateau_bytes: last.after.rss - first.after.rss,
  heap_held_bytes: last.after.heapUsed - first.before.heapUsed,
  heap_plateau_bytes: last.after.heapUsed - first.after.heapUsed,
  external_held_bytes: last.after.external - first.before.external,
  state_cache_bytes: last.after.stateCache,
  // What is held besides the states the cache keeps by design (their payloads are
  // array buffers: external memory).
  external_held_besides_state_cache_bytes: last.after.external - first.before.external -
    (last.after.stateCache - first.before.stateCache),
  caches_off: values["caches-off"] ?? false,
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

const mb = (b: number) => (b / 2 ** 20).toFixed(1);
console.log("round    t s    RSS MB  heap MB  ext MB  conns  slots  answers/s");
for (const s of samples) {
  console.log(
    `${String(s.round + 1).padStart(5)}  ${s.t.toFixed(0).padStart(5)}  ${mb(s.rss).padStart(8)}  ${
      mb(s.heapUsed).padStart(7)
    }  ${mb(s.external).padStart(6)}  ${String(s.connections).padStart(5)}  ${String(s.slots).padStart(5)}  ${
      String(s.answersPerSecond).padStart(9)
    }`,
  );
}
const line = (s: Omit<Snapshot, "stateCache"> & { stateCache?: number }) =>
  `RSS ${mb(s.rss)} MB, heap ${mb(s.heapUsed)} of ${mb(s.heapTotal)} MB, external ${mb(s.external)} MB${
    s.stateCache === undefined ? "" : ` (state cache ${mb(s.stateCache)} MB)`
  }, ${s.connections} connections, ${s.slots} slots`;
result.rounds.forEach((r, k) => {
  log(`round ${k + 1} before (collected): ${line(r.before)}`);
  log(`round ${k + 1} during (max):       ${line(r.during_max)}`);
  log(`round ${k + 1} after (collected):  ${line(r.after)}`);
});
log(
  `${result.requests} requests in ${result.seconds} s: ${result.answers} answers, ${result.aborted} aborted, ${result.cut_off} cut off, ${result.refused} refused, ${result.non_reading} non-reading (${result.send_timeouts} send timeouts), ${result.slow_reading_answers} slow-reading answers; heap held ${
    mb(result.heap_held_bytes)
  } MB (${mb(result.heap_plateau_bytes)} MB after the last round from the first's), external held ${
    mb(result.external_held_bytes)
  } MB (${mb(result.external_held_besides_state_cache_bytes)} MB besides the state cache); RSS after the last round ${
    mb(result.rss_plateau_bytes)
  } MB from the first's; slots leaked ${result.slots_leaked}; connections left ${result.connections_left}; p99 TTFT ${
    result.p99_ttft_seconds.toFixed(3)
  } s`,
);
if (values.json) console.log(JSON.stringify(result));
