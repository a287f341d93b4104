/**
 * `k3 serve` end to end: one server process on the tiny model on a free loopback port,
 * driven with the official `openai` package and raw fetch. Greedy answers equal `k3 run`
 * on the same prompt ids; streamed answers equal unstreamed ones; 8 concurrent streaming
 * clients each get their solo answer; a client that disconnects frees its slot; a full
 * queue answers 429; malformed requests (fuzzed) get 4xx and the server keeps serving; the
 * API key is enforced; SIGTERM lets the request in flight finish and exits 0.
 *
 * Each test starts its own server ({@link withServer}), so any one runs alone and in any
 * order; waits are on the server's log lines, never on timers.
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import OpenAI from "openai";
import { chatPrompt } from "../../engine/text/chat.ts";
import { readReply } from "../../engine/text/xtml.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { k3, K3Process, tempDir, TINY, until } from "../helpers.ts";

const KEY = "test-key-0123456789";
const PARALLEL = 8;
const CONTEXT = 2048;
const MAX_BODY_KB = 64;
/** Ids that end an answer on the tiny vocabulary: <|end_of_msg|> and [EOS]. */
const STOP_IDS = [770, 769];

const READY = /k3: ready: (http:\/\/127\.0\.0\.1:\d+)\/v1/;

/** A `k3 serve` subprocess on the tiny model; `url` is known once it is ready. */
class Server extends K3Process {
  url = "";

  constructor(args: string[]) {
    super(["serve", TINY, ...args]);
  }

  async ready(): Promise<this> {
    this.url = (await this.waitFor(READY))[1];
    return this;
  }

  /** Resolves once the server has logged `n` request lines (each request logs one when done). */
  requestsLogged(n: number): Promise<void> {
    return this.until(`${n} request lines`, (stderr) => requestLines(stderr).length >= n);
  }

  /** Resolves once `n` completions have ended interrupted (logged after their slot is freed). */
  interrupted(n: number): Promise<void> {
    return this.until(`${n} interrupted`, (stderr) => interruptedLines(stderr).length >= n);
  }
}

/** The log lines of completions that ended interrupted. */
const interruptedLines = (stderr: string) =>
  stderr.split("\n").filter((l) => / POST \/v1\/completions \d+ .* finish interrupted$/.test(l));

/** The per-request log lines (id, method, path, status, tokens, seconds, finish). */
const requestLines = (stderr: string) =>
  stderr.split("\n").filter((l) => /^k3: \S+ [A-Z]+ \/\S* \d{3} tokens /.test(l));

/** The flags of the server each test gets: a key, 8 slots, no queue, a body limit. */
const SERVE_ARGS = [
  "--port",
  "0",
  "--api-key",
  KEY,
  "--parallel",
  String(PARALLEL),
  "--max-queue",
  "0",
  "--context",
  String(CONTEXT),
  "--max-body-kb",
  String(MAX_BODY_KB),
  "--grace",
  "30",
];
const tok = Tokenizer.load(TINY);
const auth = { authorization: `Bearer ${KEY}` };

/** One test's server and the ways to talk to it. */
interface Serving {
  server: Server;
  client: OpenAI;
  post(path: string, body: unknown, headers?: Record<string, string>): Promise<Response>;
  metric(name: string): Promise<number>;
  streamChat(
    params: Omit<OpenAI.ChatCompletionCreateParamsStreaming, "model" | "stream">,
  ): ReturnType<typeof streamChat>;
}

