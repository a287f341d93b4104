/**
 * The HTTP side of `k3 serve`: an OpenAI-compatible API on `Deno.serve` in front of the
 * batching scheduler: routing, API keys, limits, metrics and one log line per request.
 * Every generation request becomes one scheduler sequence (cli/server/tasks.ts), answered
 * as JSON or server-sent events (cli/server/stream.ts); a client that goes away aborts its
 * sequence; the number of requests waiting is bounded (429 beyond it); a shutdown stops
 * accepting and gives what is in flight a grace period before cancelling it.
 *
 * Nothing here reads or writes files: the model, tokenizer and scheduler are handed in.
 *
 * @module
 */

import { createHash, timingSafeEqual } from "node:crypto";
import { K3Error } from "../../engine/errors.ts";
import { ApiError, errorBody, modelList, type ResponseHead } from "../openai.ts";
import { type Outcome, runTask, type ServeEngine, serveTask } from "./tasks.ts";
import { ChunkWriter, completionBody, EventStream } from "./stream.ts";

export type { ServeEngine } from "./tasks.ts";

/** How the server is set up. */
export interface ServerOptions {
  /** Address to listen on. */
  hostname: string;
  /** 0: any free port. */
  port: number;
  /** The model name answered in responses and /v1/models. */
  modelName: string;
  /** When set, every endpoint but /health wants `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** Sequences generating at once (the scheduler's batch). */
  parallel: number;
  /** Requests waiting beyond `parallel`; more get 429. */
  maxQueue: number;
  /** Larger request bodies get 413. */
  maxBodyBytes: number;
  /** Access-Control-Allow-Origin to answer (no CORS headers at all when unset). */
  cors?: string;
  /** One line per request (default: stderr). */
  log?: (line: string) => void;
}

/** A listening server. */
export interface RunningServer {
  /** Where it listens. */
  readonly addr: Deno.NetAddr;
  /** Starts answering generation requests (and /health 200). */
  ready(engine: ServeEngine): void;
  /** Resolves when no request is in flight (every admitted request answered and its
   * sequence released): a hook a test can await instead of polling /metrics. */
  idle(): Promise<void>;
  /** Stops accepting; in-flight requests get `graceSeconds` to finish, then are cancelled. */
  shutdown(graceSeconds: number): Promise<void>;
  /** Resolves when the server has stopped. */
  readonly finished: Promise<void>;
}

const JSON_HEADERS = { "content-type": "application/json" };

/** Counters and gauges for /metrics. */
class Metrics {
  readonly requests = new Map<string, number>();
  promptTokens = 0;
  completionTokens = 0;
  decodeSeconds = 0;
  decodeTokens = 0;
  ttftSeconds = 0;
  ttftCount = 0;

