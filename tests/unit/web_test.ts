/**
 * The chat page's parts that run without a browser: the Markdown renderer's sanitising
 * (cli/web/markdown.js), the page's files as served (every file of cli/web/, under 200 kB,
 * with headers that forbid framing), the status hub's events and what each API key sees of
 * them (cli/server/status.ts), and the same-origin rule on the status stream. The page in a
 * real browser: tests/e2e/web_test.ts.
 */

import assert from "node:assert/strict";
import { renderMarkdown } from "../../cli/web/markdown.js";
import { PAGE_HEADERS, webAssets } from "../../cli/server/web.ts";
import { memoryParts, type PassEvent, type StatusEvent, StatusHub } from "../../cli/server/status.ts";
import { checkSameOrigin } from "../../cli/server/guard.ts";
import { type ServeEngine, startServer } from "../../cli/server/http.ts";
import { newLedger } from "../../engine/model/ledger.ts";
import type { LedgerMark } from "../../engine/generate/ledger.ts";
import type { MemoryPlan } from "../../engine/weights/plan.ts";
import { noIoStats } from "../../engine/model/weight_source.ts";
import { ApiError } from "../../cli/openai_error.ts";
import { ROOT } from "../helpers.ts";

Deno.test("markdown: every character escaped first; code, emphasis, lists, http(s) links only", () => {
  assert.equal(renderMarkdown("<script>alert(1)</script>"), "<p>&#60;script&#62;alert(1)&#60;/script&#62;</p>");
  assert.equal(
    renderMarkdown('<img src=x onerror="alert(1)">'),
    "<p>&#60;img src=x onerror=&#34;alert(1)&#34;&#62;</p>",
  );
  assert.equal(renderMarkdown("[a](javascript:alert(1))"), "<p>[a](javascript:alert(1))</p>");
  assert.equal(
    renderMarkdown('[a](https://x.org/"onmouseover=1)'),
    '<p><a href="https://x.org/&#34;onmouseover=1" rel="noopener noreferrer nofollow" target="_blank">a</a></p>',
  );
  assert.equal(
    renderMarkdown("**b** and *i* and `<b>`"),
    "<p><strong>b</strong> and <em>i</em> and <code>&#60;b&#62;</code></p>",
  );
  assert.equal(renderMarkdown("```js\nif (a < b) {}\n```"), '<pre data-lang="js"><code>if (a &#60; b) {}</code></pre>');
  assert.equal(renderMarkdown("```\nstill streaming"), "<pre><code>still streaming</code></pre>");
  assert.equal(renderMarkdown("- one\n- two\n\n1. first"), "<ul><li>one</li><li>two</li></ul><ol><li>first</li></ol>");
  assert.equal(renderMarkdown("a\nb\n\nc"), "<p>a<br>b</p><p>c</p>");
});

Deno.test("the page: every file of cli/web/ is served, under 200 kB, its references resolve, never framed", async () => {
  const files = [...Deno.readDirSync(`${ROOT}/cli/web`)].map((e) => e.name).sort();
  const served = [...webAssets().keys()].map((p) => (p === "/" ? "index.html" : p.slice("/web/".length))).sort();
  assert.deepEqual(served, files);
  let bytes = 0;
  for (const f of files) {
    const text = await Deno.readTextFile(`${ROOT}/cli/web/${f}`);
    assert.equal(webAssets().get(f === "index.html" ? "/" : `/web/${f}`)!.body, text, f);
    bytes += new TextEncoder().encode(text).length;
  }
  assert.ok(bytes < 200_000, `${bytes} bytes of page assets`);
  // What the page loads (src, href, import) is all served: nothing from elsewhere.
  const refs = [...webAssets().values()].flatMap((a) =>
    [...a.body.matchAll(/(?:src|href)="(\/[^"]*)"|from "\.\/([\w.]+)"/g)].map((m) => m[1] ?? `/web/${m[2]}`)
  );
  assert.ok(refs.length >= 5, refs.join(" "));
  for (const r of refs) assert.ok(webAssets().has(r), `${r} is served`);
  assert.match(PAGE_HEADERS["content-security-policy"], /frame-ancestors 'none'/);
  assert.match(PAGE_HEADERS["content-security-policy"], /connect-src 'self'/);
});

