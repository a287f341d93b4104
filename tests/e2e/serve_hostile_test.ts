/**
 * `k3 serve`'s HTTP side under a hostile network and careless clients, in process on the
 * tiny model (the real scheduler behind a probe that records, for each sequence, how many
 * tokens it had when its signal aborted): a client that closes frees its slot within one
 * pass whatever the request's shape (body in its own TCP segment, streamed or not, a
 * kept-alive connection, the official SDK's aborted call); unauthenticated odd paths
 * leave /metrics and memory bounded; slow clients are cut off at the timeouts; a foreign
 * Host or a cross-origin POST starts no generation; the small protocol items; the SDK's
 * `models.retrieve` and `responses.create`; internal errors are one line with an id.
 *
 * One test: the model is opened and the server started once, each check is a step on its
 * own (it counts from what it finds, never from what an earlier step left), and the server
 * and the model are closed in a finally.
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import OpenAI from "openai";
import { openModel, readModelConfig } from "../../engine/open.ts";
import { Scheduler, type SequenceRequest } from "../../engine/generate/scheduler.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { type RunningServer, type ServeEngine, type ServerOptions, startServer } from "../../cli/server/http.ts";
import { TINY } from "../helpers.ts";

const KEY = "hostile-key-0123";
const PARALLEL = 2;
const CONTEXT = 1024;
const auth = { authorization: `Bearer ${KEY}` };
/** A step leaves the shared server's connections and the SDK's kept-alive sockets open for the
 * next one; the test itself checks that everything is closed once the server is stopped. */
const STEP_SANITIZERS = { sanitizeOps: false, sanitizeResources: false };

/** What the probe saw of each finished sequence. */
interface Seen {
  tokens: number;
  /** Tokens generated when its signal aborted (-1: never aborted). */
  atAbort: number;
  finish: string;
}

/** Counts submissions, measures aborts and resolves a hook at each sequence's 2nd token. */
class Probe {
  submitted = 0;
  seen: Seen[] = [];
  /** Resolved at the next sequence's 2nd token (generation is under way). */
  onSecondToken: (() => void)[] = [];
  second(): Promise<void> {
    return new Promise((r) => this.onSecondToken.push(r));
  }
}

/** The tiny model behind the real scheduler and a probe, served on loopback with a key. */
async function startHostile() {
  const config = await readModelConfig(TINY);
  const opened = await openModel(config, { capacity: CONTEXT, chunk: 16, sequences: PARALLEL, threads: 1 });
  const real = new Scheduler(opened.model, { maxSequences: PARALLEL });
  const probe = new Probe();
  /** The real scheduler behind the probe. */
  const scheduler: ServeEngine["scheduler"] = {
    get queued() {
      return real.queued;
    },
    get active() {
      return real.active;
    },
    async submit(req: SequenceRequest) {
      probe.submitted++;
      let n = 0, atAbort = -1;
      req.signal?.addEventListener("abort", () => (atAbort = n));
      const result = await real.submit({
        ...req,
        onToken: (t, logits) => {
          if (++n === 2) { for (const r of probe.onSecondToken.splice(0)) r(); }
          return req.onToken?.(t, logits);
        },
      });
      probe.seen.push({ tokens: result.tokens.length, atAbort, finish: result.finishReason });
      return result;
    },
  };
  const engine: ServeEngine = {
    scheduler,
    tokenizer: Tokenizer.load(TINY),
    capacity: CONTEXT,
    vocabSize: config.cfg.vocabSize,
    bytesRead: () => 0,
  };
  const logs: string[] = [];
  const server = startServer({
    hostname: "127.0.0.1",
    port: 0,
    modelName: "tiny",
    apiKey: KEY,
    parallel: PARALLEL,
    maxQueue: 4,
    maxBodyBytes: 1 << 20,
    log: (l) => logs.push(l),
    fingerprint: "fp_test",
  });
  server.ready(engine);
  const base = `http://127.0.0.1:${server.addr.port}`;
  return {
    probe,
    scheduler,
    engine,
    logs,
    server,
    base,
    client: new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 }),
    async close() {
      await server.shutdown(0);
      await real.close();
      await opened.close();
    },
  };
}