  count(endpoint: string, status: number): void {
    const key = `endpoint="${endpoint}",status="${status}"`;
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1);
  }

  /** Prometheus text exposition format, version 0.0.4. */
  text(engine: ServeEngine | undefined, inFlight: number): string {
    const out: string[] = [];
    const metric = (name: string, type: string, help: string, rows: [string, number][]) => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
      for (const [labels, v] of rows) out.push(`${name}${labels ? `{${labels}}` : ""} ${v}`);
    };
    metric("k3_requests_total", "counter", "Requests answered, by endpoint and HTTP status.", [...this.requests]);
    metric("k3_prompt_tokens_total", "counter", "Prompt tokens of generation requests.", [["", this.promptTokens]]);
    metric("k3_completion_tokens_total", "counter", "Tokens generated.", [["", this.completionTokens]]);
    metric("k3_requests_in_flight", "gauge", "Generation requests admitted and not yet answered.", [["", inFlight]]);
    metric("k3_queue_length", "gauge", "Sequences waiting for a slot in the batch.", [[
      "",
      engine?.scheduler.queued ?? 0,
    ]]);
    metric("k3_sequences_in_flight", "gauge", "Sequences in the running batch.", [["", engine?.scheduler.active ?? 0]]);
    metric("k3_read_bytes_total", "counter", "Bytes of weights read from disk.", [["", engine?.bytesRead() ?? 0]]);
    metric("k3_decode_seconds_total", "counter", "Seconds spent generating tokens after the first.", [[
      "",
      this.decodeSeconds,
    ]]);
    metric("k3_decode_tokens_total", "counter", "Tokens generated after the first (seconds per token = ratio).", [[
      "",
      this.decodeTokens,
    ]]);
    metric("k3_time_to_first_token_seconds_total", "counter", "Seconds from admission to the first token.", [[
      "",
      this.ttftSeconds,
    ]]);
    metric("k3_time_to_first_token_count", "counter", "Requests that produced a first token.", [["", this.ttftCount]]);
    const sc = engine?.stateCache?.stats;
    if (sc) {
      const stateCache: [string, string, string, [string, number][]][] = [
        ["hits_total", "counter", "Requests continued from a kept state.", [["", sc.hits]]],
        ["misses_total", "counter", "Requests with no kept prefix.", [["", sc.misses]]],
        ["evictions_total", "counter", "Kept states evicted from RAM.", [["", sc.evictions]]],
        ["bytes", "gauge", "Bytes of kept states, by tier.", [['tier="ram"', sc.bytes], ['tier="disk"', sc.diskBytes]]],
        ["entries", "gauge", "Kept states, by tier.", [['tier="ram"', sc.entries], ['tier="disk"', sc.diskEntries]]],
        ["disk_hits_total", "counter", "Hits read back from the spill directory.", [["", sc.diskHits]]],
        ["refused_total", "counter", "Spill files refused (damaged) and recomputed.", [["", sc.refused]]],
      ];
      for (const [name, type, help, rows] of stateCache) metric(`k3_state_cache_${name}`, type, help, rows);
      metric("k3_cached_prompt_tokens_total", "counter", "Prompt tokens served from kept states.", [[
        "",
        sc.cachedTokens,
      ]]);
    }
    return out.join("\n") + "\n";
  }
}

/** A SHA-256 digest, so keys of any length compare in constant time. */
function digest(s: string): Uint8Array {
  return createHash("sha256").update(s).digest();
}

function randomId(prefix: string): string {
  const b = crypto.getRandomValues(new Uint8Array(12));
  return prefix + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** Reads a body of at most `cap` bytes (413 beyond), without trusting Content-Length. */
async function readBody(req: Request, cap: number): Promise<string> {
  const declared = Number(req.headers.get("content-length") ?? "0");
  if (declared > cap) throw new ApiError(413, `the request body is ${declared} bytes, at most ${cap}`);
  if (!req.body) return "";
  const chunks: Uint8Array[] = [];
  let n = 0;
  for await (const c of req.body) {
    n += c.length;
    if (n > cap) throw new ApiError(413, `the request body is over ${cap} bytes`);
    chunks.push(c);
  }
  const all = new Uint8Array(n);
  let o = 0;
  for (const c of chunks) (all.set(c, o), o += c.length);
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(all);
  } catch {
    throw new ApiError(400, "the request body is not valid UTF-8");
  }
}

/** Per-request facts for its one log line, written when the response is done. */
interface LogNote {
  id: string;
  status: number;
  tokensIn: number;
  tokensOut: number;
  finish: string;
  streaming: boolean;
  done: () => void;
}

/** A failure as OpenAI's error: an ApiError as is, anything else a 500 naming it. */
function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  const msg = err instanceof Error ? err.message : String(err);
  return new ApiError(500, `generation failed: ${msg}`, null, err instanceof K3Error ? `exit_${err.exitCode}` : null);
}

/** The CORS headers answered for `origin` (none when unset). */
function corsHeaders(origin: string | undefined): Record<string, string> {
  return origin
    ? {
      "access-control-allow-origin": origin,
      "access-control-allow-headers": "authorization, content-type",
      "access-control-allow-methods": "GET, POST, OPTIONS",
      vary: "origin",
    }
    : {};
}

/** The server: its routes, its limits and what is in flight. */
class HttpServer implements RunningServer {
  readonly addr: Deno.NetAddr;
  readonly finished: Promise<void>;
  readonly #opts: ServerOptions;
  readonly #log: (line: string) => void;
  readonly #metrics = new Metrics();
  readonly #apiKey: Uint8Array | undefined;
  readonly #cors: Record<string, string>;
  readonly #created = Math.floor(Date.now() / 1000);
  /** Requests admitted and not yet answered, each with the controller that cancels it. */
  readonly #inFlight = new Set<AbortController>();
  #idle: { promise: Promise<void>; resolve: () => void } | undefined;
  #engine: ServeEngine | undefined;
  #accepting = true;
  readonly #server: Deno.HttpServer<Deno.NetAddr>;