/** A plan with the fields the bar reads. */
const PLAN = {
  mode: "streamed",
  trunk: { pinnedBytes: 10, ringBytes: 20 },
  experts: { resident: false, bytes: 30 },
  stateCache: { bytes: 40 },
  state: { bytes: 50 },
  speculation: { bytes: 5 },
  totalBytes: 200,
  availableBytes: 1000,
} as unknown as MemoryPlan;

Deno.test("the memory bar: the plan's parts in order, the rest as other, then free", () => {
  assert.deepEqual(memoryParts(PLAN).parts, [
    { name: "trunk pinned", bytes: 10 },
    { name: "ring", bytes: 20 },
    { name: "expert cache", bytes: 30 },
    { name: "state cache", bytes: 40 },
    { name: "sequence states", bytes: 55 },
    { name: "other", bytes: 45 },
    { name: "free", bytes: 800 },
  ]);
});

Deno.test("the status hub: pass events from the ledger; a key sees its own sequences' details only", async () => {
  let mark: LedgerMark = { at: 0, ledger: newLedger(), io: noIoStats(), readBytes: 0, readBusySeconds: 0 };
  const hub = new StatusHub({ plan: PLAN, mark: () => mark, queue: () => ({ queued: 1, active: 2 }) });
  const got = new Map<string, { event: string; data: unknown }[]>([["key-a", []], ["key-b", []]]);
  for (const [owner, events] of got) hub.subscribe(owner, (event, data) => events.push({ event, data }));
  const a = hub.watch("chatcmpl-a", "key-a", 100);
  const b = hub.watch("chatcmpl-b", "key-b", 7);
  a.admitted();
  b.admitted();
  // One pass: a reads prompt tokens, b gets its first token; the ledger moved.
  const ledger = { ...newLedger(), trunkReadWait: 0.5, expertReadWait: 0.25, denseMatmul: 1, expertCompute: 2 };
  mark = {
    at: 4000,
    ledger,
    io: { ...noIoStats(), trunkBytes: 3e9, expertBytes: 1e9, expertHits: 9, expertMisses: 4 },
    readBytes: 4e9,
    readBusySeconds: 1,
  };
  hub.onPass({ rows: 9, sequences: 2, seconds: 4 });
  a.prefill(8, 100);
  b.token();
  await Promise.resolve();
  const passOf = (owner: string) => got.get(owner)!.filter((e) => e.event === "pass").map((e) => e.data as PassEvent);
  const common = {
    pass: 1,
    rows: 9,
    seconds: 4,
    trunk_read_wait_seconds: 0.5,
    expert_read_wait_seconds: 0.25,
    compute_seconds: 3,
    trunk_bytes: 3e9,
    expert_bytes: 1e9,
    expert_hits: 9,
    expert_misses: 4,
    other_sequences: 1,
  };
  assert.deepEqual(passOf("key-a"), [{ ...common, tokens: [], prefill: [{ id: "chatcmpl-a", done: 8, total: 100 }] }]);
  assert.deepEqual(passOf("key-b"), [{ ...common, tokens: [{ id: "chatcmpl-b", index: 1 }], prefill: [] }]);
  const last = (owner: string) => got.get(owner)!.filter((e) => e.event === "status").at(-1)!.data as StatusEvent;
  assert.deepEqual(last("key-a").sequences.map((s) => [s.id, s.phase, s.prefilled]), [["chatcmpl-a", "prefill", 8]]);
  assert.equal(last("key-a").sequences[0].layer, null);
  assert.deepEqual(last("key-b").sequences.map((s) => [s.id, s.phase, s.generated]), [["chatcmpl-b", "decode", 1]]);
  assert.equal(last("key-a").other_sequences, 1);
  assert.equal(last("key-a").queued, 1);
  // Nothing of one key's sequences is in anything the other key was sent.
  assert.ok(!JSON.stringify(got.get("key-a")).includes("chatcmpl-b"));
  assert.ok(!JSON.stringify(got.get("key-b")).includes("chatcmpl-a"));
  b.end();
  assert.equal(last("key-a").other_sequences, 0);
  assert.equal(last("key-b").sequences.length, 0);
});

