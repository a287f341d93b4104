/**
 * The HTTP/1.1 transport of `k3 serve` (cli/server/http1.ts) alone, in process: a stub
 * handler behind an `Http1Server` on 127.0.0.1 (port 0), driven by raw TCP sockets, so each
 * test writes exactly the bytes and TCP segments it means. A client that closes after a body
 * sent in its own segment aborts the handler's `gone`; the header, body and idle timeouts
 * cut slow clients off; the connection cap answers 503; a kept-alive connection carries two
 * requests; malformed heads are answered 400 (411, 431) and closed without reaching the
 * handler; `Expect: 100-continue` is answered once the handler asks for the body, and never
 * when it answers without it. Timeouts are made small through the limits; no assertion is
 * about time beyond "closed within a generous bound".
 */

import assert from "node:assert/strict";
import { ClientGone, type Http1Handler, type Http1Limits, Http1Server } from "../../cli/server/http1.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();

/** Limits no test reaches unless it lowers one. */
const ROOMY: Http1Limits = {
  headerTimeoutSeconds: 30,
  bodyTimeoutSeconds: 30,
  idleTimeoutSeconds: 30,
  maxConnections: 16,
  maxHeadBytes: 8192,
};

/** A short timeout for the test that waits for one. */
const SHORT = 0.2;

/** How long a connection may take to close before the test fails instead of hanging. */
const BOUND_MS = 10_000;

/** An `Http1Server` on loopback with `handler`, shut down when the test's `await using` ends. */
function listen(handler: Http1Handler, limits: Partial<Http1Limits> = {}) {
  const server = new Http1Server("127.0.0.1", 0, { ...ROOMY, ...limits }, handler);
  return {
    server,
    connect: () => Deno.connect({ hostname: "127.0.0.1", port: server.addr.port }),
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

/** `promise`, or a failure naming `what` after {@link BOUND_MS}: a missed event fails, never hangs. */
async function within<T>(what: string, promise: Promise<T>): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const bound = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${BOUND_MS} ms`)), BOUND_MS);
  });
  try {
    return await Promise.race([promise, bound]);
  } finally {
    clearTimeout(timer);
  }
}

/** Writes `text` as one segment (Nagle off, so two writes are two segments). */
async function send(conn: Deno.TcpConn, text: string): Promise<void> {
  conn.setNoDelay(true);
  const bytes = enc.encode(text);
  for (let off = 0; off < bytes.length;) off += await conn.write(bytes.subarray(off));
}

/** Everything the server writes until it closes the connection; throws after {@link BOUND_MS}. */
async function readToClose(conn: Deno.Conn): Promise<string> {
  let out = "", timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    conn.close();
  }, BOUND_MS);
  const chunk = new Uint8Array(65536);
  try {
    for (let n = await conn.read(chunk); n !== null; n = await conn.read(chunk)) {
      out += dec.decode(chunk.subarray(0, n));
    }
  } catch {
    // A reset is a close too (or our own close at the bound, reported below).
  } finally {
    clearTimeout(timer);
  }
  if (timedOut) throw new Error(`the server did not close the connection within ${BOUND_MS} ms: ${out}`);
  conn.close();
  return out;
}

/** Reads one response with a content-length body, leaving the connection open. */
async function readResponse(conn: Deno.Conn): Promise<{ status: number; head: string; body: string }> {
  let buf = new Uint8Array(0);
  const more = async () => {
    const chunk = new Uint8Array(65536);
    const n = await within("a response", conn.read(chunk));
    if (n === null) throw new Error(`connection closed after ${dec.decode(buf)}`);
    const next = new Uint8Array(buf.length + n);
    next.set(buf);
    next.set(chunk.subarray(0, n), buf.length);
    buf = next;
  };
  while (!dec.decode(buf).includes("\r\n\r\n")) await more();
  const head = dec.decode(buf).split("\r\n\r\n")[0] + "\r\n\r\n";
  const headBytes = enc.encode(head).length;
  const length = Number(/^content-length: (\d+)$/im.exec(head)?.[1] ?? 0);
  while (buf.length < headBytes + length) await more();
  assert.equal(buf.length, headBytes + length, "nothing after the response");
  return { status: Number(head.split(" ")[1]), head, body: dec.decode(buf.subarray(headBytes)) };
}

/** A request head as raw HTTP/1.1 (headers in order, CRLF endings). */
function head(method: string, path: string, headers: Record<string, string> = {}): string {
  const lines = Object.entries({ host: "127.0.0.1", ...headers }).map(([k, v]) => `${k}: ${v}\r\n`);
  return `${method} ${path} HTTP/1.1\r\n${lines.join("")}\r\n`;
}

/** A handler that answers each request with its method, path and body, and counts them. */
function echo() {
  const seen: string[] = [];
  const handler: Http1Handler = async (req) => {
    const body = await req.text();
    seen.push(`${req.method} ${new URL(req.url).pathname}`);
    return new Response(`${req.method} ${new URL(req.url).pathname} ${body}`, { status: 200 });
  };
  return { seen, handler };
}

/** Resolves with the reason once `signal` aborts. */
function aborted(signal: AbortSignal): Promise<unknown> {
  if (signal.aborted) return Promise.resolve(signal.reason);
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve(signal.reason), { once: true }));
}

for (const split of [true, false]) {
  Deno.test(`client gone: a body ${split ? "in its own segment" : "with the head"}, then a close: the handler's gone aborts ("closed")`, async () => {
    const headSeen = Promise.withResolvers<void>();
    const bodyRead = Promise.withResolvers<string>();
    const why = Promise.withResolvers<unknown>();
    await using http = listen(async (req, gone) => {
      headSeen.resolve();
      bodyRead.resolve(await req.text());
      why.resolve(await aborted(gone));
      return new Response("too late");
    });
    const conn = await http.connect();
    const body = '{"long":"generation"}';
    const requestHead = head("POST", "/v1/chat/completions", { "content-length": String(body.length) });
    if (split) {
      // The head alone, and the body only once the handler has the request: two segments.
      await send(conn, requestHead);
      await within("the handler called", headSeen.promise);
      await send(conn, body);
    } else {
      await send(conn, requestHead + body);
    }
    assert.equal(await within("the body read", bodyRead.promise), body);
    conn.close();
    const reason = await within("gone aborted", why.promise);
    assert.ok(reason instanceof ClientGone, String(reason));
    assert.equal(reason.why, "closed");
  });
}

