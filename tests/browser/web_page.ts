/// <reference lib="dom" />

/**
 * The chat page of `k3 serve` in real headless Chromium (Debian's `chromium`, driven by
 * playwright-core): the key prompt, a message sent from the keyboard and its streamed
 * text, the reasoning block, stop, regenerate, a forced tool call, a reload that keeps
 * the conversation; the engine panel's prefill progress and per-token bars against the
 * status stream's own numbers (the model's ledger); a page of another origin that can
 * neither drive the server nor read its status stream. Screenshots: light, dark, 320 px.
 *
 * Not a `*_test.ts`: playwright-core reads the whole environment and /proc, which the
 * suite's permission set does not grant, so tests/e2e/web_test.ts runs this file with
 * `deno test -A` in a child process (and fails, naming it, when chromium is missing).
 * With K3_SCREENSHOTS=DIR the screenshots are written to DIR (docs/img for the README).
 */

import assert from "node:assert/strict";
import { type BrowserContext, chromium, type Page } from "playwright-core";
import { CHROMIUM, K3Process, ROOT, TINY, until } from "../helpers.ts";
const KEY = "web-test-key-0123456789";
const READY = /k3: ready: (http:\/\/127\.0\.0\.1:\d+)\/v1/;
/** The log line of a chat request its client left (499) and the server interrupted. */
const STOPPED = /POST \/v1\/chat\/completions 499 .* finish interrupted$/gm;

/** A pass event of the status stream (cli/server/status.ts), the fields compared here. */
interface Pass {
  pass: number;
  seconds: number;
  trunk_read_wait_seconds: number;
  expert_read_wait_seconds: number;
  compute_seconds: number;
  trunk_bytes: number;
  expert_bytes: number;
  expert_hits: number;
  tokens: { id: string; index: number }[];
  prefill: { id: string; done: number; total: number }[];
}

/** Starts `k3 serve` on the tiny model with `args`; resolves with it and its URL once ready. */
async function serve(args: string[]): Promise<{ server: K3Process; url: string }> {
  const server = new K3Process(["serve", TINY, "--port", "0", "--context", "2048", ...args]);
  const url = (await server.waitFor(READY))[1];
  return { server, url };
}

async function stop(server: K3Process): Promise<void> {
  try {
    server.child.kill("SIGTERM");
  } catch { /* gone already */ }
  await server.exit();
}

