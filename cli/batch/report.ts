/**
 * `k3 batch`'s report phase: the summary line on stderr and the `--report` JSON.
 *
 * @module
 */

import type { OpenedModel } from "../../engine/open.ts";
import { ledgerBetween, markLedger } from "../../engine/generate/ledger.ts";
import { writeOutput } from "../../engine/native/files.ts";
import { fmtBytes, peakRssBytes, plural } from "../common.ts";
import { reportHead, snakeKeys } from "../report.ts";
import type { BatchRun } from "./run.ts";
import type { BatchOptions } from "./options.ts";
import type { PreparedBatch } from "./prepare.ts";

/** Reports a finished batch of `prompts` run `inFlight` at a time. */
export async function reportBatch(
  opened: OpenedModel,
  o: BatchOptions,
  batch: PreparedBatch,
  run: BatchRun,
  prompts: number,
  inFlight: number,
): Promise<void> {
  const { tokensDone, io, io0, start } = run;
  const failed = batch.failed;
  const wall = (performance.now() - run.startedAt) / 1000;
  console.error(
    `k3: batch: ${prompts} ${plural(prompts, "prompt")}, ${tokensDone} ${plural(tokensDone, "token")} in ${
      wall.toFixed(3)
    } s (${(wall / Math.max(tokensDone, 1)).toFixed(4)} s/token); PEAK RSS ${fmtBytes(peakRssBytes())}` +
      (run.cachedTokens ? `; ${run.cachedTokens} prompt tokens from kept states, not prefilled` : "") +
      `; speculation (${o.draft}): ${run.accepted} of ${run.drafted} draft tokens accepted` +
      (failed ? `; ${failed} malformed input ${plural(failed, "line")} skipped (exit 1)` : ""),
  );
  if (!o.reportTarget) return;
  const end = io();
  const report = {
    ...reportHead("batch_report"),
    settings: { ...batch.settings, parallel: inFlight },
    prompts,
    parallel: inFlight,
    generated_tokens: tokensDone,
    cached_tokens: run.cachedTokens,
    draft: { mode: o.draft, drafted: run.drafted, accepted: run.accepted },
    wall_seconds: wall,
    tokens_per_second: tokensDone / wall,
    trunk_bytes_read: end && io0 ? end.trunkBytes - io0.trunkBytes : 0,
    expert_bytes_read: end && io0 ? end.expertBytes - io0.expertBytes : 0,
    peak_rss_bytes: peakRssBytes(),
    ledger: ledgerBetween(start, markLedger(opened.model)),
    memory: snakeKeys(opened.plan),
  };
  await writeOutput(o.reportTarget, JSON.stringify(report, null, 2) + "\n");
}