/** Runs `fn` against a fresh `k3 serve` (SERVE_ARGS), then stops it (SIGTERM) if `fn` has not. */
async function withServer(fn: (s: Serving) => Promise<void>): Promise<void> {
  const server = await new Server(SERVE_ARGS).ready();
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
  const post = async (path: string, body: unknown, headers: Record<string, string> = auth) =>
    await fetch(`${server.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: typeof body === "string" ? body : JSON.stringify(body),
    });
  /** A value of /metrics (the first series of that name). */
  const metric = async (name: string) => {
    const text = await (await fetch(`${server.url}/metrics`, { headers: auth })).text();
    const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(text);
    assert.ok(m, `${name} in /metrics:\n${text}`);
    return Number(m[1]);
  };
  try {
    await fn({ server, client, post, metric, streamChat: (params) => streamChat(client, params) });
  } finally {
    try {
      server.child.kill("SIGTERM");
    } catch { /* it has exited already */ }
    await server.exit();
  }
}

/** `k3 run` on these prompt ids: the generated ids, the answer's stop ids kept. */
async function k3Run(ids: number[], gen: number, extra: string[] = []): Promise<number[]> {
  await using dir = await tempDir();
  const out = await k3([
    "run",
    TINY,
    "--ids",
    ids.join(","),
    "--gen",
    String(gen),
    ...STOP_IDS.flatMap((s) => ["--stop-id", String(s)]),
    "--out",
    `${dir.path}/r.json`,
    ...extra,
  ]);
  assert.equal(out.code, 0, out.stderr);
  return JSON.parse(await Deno.readTextFile(`${dir.path}/r.json`)).generated_ids;
}

/** The text an answer of these ids shows: stop ids are not text. */
const answerText = (ids: number[]) => tok.decode(ids.filter((i) => !STOP_IDS.includes(i)));

const QUESTION = [{ role: "user" as const, content: "What is the capital of France?" }];

/** A streamed chat answer, collected: reasoning, content, finish reason, usage. */
async function streamChat(
  client: OpenAI,
  params: Omit<OpenAI.ChatCompletionCreateParamsStreaming, "model" | "stream">,
) {
  const stream = await client.chat.completions.create({ model: "tiny", stream: true, ...params });
  let reasoning = "", content = "", finish: string | null = null, chunks = 0;
  let usage: OpenAI.CompletionUsage | undefined;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    const ch = c.choices[0];
    if (!ch) continue;
    const d = ch.delta as { content?: string | null; reasoning_content?: string };
    reasoning += d.reasoning_content ?? "";
    content += d.content ?? "";
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { reasoning, content, finish, usage, chunks };
}

Deno.test({
  name: "serve: /health needs no key; everything else wants the API key (401 otherwise); /v1/models, /metrics",
  fn: () =>
    withServer(async ({ server, client, post }) => {
      const health = await fetch(`${server.url}/health`);
      assert.equal(health.status, 200);
      assert.deepEqual(await health.json(), { status: "ok" });
      const tries: Record<string, string>[] = [{}, { authorization: "Bearer wrong" }, { authorization: KEY }, {
        authorization: `Bearer ${KEY}x`,
      }];
      for (const headers of tries) {
        const r = await fetch(`${server.url}/v1/models`, { headers });
        assert.equal(r.status, 401, JSON.stringify(headers));
        const body = await r.json();
        assert.equal(body.error.code, "invalid_api_key");
        const c = await post("/v1/chat/completions", { messages: QUESTION, max_tokens: 1 }, headers);
        assert.equal(c.status, 401);
        await c.body?.cancel();
      }
      const bad = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "nope", maxRetries: 0 });
      await assert.rejects(() => bad.models.list(), (e: unknown) => e instanceof OpenAI.AuthenticationError);
      const models = await client.models.list();
      assert.deepEqual(models.data.map((m) => [m.id, m.object, m.owned_by]), [["tiny", "model", "k3"]]);
      const metrics = await fetch(`${server.url}/metrics`, { headers: auth });
      assert.equal(metrics.status, 200);
      assert.match(metrics.headers.get("content-type")!, /^text\/plain/);
      const text = await metrics.text();
      for (const m of ["k3_requests_total", "k3_queue_length", "k3_sequences_in_flight", "k3_read_bytes_total"]) {
        assert.match(text, new RegExp(`^# TYPE ${m} (counter|gauge)$`, "m"), m);
      }
      assert.match(text, /^k3_requests_total\{endpoint="\/v1\/models",status="401"\} [1-9]/m);
      assert.equal((await fetch(`${server.url}/metrics`)).status, 401);
    }),
});