/** The shared server and what watches it, as each step gets it. */
type Hostile = Awaited<ReturnType<typeof startHostile>>;

const enc = new TextEncoder();
const dec = new TextDecoder();
const LONG = { max_tokens: 600, ignore_eos: true, temperature: 0 };
const CHAT = { messages: [{ role: "user" as const, content: "What is the capital of France?" }] };

/** A value of `srv`'s /metrics (the first series of that name). */
async function metric(srv: RunningServer, name: string): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${srv.addr.port}/metrics`, { headers: auth })).text();
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(text);
  assert.ok(m, `${name} in /metrics`);
  return Number(m[1]);
}

/** A request head (and body) as raw HTTP/1.1 bytes, to the server on `port`. */
function requestBytes(port: number, method: string, path: string, body: string, headers: Record<string, string> = {}) {
  const h = {
    host: `127.0.0.1:${port}`,
    "content-type": "application/json",
    ...auth,
    ...headers,
    ...(body ? { "content-length": String(enc.encode(body).length) } : {}),
  };
  const head = `${method} ${path} HTTP/1.1\r\n${
    Object.entries(h).filter(([, v]) => v !== "").map(([k, v]) => `${k}: ${v}\r\n`).join("")
  }\r\n`;
  return { head: enc.encode(head), body: enc.encode(body) };
}

/**
 * Sends a request on `conn`; `split`: the body goes in its own TCP segment, 50 ms after
 * the head (the gap is the shape of the input that once hid a client's close, not a wait
 * for the server).
 */
async function send(conn: Deno.TcpConn, method: string, path: string, body: string, split: boolean, headers = {}) {
  conn.setNoDelay(true);
  const { head, body: b } = requestBytes((conn.remoteAddr as Deno.NetAddr).port, method, path, body, headers);
  if (split) {
    await conn.write(head);
    await new Promise((r) => setTimeout(r, 50));
    await conn.write(b);
  } else {
    const all = new Uint8Array(head.length + b.length);
    all.set(head);
    all.set(b, head.length);
    await conn.write(all);
  }
}

/** Reads one response with a content-length body (keep-alive safe). */
async function readResponse(conn: Deno.Conn): Promise<{ status: number; head: string; body: string }> {
  let buf = new Uint8Array(0);
  const more = async () => {
    const chunk = new Uint8Array(65536);
    const n = await conn.read(chunk);
    if (n === null) throw new Error(`connection closed after ${dec.decode(buf)}`);
    const next = new Uint8Array(buf.length + n);
    next.set(buf);
    next.set(chunk.subarray(0, n), buf.length);
    buf = next;
  };
  while (!dec.decode(buf).includes("\r\n\r\n")) await more();
  const text = dec.decode(buf);
  const headEnd = text.indexOf("\r\n\r\n") + 4;
  const head = text.slice(0, headEnd);
  const length = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
  while (buf.length < enc.encode(head).length + length) await more();
  return { status: Number(head.split(" ")[1]), head, body: dec.decode(buf.subarray(enc.encode(head).length)) };
}

/** Everything the server writes until it closes the connection. */
async function readAll(conn: Deno.Conn): Promise<string> {
  let out = "";
  const chunk = new Uint8Array(65536);
  try {
    for (let n = await conn.read(chunk); n !== null; n = await conn.read(chunk)) {
      out += dec.decode(chunk.subarray(0, n));
    }
  } catch { /* reset: the end too */ }
  return out;
}

/** The last sequence the probe saw ended within one pass of its client going away. */
function freedWithinOnePass(probe: Probe, what: string): void {
  const s = probe.seen.at(-1)!;
  assert.equal(s.finish, "interrupted", what);
  assert.ok(s.atAbort >= 2, `${what}: aborted while generating (${s.atAbort})`);
  assert.ok(s.tokens - s.atAbort <= 1, `${what}: ${s.tokens - s.atAbort} tokens after the client left`);
  assert.ok(s.tokens < LONG.max_tokens, what);
}

/** The checks, each a step of the one test below, each on its own: none reads what another left. */
const STEPS: { name: string; fn: (fx: Hostile) => Promise<void> }[] = [];

/** Declares a check (run in the order declared, but needing no order). */
function step(name: string, fn: (fx: Hostile) => Promise<void>): void {
  STEPS.push({ name, fn });
}

for (const stream of [false, true]) {
  for (const split of [true, false]) {
    step(
      `client gone: ${stream ? "streamed" : "non-streamed"}, body ${
        split ? "in its own segment" : "with the head"
      }, closed mid-generation: its slot is free within one pass, counted as a disconnect, not a 5xx`,
      async ({ server, probe, logs }) => {
        const gone0 = await metric(server, "k3_client_disconnects_total");
        const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
        const started = probe.second();
        await send(conn, "POST", "/v1/chat/completions", JSON.stringify({ ...CHAT, ...LONG, stream }), split);
        await started;
        conn.close();
        await server.idle();
        freedWithinOnePass(probe, `stream ${stream} split ${split}`);
        assert.equal(await metric(server, "k3_sequences_in_flight"), 0);
        assert.equal(await metric(server, "k3_client_disconnects_total"), gone0 + 1);
        assert.equal(await metric(server, "k3_internal_errors_total"), 0);
        const line = logs.findLast((l) => l.includes("POST /v1/chat/completions"))!;
        assert.match(line, / 499 .*finish interrupted$/);
        assert.ok(!logs.some((l) => /internal error|\n\s+at /.test(l)), logs.join("\n"));
      },
    );
  }
}

step(
  "client gone: the second request of a kept-alive connection, body split, then closed: freed",
  async ({ server, probe }) => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
    await send(conn, "POST", "/v1/chat/completions", JSON.stringify({ ...CHAT, max_tokens: 2 }), true);
    const first = await readResponse(conn);
    assert.equal(first.status, 200, first.body);
    assert.match(first.head, /connection: keep-alive/);
    const started = probe.second();
    await send(conn, "POST", "/v1/chat/completions", JSON.stringify({ ...CHAT, ...LONG }), true);
    await started;
    conn.close();
    await server.idle();
    freedWithinOnePass(probe, "keep-alive");
  },
);

step(
  "client gone: the official SDK's aborted non-streamed call frees its slot within one pass",
  async ({ server, probe, client }) => {
    const ac = new AbortController();
    const started = probe.second();
    const call = client.chat.completions.create(
      // @ts-expect-error: vLLM's extension, passed through by the SDK
      { model: "tiny", ...CHAT, ...LONG, ignore_eos: true },
      { signal: ac.signal },
    );
    await started;
    ac.abort();
    await assert.rejects(call, (e: unknown) => e instanceof OpenAI.APIUserAbortError);
    await server.idle();
    freedWithinOnePass(probe, "SDK abort");
  },
);

step(
  "bounded: 2,000 unauthenticated 8 kB paths leave /metrics's labels and the log lines bounded (memory: serve_memory_test.ts)",
  async ({ probe, logs, base }) => {
    const before = await (await fetch(`${base}/metrics`, { headers: auth })).text();
    const logged = logs.length;
    const submitted = probe.submitted;
    for (let i = 0; i < 2000; i++) {
      const path = `/v1/${i}-${"\u00e9x\u0007%0a".repeat(620)}`;
      const r = await fetch(`${base}${path}`, { method: i % 2 ? "POST" : "GET", body: i % 2 ? "{}" : undefined });
      assert.equal(r.status, 401);
      assert.match(r.headers.get("www-authenticate") ?? "", /^Bearer/);
      await r.body?.cancel();
    }
    const after = await (await fetch(`${base}/metrics`, { headers: auth })).text();
    const labels = (t: string) => [...t.matchAll(/^k3_requests_total\{([^}]*)\}/gm)].map((m) => m[1]);
    assert.ok(labels(after).length <= labels(before).length + 1, labels(after).join("\n"));
    assert.ok(labels(after).includes('endpoint="other",status="401"'));
    assert.ok(after.length < before.length + 200, `${before.length} -> ${after.length}`);
    const lines = logs.slice(logged).filter((l) => !l.includes("GET /metrics"));
    assert.equal(lines.length, 2000);
    for (const l of lines) {
      assert.ok(l.length < 400, l.slice(0, 100));
      assert.match(l, /^[\x20-\x7e]*$/);
    }
    assert.equal(probe.submitted, submitted);
  },
);

/** Another server on loopback (one slot, one waiting, no log) with `opts` over that. */
function another(opts: Partial<ServerOptions>): RunningServer {
  return startServer({
    hostname: "127.0.0.1",
    port: 0,
    modelName: "tiny",
    parallel: 1,
    maxQueue: 1,
    maxBodyBytes: 1 << 16,
    log: () => {},
    ...opts,
  });
}

/** A second server on `engine` with short timeouts and a small connection cap. */
function strictServer(engine: ServeEngine, extra: Parameters<typeof startServer>[0]["limits"] = {}) {
  const s = another({
    parallel: PARALLEL,
    maxQueue: 4,
    maxBodyBytes: 1 << 20,
    limits: { headerTimeoutSeconds: 0.3, bodyTimeoutSeconds: 0.3, idleTimeoutSeconds: 0.3, ...extra },
  });
  s.ready(engine);
  return s;
}

step(
  "slow clients are cut off: a head, a body, an idle keep-alive past their timeouts; a cap on connections",
  async ({ engine }) => {
    const s = strictServer(engine);
    const port = s.addr.port;
    const open = () => Deno.connect({ hostname: "127.0.0.1", port });
    // A head that never ends.
    let c = await open();
    await c.write(enc.encode("POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"));
    assert.match(await readAll(c), /^HTTP\/1\.1 408 /);
    c.close();
    // A body that never ends: 10 of 100 bytes.
    c = await open();
    await c.write(
      enc.encode(
        `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"message`,
      ),
    );
    const cut = await readAll(c);
    assert.match(cut, /^HTTP\/1\.1 408 /);
    assert.match(cut, /"code":"timeout"/);
    c.close();
    // A kept-alive connection left idle is closed.
    c = await open();
    await c.write(enc.encode(`GET /health HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\n\r\n`));
    assert.match(await readAll(c), /^HTTP\/1\.1 200 [\s\S]*\{"status":"ok"\}$/);
    c.close();
    await s.shutdown(0);

    const capped = strictServer(engine, { maxConnections: 2, headerTimeoutSeconds: 30 });
    const a = await Deno.connect({ hostname: "127.0.0.1", port: capped.addr.port });
    const b = await Deno.connect({ hostname: "127.0.0.1", port: capped.addr.port });
    const third = await Deno.connect({ hostname: "127.0.0.1", port: capped.addr.port });
    assert.match(await readAll(third), /^HTTP\/1\.1 503 [\s\S]*too many connections/);
    for (const x of [a, b, third]) x.close();
    await capped.shutdown(0);
  },
);