Deno.test("client gone: closed while a streamed answer is written: the handler's gone aborts, the stream is cancelled", async () => {
  const cancelled = Promise.withResolvers<void>();
  const why = Promise.withResolvers<unknown>();
  await using http = listen((_req, gone) => {
    void aborted(gone).then(why.resolve);
    let n = 0;
    const events = new ReadableStream<Uint8Array>({
      // An endless answer, one event per pull (each after the previous one was written).
      pull: (c) => c.enqueue(enc.encode(`data: ${n++}\n\n`)),
      cancel: () => cancelled.resolve(),
    });
    return Promise.resolve(new Response(events, { headers: { "content-type": "text/event-stream" } }));
  });
  const conn = await http.connect();
  await send(conn, head("GET", "/events"));
  const first = new Uint8Array(4096);
  const n = await within("the answer's head", conn.read(first));
  assert.match(dec.decode(first.subarray(0, n ?? 0)), /^HTTP\/1\.1 200 OK\r\n[\s\S]*transfer-encoding: chunked\r\n/);
  conn.close();
  await within("the stream cancelled", cancelled.promise);
  const reason = await within("gone aborted", why.promise);
  assert.ok(reason instanceof ClientGone, String(reason));
  assert.equal(reason.why, "closed");
});

Deno.test("header timeout: a head that never ends is answered 408 and closed; a silent connection is closed", async () => {
  const { seen, handler } = echo();
  await using http = listen(handler, { headerTimeoutSeconds: SHORT });
  const partial = await http.connect();
  await send(partial, "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n");
  assert.match(await readToClose(partial), /^HTTP\/1\.1 408 Request Timeout\r\n[\s\S]*request head timed out/);
  const silent = await http.connect();
  assert.equal(await readToClose(silent), "", "closed without an answer");
  assert.deepEqual(seen, []);
});