Deno.test({
  name: "serve: greedy chat (thinking on and off) and completions (ids, text) equal k3 run on the same prompt ids",
  fn: () =>
    withServer(async ({ client, streamChat }) => {
      for (const thinking of [true, false]) {
        const ids = chatPrompt(tok, QUESTION, { thinking });
        const want = await k3Run(ids, 24);
        const split = readReply(tok, want, { thinking, tools: false });
        const r = await client.chat.completions.create({
          model: "tiny",
          messages: QUESTION,
          max_tokens: 24,
          temperature: 0,
          // @ts-expect-error: vLLM's extension, passed through by the SDK
          chat_template_kwargs: { thinking },
        });
        const msg = r.choices[0].message as typeof r.choices[0]["message"] & { reasoning_content: string | null };
        assert.equal(r.object, "chat.completion");
        assert.match(r.id, /^chatcmpl-/);
        assert.equal(r.model, "tiny");
        assert.equal(msg.role, "assistant");
        assert.equal(msg.content, split.content, `content, thinking ${thinking}`);
        assert.equal(msg.reasoning_content, thinking ? split.reasoning : null);
        assert.equal(r.choices[0].finish_reason, STOP_IDS.includes(want.at(-1)!) ? "stop" : "length");
        const closeThink = tok.encode("<|close|>think<|sep|>", { allowSpecial: true });
        const closedAt = want.findIndex((_, i) => closeThink.every((c, j) => want[i + j] === c));
        // cached_tokens: what the state cache served of the prompt (an earlier request's prefix).
        const { prompt_tokens_details: details, ...counts } = r.usage!;
        assert.deepEqual(counts, {
          prompt_tokens: ids.length,
          completion_tokens: want.length,
          total_tokens: ids.length + want.length,
          completion_tokens_details: { reasoning_tokens: thinking ? (closedAt < 0 ? want.length : closedAt) : 0 },
        });
        const cached = details?.cached_tokens ?? NaN;
        assert.ok(cached >= 0 && cached < ids.length, `cached_tokens ${cached}`);
        // Streamed: the same text in deltas, a usage chunk at the end when asked.
        const s = await streamChat({
          messages: QUESTION,
          max_tokens: 24,
          temperature: 0,
          stream_options: { include_usage: true },
          // @ts-expect-error: vLLM's extension
          chat_template_kwargs: { thinking },
        });
        assert.equal(s.content, split.content);
        assert.equal(s.reasoning, thinking ? split.reasoning : "");
        assert.equal(s.finish, r.choices[0].finish_reason);
        assert.deepEqual({ ...s.usage, prompt_tokens_details: undefined }, {
          ...counts,
          prompt_tokens_details: undefined,
        });
      }
      const ids = [5, 17, 300];
      const want = await k3Run(ids, 20);
      const c = await client.completions.create({ model: "tiny", prompt: ids, max_tokens: 20, temperature: 0 });
      assert.equal(c.object, "text_completion");
      assert.equal(c.choices[0].text, answerText(want));
      assert.equal(c.usage?.completion_tokens, want.length);
      const text = "Once upon a time";
      const textIds = tok.encode(text, { allowSpecial: false });
      const wantText = await k3Run(textIds, 12);
      const t = await client.completions.create({ model: "tiny", prompt: text, max_tokens: 12, temperature: 0 });
      assert.equal(t.choices[0].text, answerText(wantText));
      assert.equal(t.usage?.prompt_tokens, textIds.length);
      // Streamed completions: the same text.
      const stream = await client.completions.create({
        model: "tiny",
        prompt: ids,
        max_tokens: 20,
        temperature: 0,
        stream: true,
      });
      let streamed = "";
      for await (const ch of stream) streamed += ch.choices[0]?.text ?? "";
      assert.equal(streamed, answerText(want));
      // Completions default to 16 tokens, as OpenAI's do.
      const d = await client.completions.create({ model: "tiny", prompt: ids, temperature: 0 });
      assert.ok(d.usage!.completion_tokens <= 16);
      assert.equal(d.choices[0].finish_reason === "length", d.usage!.completion_tokens === 16);
    }),
});

Deno.test({
  name: "serve: stop strings end the answer before the stop text (streamed and not), finish_reason stop",
  fn: () =>
    withServer(async ({ client }) => {
      const ids = [5, 17, 300];
      const full = (await client.completions.create({ model: "tiny", prompt: ids, max_tokens: 40, temperature: 0 }))
        .choices[0].text;
      // A stop string from the middle of the greedy answer, spanning several characters.
      const chars = [...full];
      assert.ok(chars.length >= 12, `the greedy answer is long enough: ${JSON.stringify(full)}`);
      const stop = chars.slice(8, 11).join("");
      const cut = full.slice(0, full.indexOf(stop));
      const r = await client.completions.create({
        model: "tiny",
        prompt: ids,
        max_tokens: 40,
        temperature: 0,
        stop: ["zzzz", stop],
      });
      assert.equal(r.choices[0].text, cut);
      assert.equal(r.choices[0].finish_reason, "stop");
      assert.ok(r.usage!.completion_tokens < 40);
      const s = await client.completions.create({
        model: "tiny",
        prompt: ids,
        max_tokens: 40,
        temperature: 0,
        stop,
        stream: true,
      });
      let text = "", finish = null;
      for await (const ch of s) {
        text += ch.choices[0]?.text ?? "";
        finish = ch.choices[0]?.finish_reason ?? finish;
      }
      assert.equal(text, cut);
      assert.equal(finish, "stop");
    }),
});