step(
  "Expect: 100-continue (curl, bodies over 1 kB): 100 Continue once the key is checked, then the answer",
  async ({ server }) => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
    const { head, body } = requestBytes(
      server.addr.port,
      "POST",
      "/v1/chat/completions",
      JSON.stringify({ ...CHAT, max_tokens: 1 }),
      {
        expect: "100-continue",
      },
    );
    await conn.write(head);
    const interim = new Uint8Array(64);
    const n = await conn.read(interim);
    assert.equal(dec.decode(interim.subarray(0, n ?? 0)), "HTTP/1.1 100 Continue\r\n\r\n");
    await conn.write(body);
    const res = await readResponse(conn);
    assert.equal(res.status, 200, res.body);
    conn.close();
  },
);

step("a 200,000-character chat message is a 400 context_length_exceeded", async ({ base }) => {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { ...auth, "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: "word ".repeat(40000) }] }),
  });
  const body = await r.json();
  assert.equal(r.status, 400, JSON.stringify(body));
  assert.equal(body.error.code, "context_length_exceeded");
});

/** Sends raw bytes to `srv` and reads the answer to the close. */
async function rawExchange(
  srv: RunningServer,
  method: string,
  path: string,
  body: string,
  headers: Record<string, string>,
) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: srv.addr.port });
  await send(conn, method, path, body, false, { connection: "close", ...headers });
  const text = await readAll(conn);
  conn.close();
  return { status: Number(text.split(" ")[1]), text };
}

