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
import { Scheduler, SERVE_MAX_STALL_SECONDS } from "../engine/generate/scheduler.ts";
import { readActivity } from "../engine/native/io.ts";
import { openModel, readModelConfig } from "../engine/open.ts";
import { engineEnvironment } from "./environment.ts";
import { intFlag, numFlag, parseFlags } from "./common.ts";
import { CHUNK_HELP, chunkFlag } from "./chunk_flag.ts";
import { MAX_PROMPT_IDS } from "./run_options.ts";
import {
  DRAFT_FLAGS,
  DRAFT_HELP,
  draftOption,
  MEMORY_FLAGS,
  MEMORY_HELP,
  memoryOptions,
  needTokenizer,
} from "./run_options.ts";
import { DEFAULT_LIMITS, startServer } from "./server/http.ts";
import { VERSION } from "./version.ts";
import { createHash } from "node:crypto";
import { openStateCache, STATE_CACHE_FLAGS, STATE_CACHE_HELP, stateCacheFlags } from "./state_cache_flags.ts";
import { stopIds } from "../engine/text/chat.ts";

/** `k3 serve --help`. */
export const USAGE = `usage: k3 serve <model_dir> [options]

An OpenAI-compatible API: POST /v1/chat/completions, POST /v1/completions, POST
/v1/responses, GET /v1/models, GET /v1/models/{id}, GET /health (no key needed), GET
/metrics (Prometheus text). One log line per request on
stderr. SIGTERM or SIGINT: stop accepting, let requests in flight finish within --grace,
cancel the rest, exit 0.

server:
  --host H          address to listen on (default 127.0.0.1; anything else is reachable
                    from other machines, and a warning says so)
  --port P          TCP port (default 8000; 0 picks a free one, printed on stderr)
  --api-key-file F  require "Authorization: Bearer KEY", KEY the file's first line
                    (or set $K3_API_KEY; both keep the key out of the process list)
  --api-key KEY     the same with the key on the command line (visible in ps)
  --served-model-name NAME
                    the model name clients send and see (default: the directory's name)
  --parallel N|auto sequences generating at once (default 4, 1..256; auto: up to 16, the
                    number whose memory plan predicts the most tokens/s)
  --max-queue N     requests waiting beyond those; more get 429 (default 16, 0..100000)
  --context N       positions per sequence, prompt plus completion (default 4096)
  --max-body-kb N   largest request body accepted, 413 beyond (default 1024)
  --grace S         seconds requests in flight get at shutdown (default 10)
  --cors ORIGIN     answer CORS for ORIGIN, or * for any (default: no CORS headers, and
                    cross-origin POSTs are refused)
  --allowed-host H  a Host header name to accept besides the listening address
                    (repeatable; without --host only loopback names are accepted)
  --header-timeout S  seconds for a request's head to arrive (default 10)
  --body-timeout S  seconds for its body after the head (default 30)
  --idle-timeout S  seconds a kept-alive connection may wait for its next request
                    (default 30)
  --max-connections N  TCP connections open at once; more get 503 (default 256)
model:
  --tok DIR         tokenizer directory (default: the model directory)
  --threads N       compute threads (default: all cores; never changes a token)
  ${CHUNK_HELP}
  --layers N        bind and run only the first N layers (diagnostics)
${DRAFT_HELP}
${MEMORY_HELP}
${STATE_CACHE_HELP}
  -h, --help        this help

examples:
  k3 serve tests/fixtures/tiny --port 8000
  k3 serve /data/kimi-k3 --trunk /data/k3-trunk --preset auto --served-model-name kimi-k3 --api-key-file ~/.k3-key
  curl -s http://127.0.0.1:8000/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}]}'
`;

/** `--parallel auto` takes up to this many sequences (the plan picks by predicted tokens/s). */
const MAX_AUTO_PARALLEL = 16;

const LOOPBACK = new Set(["127.0.0.1", "localhost", "::1", "[::1]"]);

/**
 * The API key from `--api-key`, `--api-key-file` (its first line) or $K3_API_KEY, in
 * that order; at most one of the flags; an empty key or an unreadable file is exit 2.
 */
async function apiKeyOf(flag: string | undefined, file: string | undefined): Promise<string | undefined> {
  if (flag !== undefined && file !== undefined) throw usageError("serve: give --api-key or --api-key-file, not both");
  let key = flag;
  if (file !== undefined) {
    try {
      key = (await Deno.readTextFile(file)).split(/\r?\n/)[0];
    } catch (e) {
      throw usageError(`--api-key-file: cannot read ${file}: ${(e as Error).message}`);
    }
  }
  key ??= Deno.env.get("K3_API_KEY") || undefined;
  if (key !== undefined && key.trim().length === 0) {
    throw usageError(`${file !== undefined ? "--api-key-file" : "--api-key"}: the key is empty`);
  }
  return key;
}