/** A fresh browser (its own user data dir), closed with the returned function. */
async function browser(
  colorScheme: "light" | "dark" = "light",
): Promise<{ ctx: BrowserContext; close: () => Promise<void> }> {
  try {
    await Deno.stat(CHROMIUM);
  } catch {
    throw new Error(`${CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium; .ci/run does)`);
  }
  const dir = await Deno.makeTempDir({ prefix: "k3-web-" });
  const ctx = await chromium.launchPersistentContext(dir, {
    executablePath: CHROMIUM,
    headless: true,
    colorScheme,
    viewport: { width: 1280, height: 900 },
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  return {
    ctx,
    close: async () => {
      await ctx.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

/** Reads the status stream with `key` into `passes` until `stop()` (which resolves once
 * the stream is closed). */
async function followStatus(url: string, key: string, passes: Pass[]): Promise<{ stop: () => Promise<void> }> {
  const res = await fetch(`${url}/v1/status/stream`, { headers: { authorization: `Bearer ${key}` } });
  assert.equal(res.status, 200);
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  const reading = (async () => {
    let buf = "";
    for (let r = await reader.read(); !r.done; r = await reader.read()) {
      buf += r.value;
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        if (block.startsWith("event: pass\n")) passes.push(JSON.parse(block.slice(block.indexOf("data: ") + 6)));
      }
    }
  })();
  return {
    stop: async () => {
      await reader.cancel();
      await reading;
    },
  };
}

/** The text of the last reply's meta line once the reply has ended (usage or a stop shown). */
async function replyDone(page: Page): Promise<string> {
  await page.waitForFunction(() => {
    const metas = document.querySelectorAll("#log .msg.assistant .meta");
    const last = metas[metas.length - 1];
    return last && /completion tokens|stopped by you|HTTP/.test(last.textContent ?? "") &&
      !(document.getElementById("send") as HTMLButtonElement).disabled;
  });
  return await page.locator("#log .msg.assistant .meta").last().innerText();
}

/** Records, in the page, every value a prefill progress bar and the last reply's content took. */
async function watchPage(page: Page): Promise<void> {
  await page.evaluate(() => {
    const w = globalThis as unknown as { seen: Seen };
    w.seen = { prefill: [], lengths: [], open: [], tops: [] };
    new MutationObserver(() => {
      // Where the message box and the pass bars are: the same all along (no layout shift).
      const top = (id: string) => Math.round(document.getElementById(id)!.getBoundingClientRect().top);
      w.seen.tops.push(`${top("composer")} ${top("pass-bars")}`);
      for (const p of document.querySelectorAll<HTMLProgressElement>("#sequences progress.prefill")) {
        w.seen.prefill.push([p.value, p.max]);
      }
      const msgs = document.querySelectorAll("#log .msg.assistant");
      const last = msgs[msgs.length - 1];
      if (last) {
        w.seen.lengths.push(
          (last.querySelector(".content")?.textContent ?? "").length +
            (last.querySelector(".reasoning .text")?.textContent ?? "").length,
        );
        w.seen.open.push((last.querySelector(".reasoning") as HTMLDetailsElement).open);
      }
    }).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
  });
}

/** What {@link watchPage} recorded: prefill bars' [value, max], the reply's length, whether its
 * reasoning block was open, and where the message box and the pass bars were. */
interface Seen {
  prefill: [number, number][];
  lengths: number[];
  open: boolean[];
  tops: string[];
}

async function seen(page: Page): Promise<Seen> {
  return await page.evaluate(() => (globalThis as unknown as { seen: never }).seen);
}

/** Sets a settings field (text, number, textarea or select). */
async function setting(page: Page, id: string, value: string): Promise<void> {
  const tag = await page.locator(`#${id}`).evaluate((e) => e.tagName);
  if (tag === "SELECT") await page.selectOption(`#${id}`, value);
  else await page.fill(`#${id}`, value);
}

/** Types `text` into the message box and sends it with Enter (the keyboard path). */
async function sendByKeyboard(page: Page, text: string): Promise<void> {
  await page.focus("#prompt");
  await page.keyboard.type(text);
  await page.keyboard.press("Enter");
}

const WEATHER = [{
  type: "function",
  function: {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: { city: { enum: ["Oslo", "Paris"] } },
      required: ["city"],
      additionalProperties: false,
    },
  },
}];

Deno.test({
  name: "the chat page: key, stream, reasoning, stop, regenerate, tool call, reload, live panel, screenshots",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    // --draft off: one token per pass, so one bar per token.
    const { server, url } = await serve(["--api-key", KEY, "--chunk", "8", "--parallel", "2", "--draft", "off"]);
    const b = await browser();
    const passes: Pass[] = [];
    const following = await followStatus(url, KEY, passes);
    try {
      const page = await b.ctx.newPage();
      const pageErrors: string[] = [];
      page.on("pageerror", (e) => pageErrors.push(e.message));
      const t0 = performance.now();
      const step = (what: string) => console.error(`${((performance.now() - t0) / 1000).toFixed(1)} s: ${what}`);
      await page.goto(url);
      // The key is asked for once (the page's first API call got a 401) and kept in the tab.
      await page.waitForSelector("#key-dialog[open]");
      await page.fill("#key-input", KEY);
      await page.keyboard.press("Enter");
      await page.waitForFunction(() => document.getElementById("model-name")!.textContent === "tiny");
      assert.equal(await page.evaluate(() => sessionStorage.getItem("k3.apiKey")), KEY);
      await page.waitForFunction(() => document.getElementById("engine-state")!.textContent === "live");

      step("A message from the keyboard");
      // A message from the keyboard, thinking off: streamed text, usage with cached_tokens.
      await page.click("#settings summary");
      await page.click("#thinking");
      // A fixed seed: the tiny model's replies are the same every run (seed 4 gives a long
      // reply in the stop step below).
      await setting(page, "seed", "4");
      await setting(page, "max_tokens", "200");
      await watchPage(page);
      await sendByKeyboard(page, "Say hello");
      let meta = await replyDone(page);
      assert.match(meta, /finish: length · \d+ prompt tokens \(\d+ cached\), 200 completion tokens/);
      let s = await seen(page);
      const grew = new Set(s.lengths.filter((n) => n > 0));
      assert.ok(grew.size >= 2, `the reply's text grew while streaming: ${[...grew]}`);
      assert.equal(new Set(s.tops).size, 1, `nothing moved while the reply streamed: ${[...new Set(s.tops)]}`);
      assert.ok((await page.locator("#log .msg.assistant .content").last().innerText()).length > 0);
      assert.equal(await page.locator("#log .msg.assistant .reasoning").last().isHidden(), true);

      step("Thinking on:");
      // Thinking on: the reasoning block is open while it streams, closed at the end.
      await page.click("#thinking");
      await watchPage(page);
      await sendByKeyboard(page, "Think first");
      meta = await replyDone(page);
      s = await seen(page);
      assert.ok(s.open.includes(true), "the reasoning block was open while streaming");
      assert.equal(new Set(s.tops).size, 1, `nothing moved while the reply streamed: ${[...new Set(s.tops)]}`);
      const reasoning = page.locator("#log .msg.assistant .reasoning").last();
      assert.equal(await reasoning.isVisible(), true);
      assert.match(await reasoning.locator("summary").innerText(), /^Reasoning \(\d+ characters\)$/);
      assert.match(meta, /\(\d+ reasoning\)/);

      step("Stop (Escape");
      // Stop (Escape, from the keyboard) a long reply once it streams: shown as stopped, and the
      // server ends the sequence as interrupted (its log line).
      // (in a new conversation: the whole context is there for the reply).
      await page.click("#new-chat");
      await setting(page, "max_tokens", "1700"); // within --context 2048 with the prompt
      const interruptedBefore = server.stderr.match(STOPPED)?.length ?? 0;
      await sendByKeyboard(page, "A long answer please");
      // Once anything of the reply has streamed (reasoning or text: which comes first is the
      // model's choice), stop it.
      await page.waitForFunction(() => {
        const m = document.querySelectorAll("#log .msg.assistant");
        return (m[m.length - 1]?.textContent ?? "").trim().length > 0;
      });
      await page.keyboard.press("Escape");
      meta = await replyDone(page);
      assert.match(meta, /^stopped by you/);
      await server.until(
        "the stopped request's log line",
        (e) => (e.match(STOPPED)?.length ?? 0) > interruptedBefore,
      );

      step("Regenerate replaces");
      // Regenerate replaces the stopped reply (the button, pressed with the keyboard).
      await setting(page, "max_tokens", "20");
      const before = await page.locator("#log .msg").count();
      await page.focus("#regenerate");
      await page.keyboard.press("Enter");
      meta = await replyDone(page);
      assert.match(meta, /finish: length/);
      assert.equal(await page.locator("#log .msg").count(), before);

      step("A forced tool call");
      // A forced tool call is shown as one.
      await page.click("#thinking");
      await setting(page, "tools", JSON.stringify(WEATHER));
      await setting(page, "tool_choice", "first");
      await setting(page, "max_tokens", "1200");
      await sendByKeyboard(page, "Weather in Oslo?");
      meta = await replyDone(page);
      assert.match(meta, /finish: tool_calls/);
      const call = page.locator("#log .msg.assistant .tool-call").last();
      assert.equal(await call.locator("strong").innerText(), "Tool call: get_weather");
      assert.ok(["Oslo", "Paris"].includes(JSON.parse(await call.locator("pre").innerText()).city));
      await setting(page, "tools", "");
      await setting(page, "tool_choice", "");

      step("The live panel:");
      // The live panel: a long prompt's prefill progress and one bar per token, matching the
      // status stream's numbers for this request.
      await setting(page, "system", "You are a careful assistant. ".repeat(60));
      await setting(page, "max_tokens", "5");
      await page.click("#new-chat");
      await watchPage(page);
      const passesBefore = passes.length;
      await sendByKeyboard(page, "Read all that");
      meta = await replyDone(page);
      const promptTokens = Number(/(\d+) prompt tokens/.exec(meta)![1]);
      s = await seen(page);
      const partial = s.prefill.filter(([v, max]) => v > 0 && v < max && max === promptTokens);
      assert.ok(new Set(partial.map(([v]) => v)).size >= 2, `prefill progress shown: ${JSON.stringify(s.prefill)}`);
      await page.waitForFunction(() => document.querySelectorAll("#pass-bars g.pass").length > 0);
      // The page and this test read the status stream separately, and ours may lag the
      // page's: wait for the passes the page has already drawn.
      const since = () => passes.slice(passesBefore);
      await until("a pass with a token on the status stream", () => since().some((p) => p.tokens.length > 0), 10);
      const id = since().find((p) => p.tokens.length > 0)!.tokens[0].id;
      const prefillDone = new Set(since().flatMap((p) => p.prefill.filter((q) => q.id === id).map((q) => q.done)));
      for (const [v] of partial) assert.ok(prefillDone.has(v), `prefill ${v} is one the status stream sent`);
      await page.waitForFunction(
        (id) => document.querySelectorAll(`#pass-bars g.pass[data-tokens*="${id}#5"]`).length === 1,
        id,
      );
      const ofId = () => since().filter((p) => p.tokens.some((t) => t.id === id));
      await until("the request's 5 token passes on the status stream", () => ofId().length >= 5, 10);
      const bars = await page.locator("#pass-bars g.pass").evaluateAll(
        (gs, id) =>
          gs.filter((g) => (g as SVGGElement).dataset.tokens!.includes(id as string)).map((g) => ({
            ...(g as SVGGElement).dataset,
          })),
        id,
      );
      const tokenPasses = ofId();
      assert.equal(bars.length, 5, "one bar per generated token");
      assert.equal(tokenPasses.length, 5);
      for (const [i, bar] of bars.entries()) {
        const p = tokenPasses[i];
        assert.equal(Number(bar.pass), p.pass);
        assert.equal(Number(bar.seconds), p.seconds);
        assert.equal(Number(bar.readWait), p.trunk_read_wait_seconds + p.expert_read_wait_seconds);
        assert.equal(Number(bar.compute), p.compute_seconds);
        assert.equal(Number(bar.bytes), p.trunk_bytes + p.expert_bytes);
        assert.equal(Number(bar.expertHits), p.expert_hits);
        assert.ok(p.compute_seconds > 0, JSON.stringify(p));
      }

      step("screenshots");
      await screenshots(page);

      step("A reload keeps");
      // A reload keeps the conversations, and the key (same tab: no second prompt).
      const messages = await page.locator("#log .msg").count();
      const options = await page.locator("#conversations option").count();
      await page.reload();
      await page.waitForFunction(() => document.getElementById("model-name")!.textContent === "tiny");
      assert.equal(await page.locator("#log .msg").count(), messages);
      assert.equal(await page.locator("#conversations option").count(), options);
      assert.equal(await page.locator("#key-dialog").evaluate((d) => (d as HTMLDialogElement).open), false);
      assert.deepEqual(pageErrors, [], "no script error on the page");
    } finally {
      await following.stop();
      await b.close();
      await stop(server);
    }
  },
});

/** The page at 1280 px light, dark and 320 px, written to $K3_SCREENSHOTS when set. */
async function screenshots(page: Page): Promise<void> {
  const dir = Deno.env.get("K3_SCREENSHOTS");
  const out = dir ? (dir.startsWith("/") ? dir : `${ROOT}/${dir}`) : await Deno.makeTempDir({ prefix: "k3-shots-" });
  // The conversation with a reasoning block and a tool call, the settings folded.
  await page.selectOption("#conversations", { index: 1 });
  await page.click("#settings summary");
  await page.screenshot({ path: `${out}/web-light.png` });
  await page.emulateMedia({ colorScheme: "dark" });
  await page.screenshot({ path: `${out}/web-dark.png` });
  await page.emulateMedia({ colorScheme: "light" });
  await page.setViewportSize({ width: 320, height: 700 });
  // Narrow: nothing wider than the screen (no sideways scrolling).
  assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= 320), "the page fits 320 px");
  await page.screenshot({ path: `${out}/web-narrow.png`, fullPage: true });
  await page.setViewportSize({ width: 1280, height: 900 });
  if (!dir) await Deno.remove(out, { recursive: true });
}