step(
  "browsers: a foreign Host (421), a cross-origin POST (403), a text/plain body (415) start no generation",
  async ({ server, probe }) => {
    const submitted = probe.submitted;
    const body = JSON.stringify({ ...CHAT, max_tokens: 1 });
    const cases: [Record<string, string>, number][] = [
      [{ host: "evil.example" }, 421],
      [{ host: `rebind.example:${server.addr.port}` }, 421],
      [{ origin: "https://evil.example" }, 403],
      [{ "sec-fetch-site": "cross-site" }, 403],
      [{ "content-type": "text/plain;charset=UTF-8" }, 415],
      [{ "content-type": "multipart/form-data; boundary=x" }, 415],
      [{ authorization: "", "content-type": "text/plain", origin: "https://evil.example" }, 401],
    ];
    for (const [headers, status] of cases) {
      const r = await rawExchange(server, "POST", "/v1/chat/completions", body, headers);
      assert.equal(r.status, status, `${JSON.stringify(headers)}: ${r.text}`);
    }
    assert.equal(probe.submitted, submitted);
    // Loopback names and a same-origin page are served.
    for (const host of ["localhost", `localhost:${server.addr.port}`, `127.0.0.1:${server.addr.port}`]) {
      const r = await rawExchange(server, "POST", "/v1/chat/completions", body, {
        host,
        origin: `http://${host}`,
        "sec-fetch-site": "same-origin",
      });
      assert.equal(r.status, 200, r.text);
    }
    // --allowed-host and an explicit --host.
    for (const opts of [{ allowedHosts: ["k3.lan"] }, { hostExplicit: true }]) {
      const s = another({
        ...opts,
      });
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: s.addr.port });
      await conn.write(enc.encode("GET /health HTTP/1.1\r\nhost: k3.lan:8000\r\nconnection: close\r\n\r\n"));
      assert.match(await readAll(conn), /^HTTP\/1\.1 503 /, JSON.stringify(opts));
      conn.close();
      await s.shutdown(0);
    }
  },
);

