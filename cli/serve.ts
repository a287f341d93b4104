/**
 * `k3 serve <model_dir>`: an OpenAI-compatible HTTP server (cli/server/) on the batching
 * scheduler. Listens first (so /health answers 503 while the model loads), opens the
 * model within the memory plan, then serves until SIGTERM or SIGINT: it stops accepting,
 * gives in-flight requests a grace period, cancels what is left and exits 0. Its phases:
 * options (cli/serve/options.ts), prepare and listen (cli/serve/listen.ts), serve.
 *
 * @module
 */

import { Scheduler, SERVE_MAX_STALL_SECONDS } from "../engine/generate/scheduler.ts";
import type { StateCache } from "../engine/generate/state_cache.ts";
import { readActivity } from "../engine/native/io.ts";
import { markLedger } from "../engine/generate/ledger.ts";
import { StatusHub } from "./server/status.ts";
import type { OpenedModel } from "../engine/open.ts";
import { openStateCache } from "./state_cache_flags.ts";
import { withOpenModel } from "./model_session.ts";
import type { Interrupts } from "./interrupt.ts";
import { type ServeOptions, serveOptions } from "./serve/options.ts";
import { listen, type Listening, type PreparedServe, prepareServe } from "./serve/listen.ts";
import { contextOpenOptions } from "./flag_groups/model.ts";

/** Serves on the open model until SIGTERM/SIGINT (or the server closes), then drains. */
async function serveUntilStopped(
  opened: OpenedModel,
  interrupts: Interrupts,
  o: ServeOptions,
  p: PreparedServe,
  stateCache: StateCache | undefined,
  { server, url, serverOptions }: Listening,
): Promise<void> {
  const parallel = opened.plan.state.sequences;
  serverOptions.parallel = parallel;
  // The status stream's hub: the scheduler calls it after every pass, it reads the queue.
  const status = new StatusHub({
    plan: opened.plan,
    mark: () => markLedger(opened.model),
    queue: () => ({ queued: scheduler.queued, active: scheduler.active }),
    stateCache: stateCache && (() => stateCache.stats),
  });
  const scheduler: Scheduler = new Scheduler(opened.model, {
    onPass: status.onPass,
    maxSequences: parallel,
    cache: stateCache,
    draft: { mode: o.draft },
    maxStallSeconds: SERVE_MAX_STALL_SECONDS,
  });
  server.ready({
    status,
    stateCache,
    scheduler,
    tokenizer: p.tokenizer,
    capacity: opened.plan.state.positions,
    vocabSize: p.config.cfg.vocabSize,
    bytesRead: () => readActivity.bytes,
    reasoningBudget: o.reasoningBudget,
    ledger: () => opened.model.ledger,
  });
  console.error(
    `k3: ready: ${url}/v1 serves '${p.modelName}' (${parallel} at once, ${o.maxQueue} waiting, context ${opened.plan.state.positions})`,
  );
  const signal = interrupts.signal;
  const stopped = new Promise<string>((resolve) => {
    if (signal.aborted) resolve(String(signal.reason));
    signal.addEventListener("abort", () => resolve(String(signal.reason)));
  });
  const sig = await Promise.race([stopped, server.finished.then(() => "closed")]);
  console.error(`k3: ${sig}: no new requests; ${o.grace} s for those in flight`);
  await server.shutdown(o.grace);
  await scheduler.close();
  await stateCache?.settled();
  console.error("k3: stopped");
}

/** `k3 serve`: loads the model, serves until SIGTERM/SIGINT; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const o = serveOptions(args);
  if (!o) return 0;
  const prepared = await prepareServe(o);
  const listening = listen(o, prepared);
  const openOptions = {
    ...contextOpenOptions(o.context, prepared.config.cfg, o.parallel),
    chunk: o.model.chunk,
    sequences: o.parallel,
    autoSequences: o.autoParallel,
    threads: o.model.threads,
    memory: o.memory,
    drafts: o.draft !== "off",
    predict: true,
    stateCache: { gb: o.stateCache.gb },
    log: (line: string) => console.error(`k3: ${line}`),
  };
  let serving = false;
  try {
    // Signals are taken before the model loads: one while loading stops the server once
    // it is loaded; a second one during the grace period changes nothing.
    await withOpenModel(prepared.config, openOptions, async (opened, interrupts) => {
      const stateCache = await openStateCache(opened, o.stateCache, (line) => console.error(`k3: ${line}`));
      serving = true;
      await serveUntilStopped(opened, interrupts, o, prepared, stateCache, listening);
    }, { listenWhileOpening: true, exitOnSecond: false });
  } catch (e) {
    // The model did not open, or the state cache did not: stop listening before failing.
    if (!serving) await listening.server.shutdown(0);
    throw e;
  }
  return 0;
}
