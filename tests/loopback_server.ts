/**
 * The real `k3 serve` server in process on loopback, with a made-up scheduler in place of
 * the model: what the client tests (tests/e2e/*_clients_test.ts, client_schemas_test.ts,
 * responses_rounds_test.ts) start, so each test writes only its scheduler.
 *
 * @module
 */

import type { SequenceRequest, SequenceResult } from "../engine/generate/scheduler.ts";
import type { Tokenizer } from "../engine/text/tokenizer.ts";
import { type ServeEngine, startServer } from "../cli/server/http.ts";

/** The engine and settings of a loopback server. */
export interface LoopbackServe {
  /** Plays the replies (a test's made-up scheduler). */
  scheduler: ServeEngine["scheduler"];
  /** Renders prompts and decodes replies. */
  tokenizer: Tokenizer;
  /** Token ids must be below this. */
  vocabSize: number;
  /** Positions one sequence can hold (default 4096). */
  capacity?: number;
  /** The served model name (default "tiny"). */
  modelName?: string;
  /** Other names a request may give. */
  modelAliases?: string[];
  /** Sequences at once (default 1). */
  parallel?: number;
  /** Requests waiting at most (default 4). */
  maxQueue?: number;
}

/**
 * Runs `fn` with the origin (`http://127.0.0.1:PORT`) of a server on loopback whose engine
 * is `serve`'s scheduler, and shuts the server down after, whatever `fn` does.
 */
export async function withLoopbackServer(serve: LoopbackServe, fn: (origin: string) => Promise<void>): Promise<void> {
  const server = startServer({
    hostname: "127.0.0.1",
    port: 0,
    modelName: serve.modelName ?? "tiny",
    ...(serve.modelAliases ? { modelAliases: serve.modelAliases } : {}),
    parallel: serve.parallel ?? 1,
    maxQueue: serve.maxQueue ?? 4,
    maxBodyBytes: 1 << 20,
    log: () => {},
  });
  server.ready({
    scheduler: serve.scheduler,
    tokenizer: serve.tokenizer,
    capacity: serve.capacity ?? 4096,
    vocabSize: serve.vocabSize,
    bytesRead: () => 0,
  });
  try {
    await fn(`http://127.0.0.1:${server.addr.port}`);
  } finally {
    await server.shutdown(0);
  }
}

/** Whether a made-up scheduler ends the sequence after `id`: its onToken asks to, or `id` is a stop id. */
export function endsAt(req: SequenceRequest, id: number, logits: Float32Array): boolean {
  return req.onToken?.(id, logits) === true || (req.stopIds?.includes(id) ?? false);
}

/** A made-up scheduler's result: `tokens` written for `req`, no time spent, nothing cached. */
export function madeUpResult(
  req: SequenceRequest,
  tokens: number[],
  finishReason: SequenceResult["finishReason"],
): Promise<SequenceResult> {
  return Promise.resolve({
    tokens,
    finishReason,
    promptTokens: req.prompt.length,
    prefillSeconds: 0,
    decodeSeconds: 0,
    stepSeconds: tokens.map(() => 0),
    cachedTokens: 0,
  });
}

/** What scripted replies are written with: a text's tokens, and a tag's opening and closing tokens. */
export interface ReplyPieces {
  /** The tokens of `s` as plain text (special tokens not recognised). */
  text(s: string): number[];
  /** `<|open|>head<|sep|>`. */
  open(head: string): number[];
  /** `<|close|>head<|sep|>`. */
  close(head: string): number[];
}

/** The chat format's pieces in `tok`'s ids, for schedulers that play scripted replies. */
export function replyPieces(tok: Tokenizer): ReplyPieces {
  const OPEN = tok.specialId("<|open|>"), CLOSE = tok.specialId("<|close|>"), SEP = tok.specialId("<|sep|>");
  const text = (s: string) => tok.encode(s, { allowSpecial: false });
  return {
    text,
    open: (head) => [OPEN, ...text(head), SEP],
    close: (head) => [CLOSE, ...text(head), SEP],
  };
}