Deno.test({
  name:
    "serve: seeded sampling equals k3 run with the same seed, is reproducible (streamed or not); other seeds differ",
  fn: () =>
    withServer(async ({ client, streamChat }) => {
      // The same sampler as k3 run: a seeded answer equals k3 run with those parameters.
      const ids = chatPrompt(tok, QUESTION, { thinking: true });
      const want = await k3Run(ids, 30, ["--temperature", "1", "--top-p", "0.95", "--seed", "42"]);
      const ask = async (seed: number) =>
        (await client.chat.completions.create({
          model: "tiny",
          messages: QUESTION,
          max_tokens: 30,
          temperature: 1,
          top_p: 0.95,
          seed,
        })).choices[0].message as { content: string; reasoning_content?: string };
      const a = await ask(42), b = await ask(42);
      assert.equal(a.reasoning_content, readReply(tok, want, { thinking: true, tools: false }).reasoning);
      assert.deepEqual(a, b);
      const s = await streamChat({ messages: QUESTION, max_tokens: 30, temperature: 1, top_p: 0.95, seed: 42 });
      assert.equal(s.reasoning, a.reasoning_content);
      const others = await Promise.all([1, 2, 3].map(ask));
      assert.ok(others.some((o) => o.reasoning_content !== a.reasoning_content), "seeds change the sample");
    }),
});

Deno.test({
  name: "serve: 8 concurrent streaming clients each get exactly the answer they get alone",
  fn: () =>
    withServer(async ({ client, streamChat }) => {
      const prompts = Array.from(
        { length: PARALLEL },
        (_, i) => [{ role: "user" as const, content: `Question ${i}: ${"why ".repeat(i)}?` }],
      );
      // Half greedy, half sampled with their own seeds: each sequence has its own sampler.
      const params = (i: number) => ({ max_tokens: 20 + 3 * i, temperature: i % 2 ? 0.8 : 0, seed: 100 + i });
      const solo = [];
      for (let i = 0; i < PARALLEL; i++) {
        const r = await client.chat.completions.create({ model: "tiny", messages: prompts[i], ...params(i) });
        solo.push((r.choices[0].message as { reasoning_content?: string }).reasoning_content);
      }
      const together = await Promise.all(prompts.map((m, i) => streamChat({ messages: m, ...params(i) })));
      assert.deepEqual(together.map((t) => t.reasoning), solo);
      assert.equal(new Set(solo).size, PARALLEL, "the prompts have different answers");
    }),
});

/** Opens a long streaming request; resolves after its first chunk. `stop` disconnects. */
async function longStream(post: Serving["post"], i: number): Promise<{ stop: () => Promise<void> }> {
  const res = await post("/v1/completions", {
    prompt: [10 + i, 20, 30],
    max_tokens: CONTEXT - 10,
    temperature: 0,
    ignore_eos: true,
    stream: true,
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  assert.ok(!(await reader.read()).done);
  return { stop: () => reader.cancel() };
}

Deno.test({
  name: "serve: a full queue answers 429 with Retry-After; a disconnecting client frees its slot at once",
  fn: () =>
    withServer(async ({ server, client, post, metric }) => {
      const streams = [];
      for (let i = 0; i < PARALLEL; i++) streams.push(await longStream(post, i));
      assert.equal(await metric("k3_requests_in_flight"), PARALLEL);
      assert.equal(await metric("k3_sequences_in_flight"), PARALLEL);
      const full = await post("/v1/completions", { prompt: [1, 2], max_tokens: 2 });
      assert.equal(full.status, 429);
      assert.equal(full.headers.get("retry-after"), "1");
      const body = await full.json();
      assert.equal(body.error.type, "rate_limit_error");
      await assert.rejects(
        () => client.chat.completions.create({ model: "tiny", messages: QUESTION, max_tokens: 2 }),
        (e: unknown) => e instanceof OpenAI.RateLimitError,
      );
      // One client goes away: its sequence ends at the next pass and the slot is free (the
      // request's line is logged after its slot is freed).
      await streams[0].stop();
      await server.interrupted(1);
      assert.equal(await metric("k3_requests_in_flight"), PARALLEL - 1);
      assert.equal(await metric("k3_sequences_in_flight"), PARALLEL - 1);
      const ok = await client.completions.create({ model: "tiny", prompt: [1, 2], max_tokens: 2, temperature: 0 });
      assert.equal(ok.usage?.completion_tokens, 2);
      await Promise.all(streams.slice(1).map((s) => s.stop()));
      await server.interrupted(PARALLEL);
      assert.equal(await metric("k3_sequences_in_flight"), 0);
      // The same for a client waiting for a whole (unstreamed) answer.
      const ac = new AbortController();
      const pending = fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...auth },
        body: JSON.stringify({ prompt: [9, 9, 9], max_tokens: CONTEXT - 10, ignore_eos: true }),
        signal: ac.signal,
      });
      // Polled: an unstreamed request being admitted shows on /metrics alone.
      await until("the unstreamed request runs", async () => (await metric("k3_sequences_in_flight")) === 1, 10);
      ac.abort();
      await assert.rejects(pending);
      await server.interrupted(PARALLEL + 1);
      assert.equal(await metric("k3_sequences_in_flight"), 0);
      assert.equal(await metric("k3_requests_in_flight"), 0);
      // Each aborted request logged one line, finish interrupted, well short of its max_tokens.
      const lines = interruptedLines(server.stderr);
      assert.equal(lines.length, PARALLEL + 1);
      for (const l of lines) {
        const out = Number(/tokens \d+\/(\d+)/.exec(l)![1]);
        assert.ok(out < CONTEXT - 10, l);
      }
    }),
});