Deno.test("the status stream's origin rule: another origin is refused whatever the method", () => {
  const o = { hostname: "127.0.0.1", port: 8080, hostExplicit: false, allowedHosts: [] };
  const req = (headers: Record<string, string>) =>
    new Request("http://127.0.0.1:8080/v1/status/stream", { headers: { host: "127.0.0.1:8080", ...headers } });
  assert.throws(
    () => checkSameOrigin(req({ origin: "http://evil.example" }), o),
    (e) => (e as ApiError).status === 403,
  );
  assert.throws(() => checkSameOrigin(req({ "sec-fetch-site": "cross-site" }), o), ApiError);
  checkSameOrigin(req({ origin: "http://127.0.0.1:8080", "sec-fetch-site": "same-origin" }), o);
  checkSameOrigin(req({}), o);
  checkSameOrigin(req({ origin: "http://evil.example" }), { ...o, cors: "http://evil.example" });
});

Deno.test("k3 serve answers the page without a key, even while loading; the status stream wants the key", async () => {
  const server = startServer({
    hostname: "127.0.0.1",
    port: 0,
    modelName: "m",
    apiKey: "k",
    parallel: 1,
    maxQueue: 0,
    maxBodyBytes: 1024,
    log: () => {},
  });
  try {
    const base = `http://127.0.0.1:${server.addr.port}`;
    const page = await fetch(`${base}/`);
    assert.equal(page.status, 200);
    assert.match(page.headers.get("content-type")!, /^text\/html/);
    assert.match(page.headers.get("content-security-policy")!, /frame-ancestors 'none'/);
    assert.equal(page.headers.get("x-frame-options"), "DENY");
    assert.equal(await page.text(), webAssets().get("/")!.body);
    const js = await fetch(`${base}/web/app.js`);
    assert.match(js.headers.get("content-type")!, /^text\/javascript/);
    await js.body?.cancel();
    const missing = await fetch(`${base}/web/nope.js`);
    assert.equal(missing.status, 404);
    await missing.body?.cancel();
    const post = await fetch(`${base}/`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(post.status, 405);
    await post.body?.cancel();
    const status = await fetch(`${base}/v1/status/stream`);
    assert.equal(status.status, 401);
    await status.body?.cancel();
    const loading = await fetch(`${base}/v1/status/stream`, { headers: { authorization: "Bearer k" } });
    assert.equal(loading.status, 503);
    await loading.body?.cancel();
  } finally {
    await server.shutdown(0);
  }
});

Deno.test("the status stream lets go of a client that stops reading (no unbounded queue)", async () => {
  const mark: LedgerMark = { at: 0, ledger: newLedger(), io: noIoStats(), readBytes: 0, readBusySeconds: 0 };
  const hub = new StatusHub({ plan: PLAN, mark: () => mark, queue: () => ({ queued: 0, active: 0 }) });
  const server = startServer({
    hostname: "127.0.0.1",
    port: 0,
    modelName: "m",
    parallel: 1,
    maxQueue: 0,
    maxBodyBytes: 1024,
    log: () => {},
  });
  server.ready({ status: hub } as unknown as ServeEngine);
  const passes = 20_000;
  try {
    const res = await fetch(`http://127.0.0.1:${server.addr.port}/v1/status/stream`);
    assert.equal(res.status, 200);
    // Not read while the engine runs: its events pile up.
    for (let i = 0; i < passes; i++) {
      hub.onPass({ rows: 1, sequences: 1, seconds: 0.001 });
      await Promise.resolve();
    }
    // Read now: either the server ended the stream early, or every event is there.
    let sent = 0, buffered = "";
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    while (sent < passes) {
      // The server ends the stream either cleanly (its own backlog rule) or by closing the
      // connection (the transport's bound on unread output): both let go of the client.
      const r = await reader.read().catch(() => ({ done: true as const, value: undefined }));
      if (r.done) break;
      buffered += r.value;
      const blocks = buffered.split("\n\n");
      buffered = blocks.pop()!;
      sent += blocks.filter((b) => b.startsWith("event: pass\n")).length;
    }
    await reader.cancel().catch(() => {});
    assert.ok(sent > 0 && sent < passes, `${sent} of ${passes} pass events sent before the stream was ended`);
  } finally {
    await server.shutdown(0);
  }
});
