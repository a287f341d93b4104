/**
 * `k3 serve`'s prepare phase: the API key, the config and tokenizer, and the listening
 * socket (opened before the model loads, so /health answers 503 meanwhile).
 *
 * @module
 */

import { basename } from "node:path";
import { createHash } from "node:crypto";
import { EXIT, usageError } from "../../engine/errors.ts";
import { readFirstLine } from "../../engine/native/files.ts";
import { type ModelConfig, readModelConfig } from "../../engine/open.ts";
import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import { stopIds } from "../../engine/text/chat.ts";
import { needTokenizer } from "../run_options.ts";
import { type RunningServer, type ServerOptions, startServer } from "../server/http.ts";
import { VERSION } from "../version.ts";
import type { ServeOptions } from "./options.ts";
import type { ContextRequest } from "../flag_groups/model.ts";

/** Host names only this machine reaches. */
const LOOPBACK = new Set(["127.0.0.1", "localhost", "::1", "[::1]"]);

/** The longest key line read from --api-key-file (a pipe sending more is refused). */
const MAX_KEY_BYTES = 4096;

/**
 * The API key from `--api-key`, `--api-key-file` (its first line) or $K3_API_KEY, in
 * that order; at most one of the flags; an empty key or an unreadable file is exit 2.
 */
export async function apiKeyOf(flag: string | undefined, file: string | undefined): Promise<string | undefined> {
  if (flag !== undefined && file !== undefined) throw usageError("serve: give --api-key or --api-key-file, not both");
  let key = flag;
  if (file !== undefined) {
    key = await readFirstLine(file, { what: "--api-key-file", maxBytes: MAX_KEY_BYTES, exitCode: EXIT.usage });
  }
  key ??= Deno.env.get("K3_API_KEY") || undefined;
  if (key !== undefined && key.trim().length === 0) {
    throw usageError(`${file !== undefined ? "--api-key-file" : "--api-key"}: the key is empty`);
  }
  return key;
}

/** OpenAI's `system_fingerprint`: what would make the same request answer differently. */
function fingerprint(modelName: string, context: ContextRequest): string {
  const h = createHash("sha256").update(`${VERSION}\0${modelName}\0${context}`).digest("hex");
  return `fp_k3_${h.slice(0, 12)}`;
}

/** What the server needs before it listens. */
export interface PreparedServe {
  /** The model's config. */
  config: ModelConfig;
  /** The tokenizer (it has the chat template's end tokens). */
  tokenizer: Tokenizer;
  /** The API key, if any. */
  apiKey?: string;
  /** The name clients send and see. */
  modelName: string;
  /** Other names a request may send (`--served-model-name` repeated). */
  modelAliases: string[];
}

/** Reads the key, the config and the tokenizer (refused now if it lacks the chat template's ends). */
export async function prepareServe(o: ServeOptions): Promise<PreparedServe> {
  const apiKey = await apiKeyOf(o.apiKey, o.apiKeyFile);
  const config = await readModelConfig(o.dir, o.model.layers);
  const tokenizer = needTokenizer(o.dir, o.model.tokDir, "serve", config.cfg.vocabSize);
  // Every request stops at the chat template's end tokens: without them, refuse now rather
  // than fail each request.
  stopIds(tokenizer);
  return {
    config,
    tokenizer,
    apiKey,
    modelName: o.servedModelName ?? basename(o.dir.replace(/\/+$/, "")),
    modelAliases: o.modelAliases,
  };
}

/** A server that listens, not yet ready. */
export interface Listening {
  /** The server. */
  server: RunningServer;
  /** Its base URL. */
  url: string;
  /** Its options; `parallel` is set once the plan decides it. */
  serverOptions: ServerOptions;
}

/** Starts listening (so /health answers 503 while the model loads); a busy port is exit 2. */
export function listen(o: ServeOptions, p: PreparedServe): Listening {
  // With --parallel auto the plan decides how many generate at once; until then the
  // server admits the most it could be.
  const serverOptions: ServerOptions = {
    hostname: o.host,
    port: o.port,
    modelName: p.modelName,
    modelAliases: p.modelAliases,
    apiKey: p.apiKey,
    parallel: o.parallel,
    maxQueue: o.maxQueue,
    maxBodyBytes: o.maxBodyBytes,
    cors: o.cors,
    hostExplicit: o.hostExplicit,
    allowedHosts: o.allowedHosts,
    limits: o.limits,
    fingerprint: fingerprint(p.modelName, o.context),
  };
  let server;
  try {
    server = startServer(serverOptions);
  } catch (e) {
    const busy = e instanceof Deno.errors.AddrInUse;
    throw usageError(
      busy
        ? `serve: cannot listen on ${o.host}:${o.port}: it is already in use (another k3 serve?); pick another --port, or --port 0 for a free one`
        : `serve: cannot listen on ${o.host}:${o.port}: ${(e as Error).message.replace(/ \(os error \d+\)/, "")}`,
    );
  }
  const host = o.host;
  const url = `http://${host.includes(":") && !host.startsWith("[") ? `[${host}]` : host}:${server.addr.port}`;
  console.error(`k3: listening on ${url} (model '${p.modelName}' loading)`);
  if (!LOOPBACK.has(host)) {
    console.error(
      `k3: warning: ${host} is not loopback: anyone who can reach this machine on port ${server.addr.port} can use the model${
        p.apiKey ? " with the API key" : " (no --api-key set)"
      }`,
    );
  }
  return { server, url, serverOptions };
}
