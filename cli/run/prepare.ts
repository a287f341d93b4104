/**
 * `k3 run`'s prepare phase: everything checked before the model opens (its config, the
 * tokenizer, the prompt's ids, stop ids, a saved state's header and the context).
 *
 * @module
 */

import { usageError } from "../../engine/errors.ts";
import { modelWindow } from "../../engine/model/config.ts";
import { readStateFile, type StateFile } from "../../engine/generate/state_file.ts";
import { type ModelConfig, readModelConfig } from "../../engine/open.ts";
import type { OpenOptions } from "../../engine/open.ts";
import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import { intFlag, parseIds } from "../common.ts";
import { info, progress } from "../progress.ts";
import { needTokenizer, promptIds, tokenizerDir } from "../run_options.ts";
import type { RunOptions } from "./options.ts";

/** What the run needs once the model is open. */
export interface PreparedRun {
  /** The model's config. */
  config: ModelConfig;
  /** The tokenizer, when there is one (or one is needed). */
  tokenizer?: Tokenizer;
  /** The prompt's ids. */
  prompt: number[];
  /** Ids that end the generation. */
  stopIds: number[];
  /** A saved state to continue (checked for layout and checksum). */
  stateFile?: StateFile;
  /** Positions the model is opened for. */
  context: number;
}

/** Reads and checks everything before the model opens. */
export async function prepareRun(o: RunOptions): Promise<PreparedRun> {
  const config = await readModelConfig(o.dir, o.gen.layers);
  const vocab = config.cfg.vocabSize;
  let tokenizer: Tokenizer | undefined;
  const getTokenizer = () => (tokenizer ??= needTokenizer(o.dir, o.gen.tokDir, "--prompt", vocab));
  const prompt = await promptIds(o.source, vocab, getTokenizer, modelWindow(config.cfg));
  const stopIds = o.gen.stopIds.map((s) => parseIds("stop-id", s, vocab)[0]);
  if (o.grammar) {
    tokenizer ??= needTokenizer(o.dir, o.gen.tokDir, o.grammarFlag, vocab);
    if (stopIds.length === 0) stopIds.push(tokenizer.specialId("[EOS]"));
  }
  if (o.gen.stops.length > 0) tokenizer ??= needTokenizer(o.dir, o.gen.tokDir, "--stop", vocab);
  if (!tokenizer && tokenizerDir(o.dir, o.gen.tokDir)) getTokenizer();
  // A saved state is checked for layout and checksum before the model is opened: its
  // length decides the capacity.
  const stateFile = o.loadState !== undefined ? await readStateFile(o.loadState) : undefined;
  const prefix = stateFile && Number.isSafeInteger(stateFile.header.pos) ? Math.max(0, stateFile.header.pos) : 0;
  const needed = prefix + prompt.length + o.gen.gen;
  const window = modelWindow(config.cfg);
  if (needed > window) {
    throw usageError(
      `this run needs ${needed} positions, more than the model's window of ${window} (max_position_embeddings); lower --gen`,
    );
  }
  const context = o.context === undefined ? needed : intFlag("context", o.context, needed, 1, window);
  if (context < needed) {
    throw usageError(
      `--context ${context}: this run needs ${needed} positions (${
        prefix ? `${prefix} saved + ` : ""
      }${prompt.length} prompt + ${o.gen.gen} --gen); raise --context or lower --gen`,
    );
  }
  return { config, tokenizer, prompt, stopIds, stateFile, context };
}

/** How the model is opened for the run. */
export function runOpenOptions(o: RunOptions, run: PreparedRun): OpenOptions {
  return {
    capacity: run.context,
    capacityRefusal: (most) =>
      `this run needs ${run.context} positions (${run.prompt.length} prompt ids${
        o.context === undefined ? ` + ${o.gen.gen} --gen` : ", --context"
      }) but the memory plan holds at most ${most} at this budget; shorten the prompt, lower ${
        o.context === undefined ? "--gen" : "--context"
      }, or raise the budget (--preset, --trunk-gb, --cache-gb)`,
    chunk: o.gen.chunk,
    prefillTokens: run.prompt.length,
    threads: o.gen.threads,
    memory: o.memory,
    drafts: o.draft !== "off" && o.gen.incremental,
    log: (line) => info(`k3: ${line}`),
    onProgress: (what, d, n) => progress(what, d, n),
  };
}
