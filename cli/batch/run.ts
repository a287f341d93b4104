/**
 * The generation of `k3 batch`: every job a sequence of one scheduler, sharing each pass's
 * trunk and expert reads; each result line appended as its job finishes (finishing order),
 * in batch's report schema or, for an OpenAI line, the Batch output format.
 *
 * @module
 */

import { withPenalties } from "../../engine/generate/penalties.ts";
import { Scheduler, type SequenceResult } from "../../engine/generate/scheduler.ts";
import { ledgerBetween, type LedgerMark, type LedgerReport, markLedger } from "../../engine/generate/ledger.ts";
import type { K3Model } from "../../engine/model/model.ts";
import type { IoStats } from "../../engine/model/weight_source.ts";
import { makeSampler } from "../../engine/generate/sampling.ts";
import type { Tokenizer } from "../../engine/text/tokenizer.ts";
import { fmtBytes, plural } from "../common.ts";
import { fmtDuration } from "../progress.ts";
import { reportHead, type ReportSettings, sequenceFields } from "../report.ts";
import type { AppendLog } from "./append_log.ts";
import type { Job } from "./jobs.ts";
import { openaiResultLine } from "./openai_lines.ts";
import { ReplyStream } from "../reply.ts";
import { taskFilter } from "../structured.ts";
import { sharedPrefixes } from "./shared_prefix.ts";
import type { StateCache } from "../../engine/generate/state_cache.ts";
import type { DraftMode } from "../../engine/generate/draft.ts";

/** Bytes read and expert-cache hits of one prompt (streamed weights only). */
function ioDelta(a: IoStats | undefined, b: IoStats | undefined, ledger: LedgerReport): Record<string, number> {
  if (!a || !b) return {};
  const hits = b.expertHits - a.expertHits, lookups = hits + b.expertMisses - a.expertMisses;
  return {
    trunk_bytes_read: b.trunkBytes - a.trunkBytes,
    expert_bytes_read: b.expertBytes - a.expertBytes,
    expert_cache_hit_rate: lookups ? hits / lookups : 0,
    io_wait_seconds: ledger.trunk_read_wait_seconds + ledger.expert_read_wait_seconds,
  };
}

/** How a batch runs. */
export interface RunOptions {
  /** Sequences at once (the memory plan's). */
  inFlight: number;
  /** Prefill tokens per forward call. */
  chunk: number;
  /** Carry state between steps. */
  incremental: boolean;
  /** The speculation mode (--draft; default suffix). Never changes a token. */
  draft?: DraftMode;
  /** Decodes the generated text (undefined: ids only). */
  tokenizer: Tokenizer | undefined;
  /** The run's settings, recorded in every result line. */
  settings: ReportSettings;
  /** Where result lines go. */
  out: AppendLog;
  /** Lines continue from kept states of the prefixes they share (undefined: off). */
  stateCache?: StateCache;
}

/** What a batch run did, for its summary and report. */
export interface BatchRun {
  /** Tokens generated. */
  tokensDone: number;
  /** When the run started (performance.now()). */
  startedAt: number;
  /** The weights' I/O counters now (undefined: resident weights). */
  io: () => IoStats | undefined;
  /** The counters before the run. */
  io0: IoStats | undefined;
  /** The ledger before the run. */
  start: LedgerMark;
  /** Prompt tokens served from kept states instead of prefilled. */
  cachedTokens: number;
  /** Draft tokens run, over every prompt (speculation never changes a token). */
  drafted: number;
  /** Draft tokens accepted (equal to the token emitted at their position). */
  accepted: number;
}

/**
 * Runs `todo` on `model` and appends each result as it finishes. A prompt whose output is
 * unsound (or whose line cannot be written) stops the run and is thrown.
 */
