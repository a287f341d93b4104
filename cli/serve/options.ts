/**
 * `k3 serve`'s flags (declared once: the parser and `--help` both come from them) and the
 * options they give, checked before anything listens or loads.
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";
import type { DraftMode } from "../../engine/generate/draft.ts";
import { type CommandFlags, commandFlags, type FlagGroup } from "../flags.ts";
import { intFlag, numFlag } from "../common.ts";
import {
  contextFlag,
  contextHelp,
  type ContextRequest,
  MODEL_GROUP,
  type ModelFlags,
  modelFlags,
} from "../flag_groups/model.ts";
import { MEMORY_GROUP, memoryOptions } from "../flag_groups/memory.ts";
import { draftOption, SPECULATION_GROUP } from "../flag_groups/speculation.ts";
import { REASONING_GROUP, reasoningBudgetOption } from "../flag_groups/reasoning.ts";
import { STATE_CACHE_GROUP, type StateCacheFlags, stateCacheFlags } from "../state_cache_flags.ts";
import { DEFAULT_LIMITS } from "../server/http.ts";

/** Where and how the server listens and admits requests. */
const SERVER_GROUP: FlagGroup = {
  name: "server",
  title: "server",
  flags: {
    host: {
      type: "string",
      value: "H",
      help: "address to listen on (default 127.0.0.1; anything else is reachable\n" +
        "from other machines, and a warning says so)",
    },
    port: { type: "string", value: "P", help: "TCP port (default 8000; 0 picks a free one, printed on stderr)" },
    "api-key-file": {
      type: "string",
      value: "F",
      file: "key",
      help: 'require "Authorization: Bearer KEY", KEY the file\'s first line\n' +
        "(or set $K3_API_KEY; both keep the key out of the process list)",
    },
    "api-key": { type: "string", value: "KEY", help: "the same with the key on the command line (visible in ps)" },
    "served-model-name": {
      type: "string",
      multiple: true,
      value: "NAME",
      help: "the model name clients send and see (default: the directory's name;\n" +
        "repeatable: every name is served, the first one listed first)",
    },
    parallel: {
      type: "string",
      value: "N|auto",
      help: "sequences generating at once (default 4, 1..256; auto: up to 16, the\n" +
        "number whose memory plan predicts the most tokens/s)",
    },
    "max-queue": {
      type: "string",
      value: "N",
      help: "requests waiting beyond those; more get 429 (default 16, 0..100000)",
    },
    context: { type: "string", value: "N|auto", help: contextHelp("positions per sequence, prompt plus completion") },
    "max-body-kb": { type: "string", value: "N", help: "largest request body accepted, 413 beyond (default 1024)" },
    grace: { type: "string", value: "S", help: "seconds requests in flight get at shutdown (default 10)" },
    cors: {
      type: "string",
      value: "ORIGIN",
      help: "answer CORS for ORIGIN, or * for any (default: no CORS headers, and\ncross-origin POSTs are refused)",
    },
    "allowed-host": {
      type: "string",
      multiple: true,
      value: "H",
      help: "a Host header name to accept besides the listening address\n" +
        "(repeatable; without --host only loopback names are accepted)",
    },
    "header-timeout": { type: "string", value: "S", help: "seconds for a request's head to arrive (default 10)" },
    "body-timeout": { type: "string", value: "S", help: "seconds for its body after the head (default 30)" },
    "idle-timeout": {
      type: "string",
      value: "S",
      help: "seconds a kept-alive connection may wait for its next request\n(default 30)",
    },
    "send-timeout": {
      type: "string",
      value: "S",
      help:
        "seconds a write to a client may make no progress before its\nconnection is closed and its request cancelled (default 30)",
    },
    "max-connections": {
      type: "string",
      value: "N",
      help: "TCP connections open at once; more get 503 (default 256)",
    },
  },
};

/** `k3 serve`'s flags and help. */
export const SERVE_FLAGS: CommandFlags = commandFlags({
  name: "serve",
  head: `usage: k3 serve <model_dir> [options]

An OpenAI-compatible API: POST /v1/chat/completions, POST /v1/completions, POST
/v1/responses, GET /v1/models, GET /v1/models/{id}, POST /tokenize, POST /detokenize,
POST /apply-template (a request's prompt), GET /health (no key needed), GET
/metrics (Prometheus text). One log line per request on
stderr. SIGTERM or SIGINT: stop accepting, let requests in flight finish within --grace,
cancel the rest, exit 0.`,
  groups: [SERVER_GROUP, MODEL_GROUP, SPECULATION_GROUP, REASONING_GROUP, MEMORY_GROUP, STATE_CACHE_GROUP],
  tail: `examples:
  k3 serve tests/fixtures/tiny --port 8000
  k3 serve /data/kimi-k3 --trunk /data/k3-trunk --preset auto --served-model-name kimi-k3 --api-key-file ~/.k3-key
  curl -s http://127.0.0.1:8000/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}]}'`,
});