Deno.test({
  name: "serve: malformed requests get 4xx in OpenAI's error shape (fuzzed) and the server keeps serving",
  fn: () =>
    withServer(async ({ server, client, post, metric }) => {
      const expectError = async (res: Response, status: number, param?: string | null) => {
        assert.equal(res.status, status, `status (${await res.clone().text()})`);
        const { error } = await res.json();
        assert.equal(typeof error.message, "string");
        assert.ok("type" in error && "param" in error && "code" in error);
        if (param !== undefined) assert.equal(error.param, param);
      };
      await expectError(await post("/v1/chat/completions", "{not json"), 400, null);
      // Streamed choices are served (n_choices_test.ts); more than 128 is a 400, streamed or not.
      await expectError(await post("/v1/chat/completions", { messages: QUESTION, n: 129, stream: true }), 400, "n");
      await expectError(
        await post("/v1/chat/completions", { messages: QUESTION, tools: [{ type: "function" }] }),
        400,
        "tools[0].function",
      );
      await expectError(await post("/v1/chat/completions", { messages: QUESTION, model: "gpt-4" }), 404, "model");
      await expectError(await post("/v1/completions", { prompt: [1, 99999] }), 400, "prompt[1]");
      await expectError(await post("/v1/completions", { prompt: [1, 2], max_tokens: CONTEXT }), 400, "max_tokens");
      await expectError(
        await post("/v1/chat/completions", { messages: QUESTION, max_completion_tokens: CONTEXT }),
        400,
        "max_completion_tokens",
      );
      await expectError(await post("/v1/completions", { prompt: Array(CONTEXT).fill(1) }), 400, "prompt");
      await expectError(await post("/v1/completions", { prompt: "x".repeat(MAX_BODY_KB * 1024) }), 413);
      await expectError(await fetch(`${server.url}/v1/chat/completions`, { headers: auth }), 405);
      await expectError(await fetch(`${server.url}/v1/nothing`, { headers: auth }), 404);
      const field = fc.constantFrom(
        "messages",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "n",
        "model",
        "logprobs",
        "chat_template_kwargs",
      );
      const body = fc.oneof(
        fc.string({ maxLength: 40 }),
        fc.jsonValue().map((v) => JSON.stringify(v)),
        fc.dictionary(field, fc.jsonValue()).map((v) => JSON.stringify(v)),
        fc.tuple(field, fc.jsonValue()).map(([k, v]) =>
          JSON.stringify({ messages: QUESTION, prompt: [1], max_tokens: 1, [k]: v })
        ),
      );
      let served = 0;
      await fc.assert(
        fc.asyncProperty(fc.constantFrom("/v1/chat/completions", "/v1/completions"), body, async (path, b) => {
          const res = await post(path, b);
          if (res.status === 200) {
            served++;
            await res.body?.cancel(); // a valid one (or a stream): fine, but never a 5xx
            return;
          }
          assert.ok(res.status >= 400 && res.status < 500, `4xx for ${b}: ${res.status}`);
          const { error } = await res.json();
          assert.equal(typeof error.message, "string");
        }),
        { numRuns: 300, seed: 3 },
      );
      assert.ok(served < 300, "most fuzzed bodies are refused");
      const after = await client.chat.completions.create({
        model: "tiny",
        messages: QUESTION,
        max_tokens: 3,
        temperature: 0,
      });
      assert.equal(after.usage?.completion_tokens, 3);
      // Every request has been answered (11 refusals above, 300 fuzzed, 1 after): each logs
      // its line when done, a stream when it has ended.
      await server.requestsLogged(11 + 300 + 1);
      assert.equal(await metric("k3_requests_in_flight"), 0);
    }),
});