export async function runJobs(model: K3Model, todo: Job[], opts: RunOptions): Promise<BatchRun> {
  const tokenizer = opts.tokenizer;
  const weights = model.weights;
  const io = () => weights.ioStats?.();
  const io0 = io();
  let tokensDone = 0, finished = 0, cachedTokens = 0, drafted = 0, accepted = 0;
  const t1 = performance.now();
  const start = markLedger(model);
  const cache = opts.incremental ? opts.stateCache : undefined;
  const scheduler = new Scheduler(model, {
    maxSequences: opts.inFlight,
    chunk: opts.chunk,
    cache,
    draft: { mode: opts.draft ?? "suffix" },
  });
  const shared = cache ? sharedPrefixes(todo.map((j) => j.promptIds)) : [];
  // A prompt whose output is unsound stops the run: the others are interrupted and not
  // written (they would resume on a rerun), results already written stay.
  const stop = new AbortController();
  let unsound: unknown;
  const write = (job: Job, r: SequenceResult, admitted: LedgerMark, reply: ReplyStream | undefined) => {
    const text = reply?.text ?? "";
    const ledger = ledgerBetween(admitted, markLedger(model));
    const ids = r.tokens;
    const seconds = r.prefillSeconds + r.decodeSeconds;
    const result = job.openai
      ? openaiResultLine(job.openai, {
        text,
        reply,
        finishReason: r.finishReason as "stop" | "length",
        completionTokens: ids.length,
        cachedTokens: cache ? r.cachedTokens : undefined,
      })
      : {
        ...reportHead("batch_result"),
        id: job.id,
        ...sequenceFields({
          promptTokens: job.promptIds.length,
          completionTokens: ids.length,
          finishReason: r.finishReason,
          prefillSeconds: r.prefillSeconds,
          decodeSeconds: r.decodeSeconds,
        }),
        cached_tokens: r.cachedTokens,
        prompt_ids: job.promptIds,
        generated_ids: ids,
        generated_text: tokenizer ? text : null,
        ...(job.chat && reply ? { reasoning: reply.reasoning, content: reply.text } : {}),
        seconds,
        seconds_per_token: seconds / Math.max(ids.length, 1),
        ...ioDelta(admitted.io, io(), ledger),
        // From admission to finish; with --parallel > 1 the passes were shared.
        ledger,
        settings: { ...opts.settings, parallel: opts.inFlight },
      };
    opts.out.append(result);
    finished++;
    tokensDone += ids.length;
    cachedTokens += r.cachedTokens;
    drafted += r.draft?.drafted ?? 0;
    accepted += r.draft?.accepted ?? 0;
    const elapsed = (performance.now() - t1) / 1000;
    const now = io();
    const bytes = now && io0 ? now.trunkBytes + now.expertBytes - io0.trunkBytes - io0.expertBytes : 0;
    const left = todo.length - finished;
    console.error(
      `k3: batch: ${finished}/${todo.length} done (id ${job.key}: ${ids.length} ${plural(ids.length, "token")} in ${
        seconds.toFixed(3)
      } s); ` +
        `${tokensDone} tokens, ${(tokensDone / elapsed).toFixed(2)} tok/s` +
        (now ? `, ${fmtBytes(Math.round(bytes / Math.max(tokensDone, 1)))} read/token` : "") +
        `, ETA ${left ? fmtDuration((elapsed / finished) * left) : "0 s"}`,
    );
  };
  try {
    await Promise.all(todo.map((job, i) => {
      let admitted = markLedger(model);
      // The reply as it is generated: stop strings cut, a chat read by its markup ids.
      const task = job.openai?.task;
      const reply = tokenizer
        ? new ReplyStream(tokenizer, {
          chat: task ? task.chat : job.chat,
          stops: job.stops,
          logprobs: task?.logprobs,
          ignoreEos: task?.ignoreEos,
        })
        : undefined;
      return scheduler.submit({
        prompt: job.promptIds,
        maxTokens: job.maxTokens,
        stopIds: job.stopIds,
        choose: makeSampler(job.sampling),
        grammar: withPenalties(
          tokenizer && taskFilter(job, tokenizer, model.cfg.vocabSize, job.stopIds, job.logprobs !== undefined),
          job.penalties,
          job.promptIds,
        ),
        onToken: (token, logits) => {
          if (!reply) return;
          const chat = job.chat || task?.chat;
          // A completion's end ids are not text; a chat's reader reads them as the turn's end.
          if (!chat && job.openai && job.stopIds.includes(token)) return;
          return reply.token(token, logits).stop;
        },
        recompute: !opts.incremental,
        cacheAt: shared[i],
        signal: stop.signal,
        onAdmit: () => (admitted = markLedger(model)),
      }).then(
        (r) => {
          try {
            if (r.finishReason !== "interrupted") {
              reply?.end();
              write(job, r, admitted, reply);
            }
          } catch (e) {
            unsound ??= e; // a failed write stops the run like an unsound output
            stop.abort();
          }
        },
        (e) => {
          unsound ??= e;
          stop.abort();
        },
      );
    }));
    if (unsound) throw unsound;
  } finally {
    await scheduler.close();
    await cache?.settled();
  }
  return { tokensDone, startedAt: t1, io, io0, start, cachedTokens, drafted, accepted };
}