  constructor(opts: ServerOptions) {
    this.#opts = opts;
    this.#log = opts.log ?? ((line: string) => console.error(line));
    this.#apiKey = opts.apiKey === undefined ? undefined : digest(opts.apiKey);
    this.#cors = corsHeaders(opts.cors);
    this.#server = Deno.serve(
      { hostname: opts.hostname, port: opts.port, onListen: () => {} },
      (req) => this.#handle(req),
    );
    this.addr = this.#server.addr;
    this.finished = this.#server.finished;
  }

  ready(e: ServeEngine): void {
    this.#engine = e;
  }

  idle(): Promise<void> {
    if (this.#inFlight.size === 0) return Promise.resolve();
    if (!this.#idle) {
      let resolve!: () => void;
      const promise = new Promise<void>((r) => (resolve = r));
      this.#idle = { promise, resolve };
    }
    return this.#idle.promise;
  }

  async shutdown(graceSeconds: number): Promise<void> {
    this.#accepting = false;
    const stopped = this.#server.shutdown();
    const timer = setTimeout(() => {
      for (const ac of this.#inFlight) ac.abort(new Error("server shutting down"));
    }, graceSeconds * 1000);
    try {
      await stopped;
    } finally {
      clearTimeout(timer);
    }
  }

  #json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
    return new Response(JSON.stringify(body), { status, headers: { ...JSON_HEADERS, ...this.#cors, ...headers } });
  }

  #authorized(req: Request): boolean {
    if (!this.#apiKey) return true;
    const m = /^Bearer (.+)$/.exec(req.headers.get("authorization") ?? "");
    return m !== null && timingSafeEqual(digest(m[1]), this.#apiKey);
  }

  /** Admits a request (503 while shutting down, 429 beyond the queue); `release` frees its place. */
  #admit(): { ac: AbortController; release: () => void } {
    const opts = this.#opts;
    if (!this.#accepting) throw new ApiError(503, "the server is shutting down", null, "shutting_down");
    if (this.#inFlight.size >= opts.parallel + opts.maxQueue) {
      throw new ApiError(
        429,
        `the server is busy: ${opts.parallel} requests generating and ${opts.maxQueue} waiting; retry later`,
        null,
        "queue_full",
        "rate_limit_error",
      );
    }
    const ac = new AbortController();
    this.#inFlight.add(ac);
    return {
      ac,
      release: () => {
        this.#inFlight.delete(ac);
        if (this.#inFlight.size === 0 && this.#idle) (this.#idle.resolve(), this.#idle = undefined);
      },
    };
  }

  /** A generation endpoint: validate, admit, run, answer (JSON or SSE). */
  async #completions(req: Request, kind: "chat" | "completion", note: LogNote): Promise<Response> {
    const opts = this.#opts, metrics = this.#metrics;
    const e = this.#engine;
    if (!e) throw new ApiError(503, "the model is still loading", null, "model_loading");
    const body = await readBody(req, opts.maxBodyBytes);
    let parsed: unknown;
    try {
      parsed = JSON.parse(body);
    } catch {
      throw new ApiError(400, "the request body is not valid JSON");
    }
    const { request: r, task } = serveTask(e, kind, parsed, opts.modelName);
    const prompt = task.promptIds;
    const { ac, release } = this.#admit();

    const id = randomId(kind === "chat" ? "chatcmpl-" : "cmpl-");
    note.id = id;
    const head: ResponseHead = { id, created: Math.floor(Date.now() / 1000), model: opts.modelName };
    const onGone = () => ac.abort(new Error("client disconnected"));
    // A streamed response learns of a gone client from its body being cancelled; only a
    // request answered at the end watches its signal (which Deno also aborts on success).
    if (!r.stream) req.signal.addEventListener("abort", onGone);
    const t0 = performance.now();
    let firstAt = 0;
    const finish = (o: Outcome | undefined) => {
      release();
      req.signal.removeEventListener("abort", onGone);
      if (!o) return;
      const n = o.result.tokens.length;
      note.tokensIn = prompt.length;
      note.tokensOut = n;
      note.finish = o.result.finishReason;
      metrics.promptTokens += prompt.length;
      metrics.completionTokens += n;
      if (n > 0) {
        metrics.ttftSeconds += (firstAt - t0) / 1000;
        metrics.ttftCount++;
        metrics.decodeSeconds += (performance.now() - firstAt) / 1000;
        metrics.decodeTokens += n - 1;
      }
    };
    const markFirst = () => (firstAt = performance.now());

    if (!r.stream) {
      let o: Outcome | undefined;
      try {
        o = await runTask(e, task, ac.signal, () => {}, markFirst);
      } finally {
        finish(o);
      }
      if (o.result.finishReason === "interrupted") {
        throw new ApiError(503, "the request was cancelled: the server is shutting down", null, "cancelled");
      }
      return this.#json(200, completionBody(r, head, o, prompt.length));
    }

    // Streaming: headers now, chunks as text becomes safe, [DONE] at the end.
    const events = new EventStream(onGone);
    const chunks = new ChunkWriter(events, r, head);
    (async () => {
      let o: Outcome | undefined;
      try {
        o = await runTask(e, task, ac.signal, (text) => chunks.text(text), markFirst);
        if (o.result.finishReason === "interrupted") {
          chunks.error(new ApiError(503, "the request was cancelled: the server is shutting down", null, "cancelled"));
        } else {
          chunks.finish(o, prompt.length);
        }
      } catch (err) {
        note.status = 500;
        chunks.error(toApiError(err));
      } finally {
        finish(o);
        events.close();
        note.done();
      }
    })();
    note.streaming = true;
    return new Response(events.body, {
      status: 200,
      headers: { "content-type": "text/event-stream", "cache-control": "no-cache", ...this.#cors },
    });
  }

  async #route(req: Request, path: string, note: LogNote): Promise<Response> {
    if (req.method === "OPTIONS" && this.#opts.cors) return new Response(null, { status: 204, headers: this.#cors });
    const want = (method: string) => {
      if (req.method !== method) {
        throw new ApiError(405, `${path} takes ${method}, not ${req.method}`, null, "method_not_allowed");
      }
    };
    if (path === "/health") {
      want("GET");
      return this.#engine ? this.#json(200, { status: "ok" }) : this.#json(503, { status: "loading" });
    }
    if (!this.#authorized(req)) {
      throw new ApiError(401, "a valid API key is required: Authorization: Bearer <key>", null, "invalid_api_key");
    }
    switch (path) {
      case "/v1/models":
        want("GET");
        return this.#json(200, modelList(this.#opts.modelName, this.#created));
      case "/metrics":
        want("GET");
        return new Response(this.#metrics.text(this.#engine, this.#inFlight.size), {
          headers: { "content-type": "text/plain; version=0.0.4", ...this.#cors },
        });
      case "/v1/chat/completions":
        want("POST");
        return await this.#completions(req, "chat", note);
      case "/v1/completions":
        want("POST");
        return await this.#completions(req, "completion", note);
    }
    throw new ApiError(404, `no endpoint ${path}`, null, "not_found");
  }

  /** Answers one request and writes its log line (a stream's when it ends). */
  async #handle(req: Request): Promise<Response> {
    const t0 = performance.now();
    const path = new URL(req.url).pathname;
    const note: LogNote = {
      id: "-",
      status: 0,
      tokensIn: 0,
      tokensOut: 0,
      finish: "-",
      streaming: false,
      done: () =>
        this.#log(
          `k3: ${note.id} ${req.method} ${path} ${note.status} tokens ${note.tokensIn}/${note.tokensOut} ${
            ((performance.now() - t0) / 1000).toFixed(3)
          } s finish ${note.finish}`,
        ),
    };
    let res: Response;
    try {
      res = await this.#route(req, path, note);
    } catch (err) {
      const e = toApiError(err);
      if (e.status >= 500 && !(err instanceof ApiError)) {
        this.#log(`k3: internal error: ${(err as Error)?.stack ?? err}`);
      }
      res = this.#json(e.status, errorBody(e), e.status === 429 ? { "retry-after": "1" } : {});
    }
    this.#metrics.count(path.startsWith("/v1/") || ["/health", "/metrics"].includes(path) ? path : "other", res.status);
    if (!note.status) note.status = res.status;
    if (!note.streaming) note.done();
    return res;
  }
}

/** Starts the server; it answers 503 to generation requests until `ready(engine)`. */
export function startServer(opts: ServerOptions): RunningServer {
  return new HttpServer(opts);
}
