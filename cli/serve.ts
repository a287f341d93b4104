/**
 * `k3 serve <model_dir>`: an OpenAI-compatible HTTP server (cli/server/) on the batching
 * scheduler. Listens first (so /health answers 503 while the model loads), opens the
 * model within the memory plan, then serves until SIGTERM or SIGINT: it stops accepting,
 * gives in-flight requests a grace period, cancels what is left and exits 0.
 *
 * @module
 */

import { basename } from "node:path";
import { usageError } from "../engine/errors.ts";
import { Scheduler } from "../engine/generate/scheduler.ts";
import { readActivity } from "../engine/native/io.ts";
import { openModel, readModelConfig } from "../engine/open.ts";
import { intFlag, numFlag, parseFlags } from "./common.ts";
import { MEMORY_FLAGS, MEMORY_HELP, memoryOptions, needTokenizer } from "./run_options.ts";
import { startServer } from "./server/http.ts";
import { stopIds } from "../engine/text/chat.ts";

/** `k3 serve --help`. */
export const USAGE = `usage: k3 serve <model_dir> [options]

An OpenAI-compatible API: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
GET /health (no key needed), GET /metrics (Prometheus text). One log line per request on
stderr. SIGTERM or SIGINT: stop accepting, let requests in flight finish within --grace,
cancel the rest, exit 0.

server:
  --host H          address to listen on (default 127.0.0.1; anything else is reachable
                    from other machines, and a warning says so)
  --port P          TCP port (default 8000; 0 picks a free one, printed on stderr)
  --api-key KEY     require "Authorization: Bearer KEY" (default: $K3_API_KEY when set)
  --served-model-name NAME
                    the model name clients send and see (default: the directory's name)
  --parallel N      sequences generating at once (default 4, 1..256)
  --max-queue N     requests waiting beyond those; more get 429 (default 16, 0..100000)
  --context N       positions per sequence, prompt plus completion (default 4096)
  --max-body-kb N   largest request body accepted, 413 beyond (default 1024)
  --grace S         seconds requests in flight get at shutdown (default 10)
  --cors ORIGIN     answer CORS for ORIGIN (default: no CORS headers)
model:
  --tok DIR         tokenizer directory (default: the model directory)
  --threads N       compute threads (default: all cores; never changes a token)
  --chunk N         prefill tokens per forward call (default 16, 1..256)
  --layers N        bind and run only the first N layers (diagnostics)
${MEMORY_HELP}
  -h, --help        this help

examples:
  k3 serve tests/fixtures/tiny --port 8000
  k3 serve /data/kimi-k3 --trunk /data/k3-trunk --preset auto --served-model-name kimi-k3 --api-key KEY
  curl -s http://127.0.0.1:8000/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}]}'
`;

const LOOPBACK = new Set(["127.0.0.1", "localhost", "::1", "[::1]"]);

/** Resolves on the first SIGTERM or SIGINT. */
function terminated(): Promise<string> {
  return new Promise((resolve) => {
    for (const sig of ["SIGTERM", "SIGINT"] as const) {
      Deno.addSignalListener(sig, () => resolve(sig));
    }
  });
}

/** `k3 serve`: loads the model, serves until SIGTERM/SIGINT; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const { values, positionals, tokens } = parseFlags("serve", args, {
    host: { type: "string" },
    port: { type: "string" },
    "api-key": { type: "string" },
    "served-model-name": { type: "string" },
    parallel: { type: "string" },
    "max-queue": { type: "string" },
    context: { type: "string" },
    "max-body-kb": { type: "string" },
    grace: { type: "string" },
    cors: { type: "string" },
    tok: { type: "string" },
    threads: { type: "string" },
    chunk: { type: "string" },
    layers: { type: "string" },
    ...MEMORY_FLAGS,
    help: { type: "boolean", short: "h" },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length !== 1) throw usageError("serve: expected exactly one <model_dir> (see k3 serve --help)");
  const dir = positionals[0];
  const host = values.host ?? "127.0.0.1";
  const port = intFlag("port", values.port, 8000, 0, 65535);
  const parallel = intFlag("parallel", values.parallel, 4, 1, 256);
  const maxQueue = intFlag("max-queue", values["max-queue"], 16, 0, 100000);
  const context = intFlag("context", values.context, 4096, 2, 262144);
  const maxBodyBytes = 1024 * intFlag("max-body-kb", values["max-body-kb"], 1024, 1, 1 << 20);
  const grace = values.grace === undefined ? 10 : numFlag("grace", values.grace, 0, 86400);
  const threads = intFlag("threads", values.threads, navigator.hardwareConcurrency, 1, 256);
  const chunk = intFlag("chunk", values.chunk, 16, 1, 256);
  const apiKey = values["api-key"] ?? (Deno.env.get("K3_API_KEY") || undefined);
  if (apiKey !== undefined && apiKey.length === 0) throw usageError("--api-key: the key is empty");
  const memory = memoryOptions(tokens);
  const config = await readModelConfig(
    dir,
    values.layers !== undefined ? intFlag("layers", values.layers, 0, 1, 100000) : undefined,
  );
  const { cfg } = config;
  const tokenizer = needTokenizer(dir, values.tok, "serve", cfg.vocabSize);
  // Every request stops at the chat template's end tokens: without them, refuse now rather
  // than fail each request.
  stopIds(tokenizer);
  const modelName = values["served-model-name"] ?? basename(dir.replace(/\/+$/, ""));

  let server;
  try {
    server = startServer({
      hostname: host,
      port,
      modelName,
      apiKey,
      parallel,
      maxQueue,
      maxBodyBytes,
      cors: values.cors,
    });
  } catch (e) {
    const busy = e instanceof Deno.errors.AddrInUse;
    throw usageError(
      busy
        ? `serve: cannot listen on ${host}:${port}: it is already in use (another k3 serve?); pick another --port, or --port 0 for a free one`
        : `serve: cannot listen on ${host}:${port}: ${(e as Error).message.replace(/ \(os error \d+\)/, "")}`,
    );
  }
  const url = `http://${host.includes(":") && !host.startsWith("[") ? `[${host}]` : host}:${server.addr.port}`;
  console.error(`k3: listening on ${url} (model '${modelName}' loading)`);
  if (!LOOPBACK.has(host)) {
    console.error(
      `k3: warning: ${host} is not loopback: anyone who can reach this machine on port ${server.addr.port} can use the model${
        apiKey ? " with the API key" : " (no --api-key set)"
      }`,
    );
  }
  const stop = terminated();
  const opened = await openModel(config, {
    capacity: context,
    chunk,
    sequences: parallel,
    threads,
    memory,
    log: (line) => console.error(`k3: ${line}`),
  }).catch(async (e) => {
    await server.shutdown(0);
    throw e;
  });
  const scheduler = new Scheduler(opened.model, { maxSequences: parallel });
  try {
    server.ready({
      scheduler,
      tokenizer,
      capacity: context,
      vocabSize: cfg.vocabSize,
      bytesRead: () => readActivity.bytes,
    });
    console.error(
      `k3: ready: ${url}/v1 serves '${modelName}' (${parallel} at once, ${maxQueue} waiting, context ${context})`,
    );
    const sig = await Promise.race([stop, server.finished.then(() => "closed")]);
    console.error(`k3: ${sig}: no new requests; ${grace} s for those in flight`);
    await server.shutdown(grace);
    await scheduler.close();
    console.error("k3: stopped");
    return 0;
  } finally {
    await opened.close();
  }
}