Deno.test('body timeout: a body that stops short fails the handler\'s read and aborts gone ("body timeout")', async () => {
  const readError = Promise.withResolvers<unknown>();
  const why = Promise.withResolvers<unknown>();
  await using http = listen(async (req, gone) => {
    void aborted(gone).then(why.resolve);
    try {
      await req.text();
    } catch (e) {
      readError.resolve(e);
    }
    return new Response("cut off", { status: 408 });
  }, { bodyTimeoutSeconds: SHORT });
  const conn = await http.connect();
  await send(conn, head("POST", "/upload", { "content-length": "100" }) + '{"message');
  const error = await within("the body read failed", readError.promise);
  assert.ok(error instanceof ClientGone, String(error));
  assert.equal(error.why, "body timeout");
  const reason = await within("gone aborted", why.promise);
  assert.ok(reason instanceof ClientGone && reason.why === "body timeout", String(reason));
  // The handler's answer, then the close (the rest of the body never came).
  assert.match(await readToClose(conn), /^HTTP\/1\.1 408 [\s\S]*connection: close\r\n[\s\S]*cut off$/);
});

Deno.test("idle timeout: a kept-alive connection left idle after its answer is closed", async () => {
  const { seen, handler } = echo();
  // The header timeout stays long: only the idle one can close this connection in time.
  await using http = listen(handler, { idleTimeoutSeconds: SHORT });
  const conn = await http.connect();
  await send(conn, head("GET", "/health"));
  const answer = await readToClose(conn);
  assert.match(answer, /^HTTP\/1\.1 200 OK\r\n[\s\S]*connection: keep-alive\r\n[\s\S]*GET \/health $/);
  assert.deepEqual(seen, ["GET /health"]);
});

Deno.test("keep-alive: two requests on one connection, both answered; connection: close ends it", async () => {
  const { seen, handler } = echo();
  await using http = listen(handler);
  const conn = await http.connect();
  await send(conn, head("POST", "/one", { "content-length": "5" }) + "first");
  const one = await readResponse(conn);
  assert.equal(one.status, 200);
  assert.match(one.head, /connection: keep-alive\r\n/);
  assert.equal(one.body, "POST /one first");
  await send(conn, head("GET", "/two"));
  const two = await readResponse(conn);
  assert.equal(two.body, "GET /two ");
  assert.match(two.head, /connection: keep-alive\r\n/);
  await send(conn, head("GET", "/three", { connection: "close" }));
  const three = await readToClose(conn);
  assert.match(three, /^HTTP\/1\.1 200 OK\r\n[\s\S]*connection: close\r\n[\s\S]*GET \/three $/);
  assert.deepEqual(seen, ["POST /one", "GET /two", "GET /three"]);
  // An HTTP/1.0 request is answered and closed.
  const old = await http.connect();
  await send(old, "GET /four HTTP/1.0\r\nhost: 127.0.0.1\r\n\r\n");
  assert.match(await readToClose(old), /^HTTP\/1\.1 200 OK\r\n[\s\S]*connection: close\r\n[\s\S]*GET \/four $/);
});

Deno.test("connection cap: beyond it a connection is answered 503 and closed; a closed one frees its place", async () => {
  const { handler } = echo();
  await using http = listen(handler, { maxConnections: 2 });
  const a = await http.connect(), b = await http.connect();
  // Accepted in order: a and b hold both places when the third arrives.
  const third = await http.connect();
  assert.match(await readToClose(third), /^HTTP\/1\.1 503 Service Unavailable\r\n[\s\S]*too many connections/);
  // The server drops a's place before it closes a, so once a is closed there is room again.
  await send(a, head("GET", "/a", { connection: "close" }));
  assert.match(await readToClose(a), /^HTTP\/1\.1 200 /);
  const fourth = await http.connect();
  await send(fourth, head("GET", "/d", { connection: "close" }));
  assert.match(await readToClose(fourth), /^HTTP\/1\.1 200 [\s\S]*GET \/d $/);
  b.close();
});

