/**
 * `k3 run <model_dir>`: generation from one prompt, the text streamed to stdout as tokens
 * arrive, with a report; sampling, stop strings, saved states and clean interruption.
 *
 * @module
 */

import { usageError } from "../engine/errors.ts";
import { Scheduler } from "../engine/generate/scheduler.ts";
import { makeSampler } from "../engine/generate/sampling.ts";
import { StopMatcher } from "../engine/generate/stops.ts";
import { tokenLogprob } from "../engine/generate/logprobs.ts";
import {
  type LoadedState,
  loadState,
  modelFingerprint,
  readStateFile,
  saveState,
  type StateFile,
} from "../engine/generate/state_file.ts";
import { openModel, readModelConfig } from "../engine/open.ts";
import { engineEnvironment } from "./environment.ts";
import { noIoStats } from "../engine/model/weight_source.ts";
import { formatLedger, ledgerBetween, markLedger, readsBetween } from "../engine/generate/ledger.ts";
import type { Tokenizer } from "../engine/text/tokenizer.ts";
import { info, layerProgress, OUTPUT_FLAGS, OUTPUT_HELP, outputMode, prefillProgress, progress } from "./progress.ts";
import { reportHead, reportSettings, sequenceFields, snakeKeys } from "./report.ts";
import { fmtBytes, intFlag, modelDirArg, parseIds, peakRssBytes, plural } from "./common.ts";
import { EXIT_INTERRUPTED, Interrupts, writeStdout } from "./interrupt.ts";
import { prepareOutput, writeOutput } from "../engine/native/files.ts";
import {
  DRAFT_FLAGS,
  DRAFT_HELP,
  draftOption,
  GENERATION_FLAGS,
  GENERATION_HELP,
  generationOptions,
  MEMORY_FLAGS,
  MEMORY_HELP,
  memoryOptions,
  needTokenizer,
  parseFlags,
  promptIds,
  promptSource,
  tokenizerDir,
} from "./run_options.ts";
import { SAMPLING_FLAGS, samplingHelp, samplingOptions } from "./request.ts";
import { GRAMMAR_FLAGS, runGrammar, sequenceConstraint } from "./structured.ts";

/** Usage text of `k3 run`. */
export const USAGE = `usage: k3 run <model_dir> (--prompt TEXT | --prompt-file PATH | --ids 1,2,3) [options]

Generation from one prompt. The text goes to stdout as tokens arrive (the ids, without a
tokenizer); the plan, progress and the summary go to stderr, and the per-step table too
when stderr is not a terminal (or with --verbose). Ctrl-C (SIGINT) or SIGTERM stops
cleanly: what was generated is printed, --out is written with finish_reason
"interrupted", exit 130.

prompt (exactly one):
  -p, --prompt TEXT text, encoded with the tokenizer (special tokens are not recognised)
  --prompt-file P   a UTF-8 file, read verbatim (- reads stdin)
  --ids LIST        token ids, comma-separated (no tokenizer needed)
${GENERATION_HELP}
  --context N       positions the run may hold (default: the prompt, a loaded state and
                    --gen; a smaller one is refused, a larger one sizes the cache)
${samplingHelp("default: greedy")}
${DRAFT_HELP}
output:
  --json            stdout: one JSON object per token {"index","id","text","seconds","logprob"}
                    (logprob: float64 log-softmax of the logits the token was picked from),
                    then {"finish_reason","generated_ids","generated_text","prompt_tokens"}
  --dump-logits F   write the logits of every step, float32 little-endian [steps][vocab]
structured output (the text is the value, then an end id: --stop-id, default [EOS]):
  --grammar json    the output is one JSON value (any)
  --json-schema F   the output is a JSON value the schema in file F allows (the README's
                    "Structured output" lists the subset; anything else is refused)
  --out FILE        write a JSON report (atomically)
saved states (exact prefixes only: a KDA state cannot be rewound):
  --save-state F    after the prompt and any generation, save the sequence state to F
                    (--gen 0 runs the prompt only)
  --load-state F    continue the state saved in F; the prompt is the suffix to add
  --ledger          print where the seconds went (reads, matmuls, experts, attention,
                    head, sampling) and what was read; the report always has it
${MEMORY_HELP}
${OUTPUT_HELP}
  -h, --help        this help

examples:
  k3 run tests/fixtures/tiny --prompt "Once upon a time" --gen 8
  k3 run tests/fixtures/tiny -p "Once upon a time" -n 32 --temperature 0.8 --seed 7
  echo "Once upon a time" | k3 run tests/fixtures/tiny --prompt-file - --quiet
  k3 run tests/fixtures/tiny --ids 5,17,300 --gen 20 --out report.json
  k3 run /data/kimi-k3 --trunk /data/k3-trunk --preset laptop --prompt-file q.txt
`;

/** Writes stdout as tokens arrive: text (stop strings held back and cut), ids, or JSON lines. */
class Output {
  readonly #matcher?: StopMatcher;
  text = "";
  #n = 0;

