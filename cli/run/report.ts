/**
 * `k3 run`'s report phase: the summary on stderr (prompt eval and eval, speculation,
 * reads), the dumped logits and the `--out` JSON report.
 *
 * @module
 */

import type { OpenedModel } from "../../engine/open.ts";
import { noIoStats } from "../../engine/model/weight_source.ts";
import { formatLedger } from "../../engine/generate/ledger.ts";
import { writeOutput } from "../../engine/native/files.ts";
import { fmtBytes, peakRssBytes, plural } from "../common.ts";
import { info } from "../progress.ts";
import { reportHead, reportSettings, sequenceFields, snakeKeys } from "../report.ts";
import type { RunOutcome } from "./generate.ts";
import type { RunOptions } from "./options.ts";
import type { PreparedRun } from "./prepare.ts";

/** Writes the end of stdout, the summary, the logits and the report of a finished run. */
export async function reportRun(
  opened: OpenedModel,
  o: RunOptions,
  run: PreparedRun,
  { result, output, wall, ledger, reads, logitRows }: RunOutcome,
  loadSeconds: number,
): Promise<void> {
  const { cfg } = run.config;
  const weights = opened.model.weights;
  if (o.ledger) { for (const line of formatLedger(ledger)) info(`k3: ${line}`); }
  const ioWait = ledger.trunk_read_wait_seconds + ledger.expert_read_wait_seconds;
  const ids = result.tokens, prompt = run.prompt;
  const settings = reportSettings({
    modelDir: o.dir,
    layers: cfg.numLayers,
    gen: o.gen.gen,
    stopIds: run.stopIds,
    stops: o.gen.stops,
    sampling: o.sampling,
    incremental: o.gen.incremental,
    memory: o.memory,
    chunk: opened.plan.chunk,
    threads: o.gen.threads,
    parallel: 1,
  });
  const seq = sequenceFields({
    promptTokens: prompt.length,
    completionTokens: ids.length,
    finishReason: result.finishReason,
    prefillSeconds: result.prefillSeconds,
    decodeSeconds: result.decodeSeconds,
  });
  output.end({ ...reportHead("run_json_summary"), ...seq, generated_ids: ids, settings });
  const n = Math.max(ids.length, 1);
  const peak = peakRssBytes();
  const stats = weights.ioStats?.() ?? noIoStats();
  const lookups = stats.expertHits + stats.expertMisses;
  // Prompt eval and eval apart, as llama.cpp reports them: prefill speed is tokens/s of
  // the prompt, decode speed s/token of the tokens after the first.
  const decoded = Math.max(ids.length - 1, 0);
  info(
    `k3: prompt eval ${prompt.length} ${plural(prompt.length, "token")} in ${seq.prefill_seconds.toFixed(3)} s (${
      seq.prompt_tokens_per_second.toFixed(1)
    } tokens/s); eval ${decoded} ${plural(decoded, "token")} in ${seq.decode_seconds.toFixed(3)} s (${
      seq.decode_seconds_per_token.toFixed(4)
    } s/token); finish_reason ${result.finishReason}; PEAK RSS ${fmtBytes(peak)} (quote this, not the plan)`,
  );
  if (result.draft && result.draft.passes > 0) {
    const d = result.draft;
    info(
      `k3: speculation (${o.draft}): ${d.accepted} of ${d.drafted} draft tokens accepted over ${d.passes} ${
        plural(d.passes, "pass", "passes")
      } (${(d.accepted / d.passes).toFixed(2)} per drafted pass)` +
        (d.off ? "; turned off: its drafts did not match" : ""),
    );
  }
  if (weights.ioStats) {
    info(
      `k3: read ${fmtBytes(stats.trunkBytes)} trunk, ${fmtBytes(stats.expertBytes)} experts (${
        fmtBytes(Math.round(stats.trunkBytes / n))
      } + ${fmtBytes(Math.round(stats.expertBytes / n))} per token); expert cache hit rate ${
        lookups ? ((100 * stats.expertHits) / lookups).toFixed(1) : "0.0"
      }%; ` +
        `${stats.pinnedLayers} trunk layers pinned; I/O wait ${
          ((100 * ioWait) / Math.max(wall, 1e-9)).toFixed(1)
        }% of wall clock`,
    );
  }
  if (o.logitsTarget) {
    const all = new Float32Array(logitRows.length * cfg.vocabSize);
    logitRows.forEach((r, i) => all.set(r, i * cfg.vocabSize));
    await writeOutput(o.logitsTarget, new Uint8Array(all.buffer));
  }
  if (o.outTarget) {
    const report = {
      ...reportHead("run"),
      settings,
      ...seq,
      prompt_ids: prompt,
      generated_ids: ids,
      generated_text: run.tokenizer ? output.text : null,
      loaded_state_tokens: run.stateFile ? run.stateFile.header.pos : null,
      load_seconds: loadSeconds,
      wall_seconds: wall,
      seconds_per_token: ids.length ? wall / ids.length : 0,
      step_seconds: result.stepSeconds,
      peak_rss_bytes: peak,
      trunk_bytes_read: stats.trunkBytes,
      expert_bytes_read: stats.expertBytes,
      trunk_bytes_per_token: stats.trunkBytes / n,
      trunk_bytes_read_early: stats.trunkEarlyBytes,
      trunk_bytes_stored: stats.trunkStoredBytes,
      trunk_decode_cpu_seconds: stats.trunkDecodeSeconds,
      trunk_bytes_left_coded: stats.trunkCodedBytes,
      expert_bytes_per_token: stats.expertBytes / n,
      expert_cache_hits: stats.expertHits,
      expert_cache_misses: stats.expertMisses,
      // Distinct routed experts summed over the passes' layers (one segment: each
      // (layer, expert) any row chose, once).
      experts_routed: opened.model.stats.expertsUsed,
      expert_cache_hit_rate: lookups ? stats.expertHits / lookups : 0,
      // Reads issued on a guess of the next layer's routing (their right guesses are hits).
      expert_reads_ahead: stats.expertPrefetched,
      expert_reads_ahead_taken: stats.expertPrefetchHits,
      // Resident weights are all in RAM: every layer is pinned, as the plan says.
      trunk_layers_pinned: weights.ioStats ? stats.pinnedLayers : cfg.numLayers,
      io_wait_seconds: ioWait,
      io_share: ioWait / Math.max(wall, 1e-9),
      read_busy_seconds: reads.busySeconds,
      read_bytes: reads.bytes,
      ledger,
      memory: snakeKeys(opened.plan ?? null),
      draft: { mode: o.draft, ...(result.draft ?? { passes: 0, drafted: 0, accepted: 0, off: false }) },
    };
    await writeOutput(o.outTarget, JSON.stringify(report, null, 2) + "\n");
  }
}