Deno.test({
  name: "serve: one log line per request on stderr (id, status, tokens in/out, seconds, finish)",
  fn: () =>
    withServer(async ({ server, client }) => {
      const r = await client.chat.completions.create({
        model: "tiny",
        messages: QUESTION,
        max_tokens: 4,
        temperature: 0,
      });
      await server.waitFor(new RegExp(`^k3: ${r.id} `, "m"));
      const lines = server.stderr.split("\n").filter((l) => l.includes(r.id));
      assert.equal(lines.length, 1);
      assert.match(
        lines[0],
        new RegExp(
          `^k3: ${r.id} POST /v1/chat/completions 200 tokens ${
            r.usage!.prompt_tokens
          }/4 \\d+\\.\\d{3} s finish length$`,
        ),
      );
    }),
});

Deno.test({
  name: "serve: usage errors exit 2 with one line (no model dir, bad flag, port in use)",
  fn: () =>
    withServer(async ({ server }) => {
      const cases: [string[], RegExp][] = [
        [["serve"], /expected exactly one <model_dir>/],
        [["serve", TINY, "--parallel", "0"], /--parallel: 0 is out of range/],
        [["serve", TINY, "--port", new URL(server.url).port], /cannot listen on 127\.0\.0\.1:\d+/],
      ];
      for (const [args, re] of cases) {
        const out = await k3(args);
        assert.equal(out.code, 2, out.stderr);
        assert.equal(out.stderr.trim().split("\n").length, 1, out.stderr);
        assert.match(out.stderr, re);
      }
    }),
});

Deno.test({
  name: "serve: past the grace period, requests in flight are cancelled (error event, [DONE]) and it exits 0",
  fn: async () => {
    const s = await new Server(["--port", "0", "--grace", "0.2"]).ready();
    const res = await fetch(`${s.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 1000, ignore_eos: true, stream: true }),
    });
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let text = (await reader.read()).value ?? "";
    s.child.kill("SIGTERM");
    for (let r = await reader.read(); !r.done; r = await reader.read()) text += r.value;
    assert.match(text, /data: \{"error":\{"message":"the request was cancelled: the server is shutting down"/);
    assert.doesNotMatch(text, /"finish_reason":"length"/);
    assert.ok(text.endsWith("data: [DONE]\n\n"));
    assert.equal((await s.exit()).code, 0, s.stderr);
    assert.match(s.stderr, /POST \/v1\/completions 200 tokens 3\/\d+ .* finish interrupted\n/);
  },
});

Deno.test({
  name: "serve: SIGTERM stops accepting, lets the request in flight finish, exits 0",
  fn: () =>
    withServer(async ({ server, post }) => {
      const res = await post("/v1/chat/completions", {
        messages: QUESTION,
        max_tokens: 1000,
        temperature: 0,
        stream: true,
        ignore_eos: true,
      });
      assert.equal(res.status, 200);
      const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
      let text = (await reader.read()).value ?? "";
      server.child.kill("SIGTERM");
      await server.waitFor(/SIGTERM: no new requests/);
      // No new connections while the answer in flight goes on to its end.
      await assert.rejects(() => fetch(`${server.url}/health`));
      for (let r = await reader.read(); !r.done; r = await reader.read()) text += r.value;
      assert.match(text, /"finish_reason":"length"/);
      assert.ok(text.endsWith("data: [DONE]\n\n"));
      const status = await server.exit();
      assert.equal(status.code, 0, server.stderr);
      assert.match(server.stderr, /k3: stopped\n$/);
      assert.match(
        server.stderr,
        /SIGTERM: no new requests.*POST \/v1\/chat\/completions 200 tokens \d+\/1000 .* finish length\n/s,
      );
      assert.doesNotMatch(server.stderr, /internal error|\s+at .*:\d+:\d+/);
      await assert.rejects(() => fetch(`${server.url}/health`));
    }),
});