  constructor(tokenizer: Tokenizer | undefined, stops: string[], readonly json: boolean) {
    if (tokenizer) this.#matcher = new StopMatcher(tokenizer, stops);
  }

  /** Emits one token; true when a stop string matched. */
  token(id: number, seconds: number, logits: Float32Array): boolean {
    const r = this.#matcher?.push(id);
    if (r) this.text += r.text;
    if (this.json) {
      const logprob = tokenLogprob(logits, id, 0).logprob;
      writeStdout(JSON.stringify({ index: this.#n, id, text: r ? r.text : null, seconds, logprob }) + "\n");
    } else if (r) writeStdout(r.text);
    else writeStdout((this.#n > 0 ? "," : "") + id);
    this.#n++;
    return r?.stopped ?? false;
  }

  /** The held-back text, then the end of the output. */
  end(summary: Record<string, unknown>): void {
    const rest = this.#matcher?.flush() ?? "";
    this.text += rest;
    if (this.json) {
      if (rest) writeStdout(JSON.stringify({ index: this.#n, id: null, text: rest, seconds: 0 }) + "\n");
      writeStdout(JSON.stringify({ ...summary, generated_text: this.#matcher ? this.text : null }) + "\n");
    } else writeStdout(rest + "\n");
  }
}

/** Runs `k3 run`; returns the exit code (130 when interrupted), throws K3Error on failure. */
export async function main(args: string[]): Promise<number> {
  const { values, positionals, tokens } = parseFlags("run", args, {
    prompt: { type: "string", short: "p" },
    "prompt-file": { type: "string" },
    ids: { type: "string" },
    context: { type: "string" },
    ...OUTPUT_FLAGS,
    ...GENERATION_FLAGS,
    ...SAMPLING_FLAGS,
    ...MEMORY_FLAGS,
    ...GRAMMAR_FLAGS,
    json: { type: "boolean" },
    "save-state": { type: "string" },
    "load-state": { type: "string" },
    "dump-logits": { type: "string" },
    ledger: { type: "boolean" },
    out: { type: "string" },
    ...DRAFT_FLAGS,
    help: { type: "boolean", short: "h" },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  const dir = modelDirArg("run", positionals, "--prompt");
  const mode = outputMode(values);
  // Outputs are checked before anything loads (a directory, an unwritable place: exit 2).
  const outTarget = values.out !== undefined ? prepareOutput(values.out, "--out") : undefined;
  const logitsTarget = values["dump-logits"] !== undefined
    ? prepareOutput(values["dump-logits"], "--dump-logits")
    : undefined;
  const source = promptSource(values);
  const genOpts = generationOptions(values, values["save-state"] !== undefined ? 0 : 1);
  const sampling = samplingOptions(values);
  const memory = memoryOptions(tokens);
  if ((values["save-state"] || values["load-state"]) && !genOpts.incremental) {
    throw usageError("--save-state and --load-state carry the state: they cannot be used with --full-recompute");
  }
  const config = await readModelConfig(dir, genOpts.layers);
  const { cfg } = config;
  let tokenizer: Tokenizer | undefined;
  const getTokenizer = () => (tokenizer ??= needTokenizer(dir, genOpts.tokDir, "--prompt", cfg.vocabSize));
  const prompt = await promptIds(source, cfg.vocabSize, getTokenizer);
  const stopIds = genOpts.stopIds.map((s) => parseIds("stop-id", s, cfg.vocabSize)[0]);
  const grammar = runGrammar(values);
  if (grammar) {
    tokenizer ??= needTokenizer(dir, genOpts.tokDir, values.grammar ? "--grammar" : "--json-schema", cfg.vocabSize);
    if (stopIds.length === 0) stopIds.push(tokenizer.specialId("[EOS]"));
  }
  if (genOpts.stops.length > 0) tokenizer ??= needTokenizer(dir, genOpts.tokDir, "--stop", cfg.vocabSize);
  if (!tokenizer && tokenizerDir(dir, genOpts.tokDir)) getTokenizer();
  // A saved state is checked for layout and checksum before the model is opened: its
  // length decides the capacity.
  let stateFile: StateFile | undefined;
  if (values["load-state"] !== undefined) stateFile = await readStateFile(values["load-state"]);
  const prefix = stateFile && Number.isSafeInteger(stateFile.header.pos) ? Math.max(0, stateFile.header.pos) : 0;

  const needed = prefix + prompt.length + genOpts.gen;
  const context = values.context === undefined ? needed : intFlag("context", values.context, needed, 1, 1 << 20);
  if (context < needed) {
    throw usageError(
      `--context ${context}: this run needs ${needed} positions (${
        prefix ? `${prefix} saved + ` : ""
      }${prompt.length} prompt + ${genOpts.gen} --gen); raise --context or lower --gen`,
    );
  }
  const draftMode = draftOption(values.draft);
  const t0 = performance.now();
  const opened = await openModel(config, {
    ...engineEnvironment(),
    capacity: context,
    chunk: genOpts.chunk,
    prefillTokens: prompt.length,
    threads: genOpts.threads,
    memory,
    drafts: draftMode !== "off" && genOpts.incremental,
    log: (line) => info(`k3: ${line}`),
    onProgress: (what, d, n) => progress(what, d, n),
  });
  const loadSeconds = (performance.now() - t0) / 1000;
  const weights = opened.model.weights;
  const io = () => weights.ioStats?.() ?? noIoStats();
  const logitRows: Float32Array[] = [];
  const interrupts = new Interrupts();
  let loaded: LoadedState | undefined;
  try {
    const fp = stateFile || values["save-state"] ? await modelFingerprint(opened) : undefined;
    if (stateFile) loaded = await loadState(stateFile, opened.model, fp!);
    info(
      `k3: ${dir}: ${cfg.numLayers} layers, hidden ${cfg.hiddenSize}, vocab ${cfg.vocabSize}; ready in ${
        loadSeconds.toFixed(2)
      } s` + (loaded ? `; continuing a saved state of ${loaded.tokens.length} tokens` : ""),
    );
    if (mode.stepTable) console.error("step   token   seconds  expert hits   GB read   tok/s");
    let last = io();
    const t1 = performance.now();
    const mark0 = markLedger(opened.model);
    let tLast = t1, stepCount = 0;
    const output = new Output(tokenizer, genOpts.stops, values.json === true);
    const scheduler = new Scheduler(opened.model, { chunk: opened.plan.chunk, draft: { mode: draftMode } });
    const state = loaded?.state;
    loaded = undefined; // the scheduler owns it now
    opened.model.onLayer = layerProgress(prompt.length, opened.plan.chunk, () => io().trunkBytes + io().expertBytes);
    const result = await scheduler.submit({
      prompt,
      maxTokens: genOpts.gen,
      stopIds,
      choose: makeSampler(sampling),
      grammar: grammar && sequenceConstraint(grammar, tokenizer!, cfg.vocabSize, stopIds),
      recompute: !genOpts.incremental,
      state,
      keepState: values["save-state"] !== undefined,
      signal: interrupts.signal,
      onPrefill: prefillProgress(opened.plan.chunk),
      onToken: (token, logits) => {
        if (values["dump-logits"]) logitRows.push(logits.slice());
        const now = performance.now(), seconds = (now - tLast) / 1000;
        tLast = now;
        const io1 = io();
        const hits = io1.expertHits - last.expertHits, misses = io1.expertMisses - last.expertMisses;
        const gb = (io1.trunkBytes + io1.expertBytes - last.trunkBytes - last.expertBytes) / 1e9;
        last = io1;
        if (mode.stepTable) {
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
    const ledger = ledgerBetween(mark0, mark1);
    const reads = readsBetween(mark0, mark1);
    if (values.ledger) { for (const line of formatLedger(ledger)) info(`k3: ${line}`); }
    const ioWait = ledger.trunk_read_wait_seconds + ledger.expert_read_wait_seconds;
    const ids = result.tokens;
    const settings = reportSettings({
      modelDir: dir,
      layers: cfg.numLayers,
      gen: genOpts.gen,
      stopIds,
      stops: genOpts.stops,
      sampling,
      incremental: genOpts.incremental,
      memory,
      chunk: opened.plan.chunk,
      threads: genOpts.threads,
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
    if (values["save-state"]) {
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
        const all = [...(stateFile?.header.tokens ?? []), ...prompt, ...ids];
        await saveState(values["save-state"], opened.model, st, all, fp!);
        info(`k3: saved the state of ${all.length} tokens to ${values["save-state"]}`);
      } finally {
        st.free();
      }
    }
    const n = Math.max(ids.length, 1);
    const peak = peakRssBytes();
    const stats = io();
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
      console.error(
        `k3: speculation (${draftMode}): ${d.accepted} of ${d.drafted} draft tokens accepted over ${d.passes} ${
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
    if (logitsTarget) {
      const all = new Float32Array(logitRows.length * cfg.vocabSize);
      logitRows.forEach((r, i) => all.set(r, i * cfg.vocabSize));
      await writeOutput(logitsTarget, new Uint8Array(all.buffer));
    }
    if (outTarget) {
      const report = {
        ...reportHead("run"),
        settings,
        ...seq,
        prompt_ids: prompt,
        generated_ids: ids,
        generated_text: tokenizer ? output.text : null,
        loaded_state_tokens: stateFile ? stateFile.header.pos : null,
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
        draft: { mode: draftMode, ...(result.draft ?? { passes: 0, drafted: 0, accepted: 0, off: false }) },
      };
      await writeOutput(outTarget, JSON.stringify(report, null, 2) + "\n");
    }
    return result.finishReason === "interrupted" ? EXIT_INTERRUPTED : 0;
  } finally {
    interrupts.dispose();
    loaded?.state.free();
    await opened.close();
  }
}
