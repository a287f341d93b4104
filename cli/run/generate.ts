/**
 * `k3 run`'s run phase, with the model open: continue a saved state, generate (the text
 * streamed, the per-step table on stderr), and save the state when asked.
 *
 * @module
 */

import { Scheduler, type SequenceResult } from "../../engine/generate/scheduler.ts";
import { makeSampler } from "../../engine/generate/sampling.ts";
import { type LoadedState, loadState, modelFingerprint, saveState } from "../../engine/generate/state_file.ts";
import { ledgerBetween, type LedgerReport, markLedger, readsBetween } from "../../engine/generate/ledger.ts";
import type { OpenedModel } from "../../engine/open.ts";
import { noIoStats } from "../../engine/model/weight_source.ts";
import type { Interrupts } from "../interrupt.ts";
import { info, layerProgress, prefillProgress } from "../progress.ts";
import { sequenceConstraint } from "../structured.ts";
import { Output } from "./output.ts";
import type { RunOptions } from "./options.ts";
import type { PreparedRun } from "./prepare.ts";

/** What the generation did, for the report. */
export interface RunOutcome {
  /** The scheduler's result. */
  result: SequenceResult;
  /** The stdout writer (its text is the generated text). */
  output: Output;
  /** Seconds from the first pass to the last. */
  wall: number;
  /** Where those seconds went. */
  ledger: LedgerReport;
  /** Reads in that time. */
  reads: ReturnType<typeof readsBetween>;
  /** Every step's logits (with --dump-logits only). */
  logitRows: Float32Array[];
}

/** Generates for the prepared run on the open model; saves the state when asked. */
export async function generate(
  opened: OpenedModel,
  interrupts: Interrupts,
  o: RunOptions,
  run: PreparedRun,
  loadSeconds: number,
): Promise<RunOutcome> {
  const { cfg } = run.config;
  const io = () => opened.model.weights.ioStats?.() ?? noIoStats();
  const fp = run.stateFile || o.saveState ? await modelFingerprint(opened) : undefined;
  let loaded: LoadedState | undefined = run.stateFile ? await loadState(run.stateFile, opened.model, fp!) : undefined;
  try {
    info(
      `k3: ${o.dir}: ${cfg.numLayers} layers, hidden ${cfg.hiddenSize}, vocab ${cfg.vocabSize}; ready in ${
        loadSeconds.toFixed(2)
      } s` + (loaded ? `; continuing a saved state of ${loaded.tokens.length} tokens` : ""),
    );
    if (o.mode.stepTable) console.error("step   token   seconds  expert hits   GB read   tok/s");
    let last = io();
    const t1 = performance.now();
    const mark0 = markLedger(opened.model);
    let tLast = t1, stepCount = 0;
    const logitRows: Float32Array[] = [];
    const output = new Output(run.tokenizer, o.gen.stops, o.json, run.stopIds);
    const scheduler = new Scheduler(opened.model, { chunk: opened.plan.chunk, draft: { mode: o.draft } });
    const state = loaded?.state;
    loaded = undefined; // the scheduler owns it now
    opened.model.onLayer = layerProgress(
      run.prompt.length,
      opened.plan.chunk,
      () => io().trunkBytes + io().expertBytes,
    );
    const result = await scheduler.submit({
      prompt: run.prompt,
      maxTokens: o.gen.gen,
      stopIds: run.stopIds,
      choose: makeSampler(o.sampling),
      grammar: o.grammar && sequenceConstraint(o.grammar, run.tokenizer!, cfg.vocabSize, run.stopIds),
      recompute: !o.gen.incremental,
      state,
      keepState: o.saveState !== undefined,
      signal: interrupts.signal,
      onPrefill: prefillProgress(opened.plan.chunk),
      onToken: (token, logits) => {
        if (o.logitsTarget) logitRows.push(logits.slice());
        const now = performance.now(), seconds = (now - tLast) / 1000;
        tLast = now;
        const io1 = io();
        const hits = io1.expertHits - last.expertHits, misses = io1.expertMisses - last.expertMisses;
        const gb = (io1.trunkBytes + io1.expertBytes - last.trunkBytes - last.expertBytes) / 1e9;
        last = io1;
        if (o.mode.stepTable) {
          console.error(
            `${String(stepCount).padStart(4)}  ${String(token).padStart(6)}  ${seconds.toFixed(4).padStart(8)}  ${
              `${hits}/${hits + misses}`.padStart(11)
            }  ${gb.toFixed(3).padStart(8)}  ${(1 / seconds).toFixed(2).padStart(6)}`,
          );
        }
        stepCount++;
        return output.token(token, seconds, logits);
      },
    });
    const wall = (performance.now() - t1) / 1000;
    const mark1 = markLedger(opened.model);
    const outcome = {
      result,
      output,
      wall,
      ledger: ledgerBetween(mark0, mark1),
      reads: readsBetween(mark0, mark1),
      logitRows,
    };
    if (o.saveState) await saveFinalState(opened, scheduler, o.saveState, run, result, fp!);
    return outcome;
  } finally {
    loaded?.state.free();
  }
}

/** Saves the state after the prompt and every generated token to `path`. */
async function saveFinalState(
  opened: OpenedModel,
  scheduler: Scheduler,
  path: string,
  run: PreparedRun,
  result: SequenceResult,
  fp: Awaited<ReturnType<typeof modelFingerprint>>,
): Promise<void> {
  const ids = result.tokens;
  // The state has seen the prompt and every generated token but the last: fold the
  // last one in, so the file is the whole prefix.
  let st = result.state!;
  // close() first: a submit while the finished loop is still unwinding would wait forever.
  await scheduler.close();
  if (ids.length > 0) {
    st = (await scheduler.submit({ prompt: [ids[ids.length - 1]], maxTokens: 0, state: st, keepState: true }))
      .state!;
  }
  try {
    const all = [...(run.stateFile?.header.tokens ?? []), ...run.prompt, ...ids];
    await saveState(path, opened.model, st, all, fp);
    info(`k3: saved the state of ${all.length} tokens to ${path}`);
  } finally {
    st.free();
  }
}