Deno.test("malformed heads: answered 400 (411, 431) and closed; the handler never sees them", async () => {
  const { seen, handler } = echo();
  await using http = listen(handler, { maxHeadBytes: 1024 });
  const cases: [string, string, RegExp][] = [
    ["not a request line", "GARBAGE\r\n\r\n", /^HTTP\/1\.1 400 [\s\S]*malformed request line/],
    ["a lowercase method", "get / HTTP/1.1\r\n\r\n", /^HTTP\/1\.1 400 [\s\S]*malformed request line/],
    ["HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", /^HTTP\/1\.1 400 [\s\S]*malformed request line/],
    [
      "a header line without a colon",
      "GET / HTTP/1.1\r\nno colon here\r\n\r\n",
      /^HTTP\/1\.1 400 [\s\S]*malformed header line/,
    ],
    [
      "a space in a header name",
      "GET / HTTP/1.1\r\nbad name: x\r\n\r\n",
      /^HTTP\/1\.1 400 [\s\S]*malformed header line/,
    ],
    [
      "a header line starting with a colon",
      "GET / HTTP/1.1\r\n: x\r\n\r\n",
      /^HTTP\/1\.1 400 [\s\S]*malformed header line/,
    ],
    [
      "a content-length that is not a number",
      head("POST", "/", { "content-length": "12abc" }),
      /^HTTP\/1\.1 400 [\s\S]*malformed content-length/,
    ],
    ["a chunked body", head("POST", "/", { "transfer-encoding": "chunked" }), /^HTTP\/1\.1 411 [\s\S]*content-length/],
    ["a head over the limit", head("GET", "/", { "x-pad": "a".repeat(2000) }), /^HTTP\/1\.1 431 [\s\S]*too large/],
    ["a head over the limit, unended", `GET /${"a".repeat(2000)}`, /^HTTP\/1\.1 431 [\s\S]*too large/],
  ];
  for (const [what, bytes, answer] of cases) {
    const conn = await http.connect();
    await send(conn, bytes);
    const text = await readToClose(conn);
    assert.match(text, answer, what);
    assert.match(text, /connection: close\r\n/, `${what}: closed`);
  }
  assert.deepEqual(seen, []);
});

Deno.test("Expect: 100-continue: 100 Continue once the handler reads the body, then its answer; none when it answers first", async () => {
  const refused: string[] = [];
  await using http = listen(async (req) => {
    if (req.headers.get("authorization") !== "Bearer key") {
      refused.push(new URL(req.url).pathname);
      return new Response("no key", { status: 401 });
    }
    return new Response(`got ${await req.text()}`);
  });
  const body = "x".repeat(2048);
  const conn = await http.connect();
  await send(
    conn,
    head("POST", "/upload", { authorization: "Bearer key", expect: "100-continue", "content-length": "2048" }),
  );
  const interim = new Uint8Array(64);
  const n = await within("100 Continue", conn.read(interim));
  assert.equal(dec.decode(interim.subarray(0, n ?? 0)), "HTTP/1.1 100 Continue\r\n\r\n");
  await send(conn, body);
  const answer = await readResponse(conn);
  assert.equal(answer.status, 200);
  assert.equal(answer.body, `got ${body}`);
  conn.close();
  // Refused before the body was asked for: the answer comes first, no 100, and the connection
  // closes (the unread body would be taken for the next request).
  const refusedConn = await http.connect();
  await send(refusedConn, head("POST", "/upload", { expect: "100-continue", "content-length": "2048" }));
  const text = await readToClose(refusedConn);
  assert.match(text, /^HTTP\/1\.1 401 Unauthorized\r\n[\s\S]*connection: close\r\n[\s\S]*no key$/);
  assert.deepEqual(refused, ["/upload"]);
});

Deno.test("shutdown: closes an idle kept-alive connection, and a busy one after its answer", async () => {
  const entered = Promise.withResolvers<void>();
  const release = Promise.withResolvers<void>();
  await using http = listen(async (req) => {
    if (new URL(req.url).pathname === "/slow") {
      entered.resolve();
      await release.promise;
    }
    return new Response("done");
  });
  const idle = await http.connect();
  await send(idle, head("GET", "/quick"));
  assert.equal((await readResponse(idle)).body, "done");
  const busy = await http.connect();
  await send(busy, head("GET", "/slow"));
  await within("the slow request handled", entered.promise);
  const finished = http.server.shutdown();
  assert.equal(await readToClose(idle), "", "the idle connection closed without a word");
  release.resolve();
  assert.match(await readToClose(busy), /^HTTP\/1\.1 200 OK\r\n[\s\S]*connection: close\r\n[\s\S]*done$/);
  await within("shutdown finished", finished);
  assert.equal(http.server.connections, 0);
  await assert.rejects(http.connect(), "no longer listening");
});
