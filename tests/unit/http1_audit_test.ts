/**
 * The HTTP/1.1 layer of `k3 serve` (cli/server/http1.ts) against the hostile audit of
 * issue 35, in-process over loopback: a client that never reads is cut off by the send
 * timeout (counted) and cannot hold a shutdown; a streamed answer's unread output is
 * bounded (cli/server/stream.ts); a body on GET is refused, not read as the next request;
 * a half-closed client is served; HTTP/1.0 without Host is addressed to the listener;
 * empty lines before a request line are skipped.
 */

import assert from "node:assert/strict";
import { type Http1Handler, type Http1Limits, Http1Server } from "../../cli/server/http1.ts";
import { acceptedHosts, checkHost } from "../../cli/server/guard.ts";
import { EventStream, OutputOverflow, PENDING_OUTPUT_LIMIT } from "../../cli/server/stream.ts";
import { Metrics } from "../../cli/server/metrics.ts";
import { until } from "../helpers.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();

const LIMITS: Http1Limits = {
  headerTimeoutSeconds: 10,
  bodyTimeoutSeconds: 10,
  idleTimeoutSeconds: 10,
  maxConnections: 8,
  maxHeadBytes: 16384,
  sendTimeoutSeconds: 3600,
};

/** A body far larger than loopback's socket buffers: its write stalls if nobody reads. */
const HUGE = 64 << 20;

function listen(handler: Http1Handler, limits: Partial<Http1Limits> = {}): Http1Server {
  return new Http1Server("127.0.0.1", 0, { ...LIMITS, ...limits }, handler);
}

function connect(s: Http1Server): Promise<Deno.TcpConn> {
  return Deno.connect({ hostname: "127.0.0.1", port: s.addr.port });
}

/** Everything the server writes until it closes the connection. */
async function readAll(conn: Deno.Conn): Promise<string> {
  let out = "";
  const chunk = new Uint8Array(65536);
  try {
    for (let n = await conn.read(chunk); n !== null; n = await conn.read(chunk)) {
      out += dec.decode(chunk.subarray(0, n));
    }
  } catch { /* a reset ends it too */ }
  return out;
}

/** Resolves when `signal` aborts; fails after `seconds`. */
function aborted(signal: AbortSignal, seconds = 30): Promise<void> {
  return until("the request's gone signal", () => signal.aborted, seconds);
}

const statuses = (text: string) => [...text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));

Deno.test("http1: a client that never reads is cut off by the send timeout, counted, its request gone", async () => {
  let gone: AbortSignal | undefined;
  const s = listen((req, g) => {
    gone = g;
    if (new URL(req.url).pathname === "/stream") {
      // An answer that never ends, as a generation that is never read would be.
      const body = new ReadableStream<Uint8Array>({
        pull: (c) => c.enqueue(enc.encode(`data: ${"x".repeat(4096)}\n\n`)),
        cancel: () => {},
      });
      return Promise.resolve(new Response(body, { headers: { "content-type": "text/event-stream" } }));
    }
    return Promise.resolve(new Response(new Uint8Array(HUGE)));
  }, { sendTimeoutSeconds: 0.3 });
  try {
    for (const path of ["/huge", "/stream"]) {
      const before = s.sendTimeouts;
      const c = await connect(s);
      await c.write(enc.encode(`GET ${path} HTTP/1.1\r\nhost: x\r\n\r\n`));
      await until(`${path}: the connection closed`, () => s.sendTimeouts === before + 1 && s.connections === 0);
      await aborted(gone!);
      c.close();
    }
    assert.match(new Metrics().text(undefined, 0, 0, s.sendTimeouts), /\nk3_send_timeouts_total 2\n/);
  } finally {
    await s.shutdown(0);
  }
});

Deno.test("http1: a shutdown ends by its cut whatever a client that never reads does", async () => {
  let answered = false;
  const s = listen(() => {
    answered = true;
    return Promise.resolve(new Response(new Uint8Array(HUGE)));
  });
  const c = await connect(s);
  await c.write(enc.encode("GET /huge HTTP/1.1\r\nhost: x\r\n\r\n"));
  await until("the answer is being written", () => answered);
  let ended = false;
  const stopped = s.shutdown(0.2).then(() => (ended = true));
  await until("the shutdown ended", () => ended, 20);
  await stopped;
  assert.equal(s.connections, 0);
  c.close();
});