Deno.test({
  name: "another origin's page can neither drive the server nor read its status stream; keys see only their own",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const { server, url } = await serve([]);
    // The other origin: a page on another port of loopback that tries everything.
    const evil = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, () =>
      new Response(
        `<!doctype html><script type="module">
          const k3 = ${JSON.stringify(url)};
          const tries = {};
          const attempt = async (name, f) => { try { const r = await f(); tries[name] = "status " + r.status; } catch (e) { tries[name] = "refused"; } };
          await attempt("post", () => fetch(k3 + "/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json" },
            body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 1 }) }));
          await attempt("simple-post", () => fetch(k3 + "/v1/chat/completions", { method: "POST", mode: "no-cors", headers: { "content-type": "text/plain" },
            body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 1 }) }));
          await attempt("status", () => fetch(k3 + "/v1/status/stream"));
          await attempt("status-no-cors", () => fetch(k3 + "/v1/status/stream", { mode: "no-cors" }));
          document.title = JSON.stringify(tries);
        </script><iframe id="f" src="${url}/"></iframe>`,
        { headers: { "content-type": "text/html" } },
      ));
    const b = await browser();
    try {
      const page = await b.ctx.newPage();
      await page.goto(`http://127.0.0.1:${evil.addr.port}/`);
      await page.waitForFunction(() => document.title.startsWith("{"));
      const tries = JSON.parse(await page.title());
      // Cross-origin reads are refused by the browser (no CORS) or answered opaque (no-cors).
      assert.equal(tries.post, "refused");
      assert.equal(tries.status, "refused");
      // The server saw what did reach it as another origin's and refused it.
      const lines = server.stderr.split("\n").filter((l) => /^k3: \S+ (GET|POST|OPTIONS) \//.test(l));
      assert.ok(!lines.some((l) => / 200 tokens/.test(l) && /completions|status/.test(l)), lines.join("\n"));
      assert.ok(lines.some((l) => /GET \/v1\/status\/stream 403/.test(l)), lines.join("\n"));
      // The frame stays empty: the page refuses to be framed (frame-ancestors 'none').
      const frame = page.frames().find((f) => f !== page.mainFrame())!;
      assert.equal(await frame.evaluate(() => document.getElementById("prompt")).catch(() => null), null);
    } finally {
      await b.close();
      await evil.shutdown();
      await stop(server);
    }
    // The same from outside a browser: a foreign Origin is refused on the status stream too.
    const keyed = await serve(["--api-key", KEY]);
    try {
      const status = (headers: Record<string, string>) =>
        fetch(`${keyed.url}/v1/status/stream`, { headers }).then(async (r) => (await r.body?.cancel(), r.status));
      assert.equal(await status({}), 401);
      assert.equal(await status({ authorization: "Bearer another-key" }), 401);
      assert.equal(await status({ authorization: `Bearer ${KEY}`, origin: "http://evil.example" }), 403);
    } finally {
      await stop(keyed.server);
    }
  },
});
