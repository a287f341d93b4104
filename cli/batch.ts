/**
 * `k3 batch <model_dir> --input prompts.jsonl --output results.jsonl`: greedy generation
 * for every prompt of a JSONL file, with the model opened once.
 *
 * Each result line is appended and fsync'ed as soon as its prompt finishes, so a killed
 * run loses nothing already done; a rerun with the same output file skips the ids already
 * there (a torn last line, from a kill mid-write, is cut away first). Malformed input lines
 * are reported with their line number and skipped; the exit code is 1 when any was.
 *
 * @module
 */

import { EXIT } from "../engine/errors.ts";
import type { OpenOptions } from "../engine/open.ts";
import { progress } from "./progress.ts";
import { withOpenModel } from "./model_session.ts";
import type { Job } from "./batch/jobs.ts";
import { runJobs } from "./batch/run.ts";
import { openStateCache } from "./state_cache_flags.ts";
import { AppendLog } from "./batch/append_log.ts";
import { type BatchOptions, batchOptions } from "./batch/options.ts";
import { prepareBatch } from "./batch/prepare.ts";
import { reportBatch } from "./batch/report.ts";

/** `--parallel auto` takes the most prompts at once that the memory plan holds, up to this. */
const MAX_AUTO_PARALLEL = 16;

/** How the model is opened for the lines to run. */
function batchOpenOptions(o: BatchOptions, todo: Job[]): OpenOptions {
  return {
    capacity: todo.reduce((m, j) => Math.max(m, j.promptIds.length + j.maxTokens), 0),
    chunk: o.gen.chunk,
    sequences: Math.min(o.parallel ?? MAX_AUTO_PARALLEL, todo.length),
    autoSequences: o.parallel === undefined,
    threads: o.gen.threads,
    memory: o.memory,
    drafts: o.draft !== "off" && o.gen.incremental,
    predict: true,
    stateCache: { gb: o.stateCache.gb },
    log: (line) => console.error(`k3: ${line}`),
    onProgress: (what, d, n) => progress(what, d, n),
  };
}

/** Runs `k3 batch`; returns the exit code, throws K3Error on failure. */
export async function main(args: string[]): Promise<number> {
  const o = batchOptions(args);
  if (!o) return EXIT.ok;
  const batch = await prepareBatch(o);
  const exitCode = batch.failed ? EXIT.runtime : EXIT.ok;
  const out = await AppendLog.open(o.target, o.output);
  try {
    // OpenAI requests that did not validate are answered at once (status 400), as the
    // Batch API does.
    for (const job of batch.todo.filter((j) => j.immediate)) {
      out.append(job.immediate);
      console.error(`k3: batch: ${o.input}:${job.line}: custom_id ${job.key.slice(10)}: answered 400`);
    }
    const todo = batch.todo.filter((j) => !j.immediate);
    if (todo.length === 0) return exitCode;
    const { cfg } = batch.config;
    const t0 = performance.now();
    const openOptions = batchOpenOptions(o, todo);
    // A killed batch loses nothing (every result is fsync'ed; a rerun resumes): the
    // signals keep ending it.
    await withOpenModel(batch.config, openOptions, async (opened) => {
      const inFlight = opened.plan.state.sequences;
      console.error(
        `k3: ${o.dir}: ${cfg.numLayers} layers, hidden ${cfg.hiddenSize}, vocab ${cfg.vocabSize}; capacity ${openOptions.capacity} positions; ${inFlight} ${
          inFlight === 1 ? "prompt" : "prompts"
        } at a time; ready in ${((performance.now() - t0) / 1000).toFixed(2)} s`,
      );
      const log = (line: string) => console.error(`k3: ${line}`);
      const stateCache = o.gen.incremental ? await openStateCache(opened, o.stateCache, log) : undefined;
      const run = await runJobs(opened.model, todo, {
        stateCache,
        inFlight,
        chunk: opened.plan.chunk,
        incremental: o.gen.incremental,
        draft: o.draft,
        tokenizer: batch.tokenizer,
        settings: batch.settings,
        out,
      });
      await reportBatch(opened, o, batch, run, todo.length, inFlight);
    }, { signals: false });
    return exitCode;
  } finally {
    out.close();
  }
}