Deno.test("http1: a streamed answer's unread output is bounded: past it the stream fails and the client is gone", async () => {
  let cancelled = 0;
  const events = new EventStream(() => cancelled++);
  const event = { text: "y".repeat(1000) };
  for (let i = 0; i < 2 * PENDING_OUTPUT_LIMIT / 1000; i++) events.send(event);
  assert.equal(cancelled, 1);
  const reader = events.body.getReader();
  await assert.rejects(async () => {
    while (!(await reader.read()).done) { /* drain what was held */ }
  }, OutputOverflow);
  events.send(event); // nothing more once cut off
  assert.equal(cancelled, 1);
});

Deno.test("http1: a Content-Length body on GET or HEAD is refused with 400 and the connection closed, never read as a request", async () => {
  const seen: string[] = [];
  const s = listen((req) => {
    seen.push(new URL(req.url).pathname);
    return Promise.resolve(new Response("ok"));
  });
  try {
    for (const method of ["GET", "HEAD"]) {
      const smuggled = "GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n";
      const c = await connect(s);
      await c.write(
        enc.encode(`${method} /health HTTP/1.1\r\nhost: x\r\ncontent-length: ${smuggled.length}\r\n\r\n${smuggled}`),
      );
      const text = await readAll(c);
      c.close();
      assert.deepEqual(statuses(text), [400], text);
      assert.match(text, new RegExp(`a ${method} request takes no body`));
    }
    assert.deepEqual(seen, []);
    // Content-Length: 0 is no body: served, and kept alive.
    const c = await connect(s);
    await c.write(enc.encode("GET /health HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"));
    await c.write(enc.encode("GET /again HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"));
    assert.deepEqual(statuses(await readAll(c)), [200, 200]);
    c.close();
    assert.deepEqual(seen, ["/health", "/again"]);
  } finally {
    await s.shutdown(0);
  }
});

Deno.test("http1: a client that half-closes after a complete request is served; one that closes is gone", async () => {
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  const gones: AbortSignal[] = [];
  const s = listen(async (req, gone) => {
    gones.push(gone);
    const body = await req.text();
    // The answer waits for the test, or for the client to be found gone.
    await Promise.race([released, new Promise((r) => gone.addEventListener("abort", r))]);
    return new Response(`got ${body}`);
  });
  try {
    const post = "POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello";
    const half = await connect(s);
    await half.write(enc.encode(post));
    await half.closeWrite();
    // The server probes a half-closed client with an interim 102, which it skips.
    const chunk = new Uint8Array(1024);
    const n = await half.read(chunk);
    assert.match(dec.decode(chunk.subarray(0, n ?? 0)), /^HTTP\/1\.1 102 Processing\r\n\r\n/);
    const full = await connect(s);
    await full.write(enc.encode(post));
    await until("both requests are in", () => gones.length === 2);
    full.close();
    await aborted(gones[1]);
    release();
    const text = await readAll(half);
    half.close();
    assert.equal(gones[0].aborted, false);
    assert.deepEqual(statuses(text).filter((x) => x !== 102), [200], text);
    assert.match(text, /connection: close[\s\S]*got hello$/);
  } finally {
    await s.shutdown(0);
  }
});

Deno.test("http1: HTTP/1.0 without Host is addressed to the listener; empty lines before a request line are skipped", async () => {
  const s = listen((req) => {
    checkHost(req, acceptedHosts({ hostname: "127.0.0.1", port: s.addr.port, hostExplicit: false, allowedHosts: [] }));
    return Promise.resolve(new Response(req.headers.get("host")));
  });
  try {
    let c = await connect(s);
    await c.write(enc.encode("GET /health HTTP/1.0\r\n\r\n"));
    assert.match(await readAll(c), new RegExp(`^HTTP/1\\.1 200 [\\s\\S]*\r\n\r\n127\\.0\\.0\\.1:${s.addr.port}$`));
    c.close();
    c = await connect(s);
    await c.write(
      enc.encode(`\r\n\r\nGET /health HTTP/1.1\r\nhost: 127.0.0.1:${s.addr.port}\r\nconnection: close\r\n\r\n`),
    );
    assert.deepEqual(statuses(await readAll(c)), [200]);
    c.close();
  } finally {
    await s.shutdown(0);
  }
});