/** OpenAI's `system_fingerprint`: what would make the same request answer differently. */
function fingerprint(modelName: string, context: number): string {
  const h = createHash("sha256").update(`${VERSION}\0${modelName}\0${context}`).digest("hex");
  return `fp_k3_${h.slice(0, 12)}`;
}

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
    "api-key-file": { type: "string" },
    "allowed-host": { type: "string", multiple: true },
    "header-timeout": { type: "string" },
    "body-timeout": { type: "string" },
    "idle-timeout": { type: "string" },
    "max-connections": { type: "string" },
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
    ...STATE_CACHE_FLAGS,
    ...DRAFT_FLAGS,
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
  const autoParallel = values.parallel === "auto";
  const parallelAsked = autoParallel ? MAX_AUTO_PARALLEL : intFlag("parallel", values.parallel, 4, 1, 256);
  const draft = draftOption(values.draft);
  const maxQueue = intFlag("max-queue", values["max-queue"], 16, 0, 100000);
  const context = intFlag("context", values.context, 4096, 2, 262144);
  const maxBodyBytes = 1024 * intFlag("max-body-kb", values["max-body-kb"], 1024, 1, 1 << 20);
  const grace = values.grace === undefined ? 10 : numFlag("grace", values.grace, 0, 86400);
  const threads = intFlag("threads", values.threads, navigator.hardwareConcurrency, 1, 256);
  const chunk = chunkFlag(values.chunk, MAX_PROMPT_IDS);
  const apiKey = await apiKeyOf(values["api-key"], values["api-key-file"]);
  const limits = {
    headerTimeoutSeconds: values["header-timeout"] === undefined
      ? DEFAULT_LIMITS.headerTimeoutSeconds
      : numFlag("header-timeout", values["header-timeout"], 0.1, 3600),
    bodyTimeoutSeconds: values["body-timeout"] === undefined
      ? DEFAULT_LIMITS.bodyTimeoutSeconds
      : numFlag("body-timeout", values["body-timeout"], 0.1, 3600),
    idleTimeoutSeconds: values["idle-timeout"] === undefined
      ? DEFAULT_LIMITS.idleTimeoutSeconds
      : numFlag("idle-timeout", values["idle-timeout"], 0.1, 3600),
    maxConnections: intFlag("max-connections", values["max-connections"], DEFAULT_LIMITS.maxConnections, 1, 65536),
  };
  const allowedHosts = values["allowed-host"] ?? [];
  for (const h of allowedHosts) {
    if (!/^[\w.-]{1,253}$|^\[[0-9a-f:.]{2,45}\]$/i.test(h)) {
      throw usageError(`--allowed-host: '${h}' is not a host name (no port, no scheme)`);
    }
  }
  const memory = memoryOptions(tokens);
  const stateCacheAsked = stateCacheFlags(values);
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
  // With --parallel auto the plan decides how many generate at once; until then the
  // server admits the most it could be.
  const serverOptions = {
    hostname: host,
    port,
    modelName,
    apiKey,
    parallel: parallelAsked,
    maxQueue,
    maxBodyBytes,
    cors: values.cors,
    hostExplicit: values.host !== undefined,
    allowedHosts,
    limits,
    fingerprint: fingerprint(modelName, context),
  };
  try {
    server = startServer(serverOptions);
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
    ...engineEnvironment(),
    capacity: context,
    chunk,
    sequences: parallelAsked,
    autoSequences: autoParallel,
    threads,
    memory,
    drafts: draft !== "off",
    predict: true,
    stateCache: { gb: stateCacheAsked.gb },
    log: (line) => console.error(`k3: ${line}`),
  }).catch(async (e) => {
    await server.shutdown(0);
    throw e;
  });
  let stateCache;
  try {
    stateCache = await openStateCache(opened, stateCacheAsked, (line) => console.error(`k3: ${line}`));
  } catch (e) {
    await server.shutdown(0);
    await opened.close();
    throw e;
  }
  const parallel = opened.plan.state.sequences;
  serverOptions.parallel = parallel;
  const scheduler = new Scheduler(opened.model, {
    maxSequences: parallel,
    cache: stateCache,
    draft: { mode: draft },
    maxStallSeconds: SERVE_MAX_STALL_SECONDS,
  });
  try {
    server.ready({
      stateCache,
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
    await stateCache?.settled();
    console.error("k3: stopped");
    return 0;
  } finally {
    await opened.close();
  }
}
