/**
 * The metrics of `k3 serve`: counters and gauges of requests, tokens, timing, the batch,
 * connections and the state cache, and their Prometheus text (`GET /metrics`). The
 * routing (cli/server/http.ts) counts into them; nothing here answers a request.
 *
 * @module
 */

import type { ServeEngine } from "./tasks.ts";

/** The endpoint labels of /metrics: a fixed set, whatever paths clients send. */
const ENDPOINTS = [
  "/health",
  "/metrics",
  "/v1/models",
  "/v1/models/{id}",
  "/v1/chat/completions",
  "/v1/completions",
  "/v1/responses",
  "/tokenize",
  "/detokenize",
  "/apply-template",
] as const;

/** The /metrics label of a path: itself when known, else "other". */
export function endpointLabel(path: string): string {
  if ((ENDPOINTS as readonly string[]).includes(path)) return path;
  return path.startsWith("/v1/models/") ? "/v1/models/{id}" : "other";
}

/** The status the log and /metrics give a request whose client went away (nginx's). */
export const CLIENT_GONE = 499;

/** Counters and gauges for /metrics. */
export class Metrics {
  /** Requests answered, by endpoint and status label. */
  readonly #requests = new Map<string, number>();
  #promptTokens = 0;
  #completionTokens = 0;
  #decodeSeconds = 0;
  #decodeTokens = 0;
  #ttftSeconds = 0;
  #ttftCount = 0;
  #clientGone = 0;
  #internalErrors = 0;

  /** A generation request answered: its prompt and generated token counts, its seconds to
   * the first token and after it (time to first token and decode rate). */
  generated(promptTokens: number, tokens: number, firstTokenSeconds: number, decodeSeconds: number): void {
    this.#promptTokens += promptTokens;
    this.#completionTokens += tokens;
    if (tokens === 0) return;
    this.#ttftSeconds += firstTokenSeconds;
    this.#ttftCount++;
    this.#decodeSeconds += decodeSeconds;
    this.#decodeTokens += tokens - 1;
  }

  /** A request answered 500 (logged with its id). */
  internalError(): void {
    this.#internalErrors++;
  }

  /** A request answered with `status` (CLIENT_GONE: counted as a disconnect). */
  count(endpoint: string, status: number): void {
    if (status === CLIENT_GONE) return void this.#clientGone++;
    const key = `endpoint="${endpointLabel(endpoint)}",status="${status < 100 || status > 599 ? 0 : status}"`;
    this.#requests.set(key, (this.#requests.get(key) ?? 0) + 1);
  }

  /** Prometheus text exposition format, version 0.0.4 (`sendTimeouts`: the HTTP layer's count). */
  text(engine: ServeEngine | undefined, inFlight: number, connections: number, sendTimeouts = 0): string {
    const out: string[] = [];
    const metric = (name: string, type: string, help: string, rows: [string, number][]) => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
      for (const [labels, v] of rows) out.push(`${name}${labels ? `{${labels}}` : ""} ${v}`);
    };
    metric("k3_requests_total", "counter", "Requests answered, by endpoint and HTTP status.", [...this.#requests]);
    metric("k3_prompt_tokens_total", "counter", "Prompt tokens of generation requests.", [["", this.#promptTokens]]);
    metric("k3_completion_tokens_total", "counter", "Tokens generated.", [["", this.#completionTokens]]);
    metric("k3_requests_in_flight", "gauge", "Generation requests admitted and not yet answered.", [["", inFlight]]);
    metric("k3_queue_length", "gauge", "Sequences waiting for a slot in the batch.", [[
      "",
      engine?.scheduler.queued ?? 0,
    ]]);
    metric("k3_sequences_in_flight", "gauge", "Sequences in the running batch.", [["", engine?.scheduler.active ?? 0]]);
    metric("k3_read_bytes_total", "counter", "Bytes of weights read from disk.", [["", engine?.bytesRead() ?? 0]]);
    metric("k3_decode_seconds_total", "counter", "Seconds spent generating tokens after the first.", [[
      "",
      this.#decodeSeconds,
    ]]);
    metric("k3_decode_tokens_total", "counter", "Tokens generated after the first (seconds per token = ratio).", [[
      "",
      this.#decodeTokens,
    ]]);
    const ledger = engine?.ledger?.();
    if (ledger) {
      // The engine's passes, not the requests': a pass that prefills some prompt counts as
      // prefill with all its rows (decode rows of other sequences ride along).
      metric("k3_pass_seconds_total", "counter", "Seconds of forward passes, prefill (some prompt rows) or decode.", [
        ['kind="prefill"', ledger.prefillPassSeconds],
        ['kind="decode"', ledger.decodePassSeconds],
      ]);
      metric("k3_pass_rows_total", "counter", "Rows (tokens) of those passes (rows per second = ratio).", [
        ['kind="prefill"', ledger.prefillPassRows],
        ['kind="decode"', ledger.decodePassRows],
      ]);
    }
    metric("k3_time_to_first_token_seconds_total", "counter", "Seconds from admission to the first token.", [[
      "",
      this.#ttftSeconds,
    ]]);
    metric("k3_time_to_first_token_count", "counter", "Requests that produced a first token.", [["", this.#ttftCount]]);
    metric("k3_client_disconnects_total", "counter", "Requests whose client went away or was cut off.", [[
      "",
      this.#clientGone,
    ]]);
    metric("k3_internal_errors_total", "counter", "Requests answered 500 (each logged with its id).", [[
      "",
      this.#internalErrors,
    ]]);
    metric("k3_connections", "gauge", "TCP connections open.", [["", connections]]);
    metric("k3_send_timeouts_total", "counter", "Connections closed because a write made no progress.", [[
      "",
      sendTimeouts,
    ]]);
    const sc = engine?.stateCache?.stats;
    if (sc) {
      const stateCache: [string, string, string, [string, number][]][] = [
        ["hits_total", "counter", "Requests continued from a kept state.", [["", sc.hits]]],
        ["misses_total", "counter", "Requests with no kept prefix.", [["", sc.misses]]],
        ["evictions_total", "counter", "Kept states evicted from RAM.", [["", sc.evictions]]],
        ["bytes", "gauge", "Bytes of kept states, by tier.", [['tier="ram"', sc.bytes], ['tier="disk"', sc.diskBytes]]],
        ["entries", "gauge", "Kept states, by tier.", [['tier="ram"', sc.entries], ['tier="disk"', sc.diskEntries]]],
        ["disk_other_bytes", "gauge", "Spill directory bytes counted against its budget besides kept states.", [[
          "",
          sc.diskOtherBytes,
        ]]],
        ["disk_hits_total", "counter", "Hits read back from the spill directory.", [["", sc.diskHits]]],
        ["refused_total", "counter", "Spill files refused (damaged) and recomputed.", [["", sc.refused]]],
        ["orphans_removed_total", "counter", "Temporary spill files of gone processes removed.", [[
          "",
          sc.orphansRemoved,
        ]]],
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
