/**
 * `k3 batch`'s prepare phase, before the model opens: the config, the tokenizer, every
 * input line parsed, the output's finished ids (resume) and the settings they must match.
 *
 * @module
 */

import { EXIT, usageError } from "../../engine/errors.ts";
import { modelWindow } from "../../engine/model/config.ts";
import { type ModelConfig, readModelConfig } from "../../engine/open.ts";
import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import { readInput } from "../../engine/native/files.ts";
import { parseIds, plural } from "../common.ts";
import { reportSettings } from "../report.ts";
import { loadModelTokenizer, tokenizerDir } from "../run_options.ts";
import { type Job, readJobs } from "./jobs.ts";
import { readDone, resumeMismatch } from "./resume.ts";
import type { BatchOptions } from "./options.ts";

/** What the batch runs. */
export interface PreparedBatch {
  /** The model's config. */
  config: ModelConfig;
  /** The tokenizer, when there is one. */
  tokenizer?: Tokenizer;
  /** The lines still to run (OpenAI lines that did not validate have `immediate`). */
  todo: Job[];
  /** Malformed input lines (skipped). */
  failed: number;
  /** The settings recorded in every result line. */
  settings: ReturnType<typeof reportSettings>;
}

/** Reads the input and the output so far; a resume under other settings is refused. */
export async function prepareBatch(o: BatchOptions): Promise<PreparedBatch> {
  const config = await readModelConfig(o.dir, o.gen.layers);
  const { cfg } = config;
  const stopIds = o.gen.stopIds.map((s) => parseIds("stop-id", s, cfg.vocabSize)[0]);
  const inputBytes = readInput(o.input, { what: "--input", maxBytes: 1 << 30, allowStdin: true, exitCode: EXIT.usage });
  const tokDir = tokenizerDir(o.dir, o.gen.tokDir);
  let tokenizer: Tokenizer | undefined;
  const getTokenizer = () => (tokDir ? (tokenizer ??= loadModelTokenizer(tokDir, cfg.vocabSize)) : undefined);
  if (tokDir) getTokenizer(); // generated text for every line, and a bad --tok fails up front

  // Parse every line first: the model's capacity is the longest prompt + gen.
  const { jobs, failed } = readJobs(inputBytes, o.input, {
    vocab: cfg.vocabSize,
    maxPromptIds: modelWindow(cfg),
    gen: o.gen.gen,
    stopIds,
    tokenizer: getTokenizer,
    sampling: o.sampling,
    stops: o.gen.stops,
    modelName: o.dir.replace(/\/+$/, "").split("/").pop() || "kimi-k3",
    reasoningBudget: o.reasoningBudget,
  });

  // Resume only from a regular file: stdout, a FIFO or a device is written, never read.
  const { done, cutBytes, settings: recorded } = o.target.kind === "atomic"
    ? await readDone(o.target.real)
    : { done: new Set<string>(), cutBytes: 0, settings: [] };
  if (cutBytes > 0) {
    console.error(`k3: batch: ${o.output}: cut a torn last line (${cutBytes} bytes) left by an interrupted run`);
  }
  // The settings of this run, recorded in every result line: a resume under settings that
  // change tokens would mix two experiments in one file under one name.
  const settings = reportSettings({
    modelDir: o.dir,
    layers: cfg.numLayers,
    gen: o.gen.gen,
    stopIds,
    sampling: o.sampling,
    incremental: o.gen.incremental,
    memory: o.memory,
    chunk: o.gen.chunk,
    threads: o.gen.threads,
    parallel: o.parallel ?? 0,
  });
  const mismatch = resumeMismatch(recorded, settings);
  if (mismatch && !o.forceResume) {
    throw usageError(
      `batch: ${o.output} holds results made with other settings (${mismatch}); ` +
        "use another --output, or --force-resume to add to it anyway",
    );
  }
  if (mismatch) console.error(`k3: batch: --force-resume: adding to ${o.output} despite ${mismatch}`);
  const todo = jobs.filter((j) => !done.has(j.key));
  console.error(
    `k3: batch: ${jobs.length} ${plural(jobs.length, "prompt")} in ${o.input}` +
      (jobs.length - todo.length ? `, ${jobs.length - todo.length} already in ${o.output}` : "") +
      (failed ? `, ${failed} malformed ${plural(failed, "line")} skipped` : "") + `; ${todo.length} to run`,
  );
  return { config, tokenizer, todo, failed, settings };
}