step(
  "--cors: the preflight allows the official SDK's x-stainless-* headers; that origin's POST is served",
  async ({ engine }) => {
    const origin = "https://app.example";
    const s = another({
      apiKey: KEY,
      cors: origin,
    });
    s.ready(engine);
    const url = `http://127.0.0.1:${s.addr.port}/v1/chat/completions`;
    const asked = "authorization, content-type, x-stainless-os, x-stainless-retry-count, x-stainless-timeout";
    const pre = await fetch(url, {
      method: "OPTIONS",
      headers: { origin, "access-control-request-method": "POST", "access-control-request-headers": asked },
    });
    await pre.body?.cancel();
    assert.equal(pre.status, 204);
    assert.equal(pre.headers.get("access-control-allow-origin"), origin);
    const allowed = new Set(pre.headers.get("access-control-allow-headers")!.split(", "));
    for (const h of asked.split(", ")) assert.ok(allowed.has(h), h);
    const post = await fetch(url, {
      method: "POST",
      headers: { origin, ...auth, "content-type": "application/json" },
      body: JSON.stringify({ ...CHAT, max_tokens: 1 }),
    });
    assert.equal(post.status, 200);
    assert.equal(post.headers.get("access-control-allow-origin"), origin);
    await post.body?.cancel();
    const other = await fetch(url, {
      method: "POST",
      headers: { origin: "https://evil.example", ...auth, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(other.status, 403);
    await other.body?.cancel();
    await s.shutdown(0);
  },
);

step(
  "small items: bearer in any case, Allow on 405, HEAD /health, Retry-After while loading, response_format text",
  async ({ server, base, client }) => {
    const lower = await fetch(`${base}/v1/models`, { headers: { authorization: `bearer ${KEY}` } });
    assert.equal(lower.status, 200);
    await lower.body?.cancel();
    const m405 = await fetch(`${base}/v1/chat/completions`, { headers: auth });
    assert.equal(m405.status, 405);
    assert.equal(m405.headers.get("allow"), "POST");
    await m405.body?.cancel();
    const head = await rawExchange(server, "HEAD", "/health", "", {});
    assert.equal(head.status, 200);
    assert.match(head.text, /content-length: 15\r\n/);
    assert.ok(head.text.endsWith("\r\n\r\n"), "no body after a HEAD");
    const loading = another({});
    for (const [method, path] of [["GET", "/health"], ["POST", "/v1/chat/completions"]]) {
      const r = await fetch(`http://127.0.0.1:${loading.addr.port}${path}`, {
        method,
        headers: { "content-type": "application/json" },
        body: method === "POST" ? "{}" : undefined,
      });
      assert.equal(r.status, 503);
      assert.ok(Number(r.headers.get("retry-after")) > 0);
      await r.body?.cancel();
    }
    await loading.shutdown(0);
    const text = await client.chat.completions.create({
      model: "tiny",
      ...CHAT,
      max_tokens: 2,
      response_format: { type: "text" },
    } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    assert.equal(text.object, "chat.completion");
    assert.equal((text as unknown as { system_fingerprint: string }).system_fingerprint, "fp_test");
    assert.equal(typeof text.usage?.completion_tokens_details?.reasoning_tokens, "number");
    await assert.rejects(
      () =>
        client.chat.completions.create({
          model: "tiny",
          ...CHAT,
          max_tokens: 2,
          // json_object and json_schema are enforced (structured output); a keyword outside
          // the subset is still a 400.
          response_format: {
            type: "json_schema",
            json_schema: { name: "x", schema: { type: "array", uniqueItems: true } },
          },
        }),
      (e: unknown) => e instanceof OpenAI.BadRequestError,
    );
  },
);

step("the SDK: models.retrieve; responses.create (whole and streamed) equals the chat answer", async ({ client }) => {
  const m = await client.models.retrieve("tiny");
  assert.deepEqual([m.id, m.object, m.owned_by], ["tiny", "model", "k3"]);
  await assert.rejects(() => client.models.retrieve("other"), (e: unknown) => e instanceof OpenAI.NotFoundError);
  const question = CHAT.messages[0].content;
  const chat = await client.chat.completions.create({ model: "tiny", ...CHAT, max_tokens: 24, temperature: 0 });
  const msg = chat.choices[0].message as typeof chat.choices[0]["message"] & { reasoning_content: string };
  const r = await client.responses.create({ model: "tiny", input: question, max_output_tokens: 24, temperature: 0 });
  assert.equal(r.object, "response");
  assert.match(r.id, /^resp_/);
  assert.equal(r.output_text, msg.content);
  const reasoning = r.output.find((o) => o.type === "reasoning");
  assert.equal(
    (reasoning as { content?: { text: string }[] } | undefined)?.content?.[0].text ?? "",
    msg.reasoning_content ?? "",
  );
  assert.equal(r.status, chat.choices[0].finish_reason === "length" ? "incomplete" : "completed");
  assert.equal(r.usage?.output_tokens, chat.usage?.completion_tokens);
  assert.equal(r.usage?.input_tokens, chat.usage?.prompt_tokens);
  assert.equal(
    r.usage?.output_tokens_details.reasoning_tokens,
    chat.usage?.completion_tokens_details?.reasoning_tokens,
  );

  const stream = await client.responses.create({
    model: "tiny",
    input: [{ role: "user", content: [{ type: "input_text", text: question }] }],
    max_output_tokens: 24,
    temperature: 0,
    stream: true,
  });
  let text = "", last: OpenAI.Responses.Response | undefined, seq = -1;
  for await (const ev of stream) {
    assert.equal(ev.sequence_number, seq + 1);
    seq = ev.sequence_number;
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") last = ev.response;
  }
  assert.equal(text, msg.content);
  assert.ok(last);
  assert.deepEqual(
    last.output,
    r.output.map((o) => ({ ...o, id: (last!.output.find((x) => x.type === o.type))!.id })),
  );
  await assert.rejects(
    () => client.responses.create({ model: "tiny", input: "x", previous_response_id: "resp_1" }),
    // No stored response of that id: 404, as OpenAI answers.
    (e: unknown) => e instanceof OpenAI.NotFoundError,
  );
});

step(
  "errors: an internal failure is one log line with an id and a 500 naming it; fuzzed requests never reach it",
  async ({ server, base, engine, scheduler }) => {
    const failing: ServeEngine = {
      ...engine,
      scheduler: { ...scheduler, submit: () => Promise.reject(new Error("boom\n    at somewhere (x.ts:1:1)")) },
    };
    const lines: string[] = [];
    const s = another({
      log: (l) => lines.push(l),
    });
    s.ready(failing);
    const r = await fetch(`http://127.0.0.1:${s.addr.port}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...CHAT, max_tokens: 2 }),
    });
    assert.equal(r.status, 500);
    const id = /internal error (err-[0-9a-f]{24})/.exec((await r.json()).error.message)?.[1];
    assert.ok(id);
    const mentions = lines.filter((l) => l.includes(id));
    assert.equal(mentions.length, 1, lines.join("\n"));
    assert.doesNotMatch(mentions[0], /\n/);
    assert.equal(await metric(s, "k3_internal_errors_total"), 1);
    await s.shutdown(0);

    const json = fc.jsonValue({ maxDepth: 3 });
    const bodies = fc.oneof(
      json.map((v) => JSON.stringify(v)),
      fc.record({
        messages: fc.array(fc.record({ role: fc.string(), content: json })),
        max_tokens: fc.oneof(fc.integer(), json),
      })
        .map((v) => JSON.stringify(v)),
      fc.record({
        input: json,
        max_output_tokens: fc.integer({ min: -2, max: 3 }),
        stream: fc.boolean(),
        text: json,
        reasoning: json,
      })
        .map((v) => JSON.stringify(v)),
      fc.string(),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom("/v1/chat/completions", "/v1/completions", "/v1/responses"),
        bodies,
        async (path, body) => {
          const res = await fetch(`${base}${path}`, {
            method: "POST",
            headers: { ...auth, "content-type": "application/json" },
            body,
          });
          await res.body?.cancel();
          assert.ok(res.status < 500, `${path} ${body}: ${res.status}`);
        },
      ),
      { seed: 21, numRuns: 300 },
    );
    await server.idle();
    assert.equal(await metric(server, "k3_internal_errors_total"), 0);
  },
);

Deno.test({
  name: "k3 serve on the tiny model under a hostile network and careless clients",
  fn: async (t) => {
    const fx = await startHostile();
    try {
      for (const { name, fn } of STEPS) await t.step({ name, ...STEP_SANITIZERS, fn: () => fn(fx) });
    } finally {
      await fx.close();
    }
  },
});