/** `--parallel auto` takes up to this many sequences (the plan picks by predicted tokens/s). */
const MAX_AUTO_PARALLEL = 16;

/** Everything `k3 serve`'s flags asked for. */
export interface ServeOptions {
  /** The model directory. */
  dir: string;
  /** --host (default 127.0.0.1). */
  host: string;
  /** Whether --host was given. */
  hostExplicit: boolean;
  /** --port. */
  port: number;
  /** --parallel auto. */
  autoParallel: boolean;
  /** Sequences asked for (the most, with auto). */
  parallel: number;
  /** Speculation. */
  draft: DraftMode;
  /** --reasoning-budget: the default budget of thinking chat requests. */
  reasoningBudget?: number;
  /** Requests waiting at most. */
  maxQueue: number;
  /** Positions per sequence, or auto. */
  context: ContextRequest;
  /** Largest request body. */
  maxBodyBytes: number;
  /** Seconds for requests in flight at shutdown. */
  grace: number;
  /** --cors. */
  cors?: string;
  /** --api-key or --api-key-file, as given (read in prepare). */
  apiKey?: string;
  /** --api-key-file. */
  apiKeyFile?: string;
  /** Connection limits. */
  limits: Partial<typeof DEFAULT_LIMITS>;
  /** --allowed-host names. */
  allowedHosts: string[];
  /** The first --served-model-name. */
  servedModelName?: string;
  /** The other --served-model-names: aliases a request may name. */
  modelAliases: string[];
  /** The model group. */
  model: ModelFlags;
  /** The memory budget. */
  memory: MemoryOptions;
  /** The state cache flags. */
  stateCache: StateCacheFlags;
}

/** A seconds flag in 0.1..3600, or `dflt`. */
function seconds(name: string, value: string | undefined, dflt: number): number {
  return value === undefined ? dflt : numFlag(name, value, 0.1, 3600);
}

/** Parses `k3 serve`'s arguments; undefined after printing `--help`. */
export function serveOptions(args: string[]): ServeOptions | undefined {
  const flags = SERVE_FLAGS.parseUnlessHelp(args);
  if (flags === undefined) return undefined;
  const { values, positionals, tokens } = flags;
  if (positionals.length !== 1) throw usageError("serve: expected exactly one <model_dir> (see k3 serve --help)");
  const autoParallel = flags.str("parallel") === "auto";
  const grace = flags.str("grace");
  const options = {
    dir: positionals[0],
    host: flags.str("host") ?? "127.0.0.1",
    hostExplicit: flags.str("host") !== undefined,
    port: intFlag("port", flags.str("port"), 8000, 0, 65535),
    autoParallel,
    parallel: autoParallel ? MAX_AUTO_PARALLEL : intFlag("parallel", flags.str("parallel"), 4, 1, 256),
    draft: draftOption(flags.str("draft")),
    reasoningBudget: reasoningBudgetOption(flags.str("reasoning-budget")),
    maxQueue: intFlag("max-queue", flags.str("max-queue"), 16, 0, 100000),
    context: contextFlag(flags.str("context"), 2),
    maxBodyBytes: 1024 * intFlag("max-body-kb", flags.str("max-body-kb"), 1024, 1, 1 << 20),
    grace: grace === undefined ? 10 : numFlag("grace", grace, 0, 86400),
    cors: flags.str("cors"),
    apiKey: flags.str("api-key"),
    apiKeyFile: flags.str("api-key-file"),
    limits: {
      headerTimeoutSeconds: seconds("header-timeout", flags.str("header-timeout"), DEFAULT_LIMITS.headerTimeoutSeconds),
      bodyTimeoutSeconds: seconds("body-timeout", flags.str("body-timeout"), DEFAULT_LIMITS.bodyTimeoutSeconds),
      idleTimeoutSeconds: seconds("idle-timeout", flags.str("idle-timeout"), DEFAULT_LIMITS.idleTimeoutSeconds),
      sendTimeoutSeconds: seconds("send-timeout", flags.str("send-timeout"), DEFAULT_LIMITS.sendTimeoutSeconds),
      maxConnections: intFlag(
        "max-connections",
        flags.str("max-connections"),
        DEFAULT_LIMITS.maxConnections,
        1,
        65536,
      ),
    },
    allowedHosts: flags.list("allowed-host") ?? [],
    servedModelName: flags.list("served-model-name")?.[0],
    modelAliases: flags.list("served-model-name")?.slice(1) ?? [],
    model: modelFlags(values),
    memory: memoryOptions(tokens),
    stateCache: stateCacheFlags(values),
  };
  for (const h of options.allowedHosts) {
    if (!/^[\w.-]{1,253}$|^\[[0-9a-f:.]{2,45}\]$/i.test(h)) {
      throw usageError(`--allowed-host: '${h}' is not a host name (no port, no scheme)`);
    }
  }
  return options;
}
