/**
 * `k3 run <model_dir>`: greedy generation with a report.
 *
 * @module
 */

import { loadConfig } from "../engine/model/config.ts";
import { usageError } from "../engine/errors.ts";
import { generate, type Step } from "../engine/generate/generate.ts";
import { firstLayers, openModel } from "../engine/weights/load.ts";
import type { IoStats } from "../engine/model/model.ts";
import { readActivity } from "../engine/native/io.ts";
import type { Tokenizer } from "../engine/text/tokenizer.ts";
import { progress } from "./progress.ts";
import { fmtBytes, parseIds, peakRssBytes, writeFileAtomic } from "./common.ts";
import {
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

export const USAGE = `usage: k3 run <model_dir> (--prompt TEXT | --prompt-file PATH | --ids 1,2,3) [options]

Greedy generation. The generated ids go to stdout (and the text, when a tokenizer is
available); a per-step table and the summary go to stderr.

prompt (exactly one):
  --prompt TEXT     text, encoded with the tokenizer (special tokens are not recognised)
  --prompt-file P   a UTF-8 file, read verbatim
  --ids LIST        token ids, comma-separated (no tokenizer needed)
${GENERATION_HELP}
  --dump-logits F   write the logits of every step, float32 little-endian [steps][vocab]
  --out FILE        write a JSON report (atomically)
${MEMORY_HELP}
  -h, --help        this help
`;

const ZERO_IO: IoStats = {
  trunkBytes: 0,
  expertBytes: 0,
  expertHits: 0,
  expertMisses: 0,
  ioWaitSeconds: 0,
  pinnedLayers: 0,
};

export async function main(args: string[]): Promise<number> {
  const { values, positionals, tokens } = parseFlags("run", args, {
    prompt: { type: "string" },
    "prompt-file": { type: "string" },
    ids: { type: "string" },
    ...GENERATION_FLAGS,
    ...MEMORY_FLAGS,
    "dump-logits": { type: "string" },
    out: { type: "string" },
    help: { type: "boolean", short: "h" },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length !== 1) throw usageError("run: expected exactly one <model_dir> (see k3 run --help)");
  const dir = positionals[0];
  const source = promptSource(values);
  const genOpts = generationOptions(values);
  const memory = memoryOptions(tokens);
  let cfg = await loadConfig(dir);
  if (genOpts.layers !== undefined) cfg = firstLayers(cfg, genOpts.layers);
  let tokenizer: Tokenizer | undefined;
  const getTokenizer = () => (tokenizer ??= needTokenizer(dir, genOpts.tokDir, "--prompt"));
  const prompt = await promptIds(source, cfg.vocabSize, getTokenizer);
  const stopIds = genOpts.stopIds.map((s) => parseIds("stop-id", s, cfg.vocabSize)[0]);
  if (!tokenizer && tokenizerDir(dir, genOpts.tokDir)) getTokenizer();

  const t0 = performance.now();
  const opened = await openModel(dir, {
    layers: cfg.numLayers,
    capacity: prompt.length + genOpts.gen,
    chunk: genOpts.chunk,
    threads: genOpts.threads,
    memory,
    log: (line) => console.error(`k3: ${line}`),
    onProgress: (what, d, n) => progress(what, d, n),
  });
  const loadSeconds = (performance.now() - t0) / 1000;
  const weights = opened.model.weights;
  const io = () => weights.ioStats?.() ?? ZERO_IO;
  const logitRows: Float32Array[] = [];
  try {
    console.error(
      `k3: ${dir}: ${cfg.numLayers} layers, hidden ${cfg.hiddenSize}, vocab ${cfg.vocabSize}; ready in ${
        loadSeconds.toFixed(2)
      } s`,
    );
    console.error("step   token   seconds  expert hits   GB read   tok/s");
    let last = io();
    const reads0 = { ...readActivity };
    const t1 = performance.now();
    const steps = await generate(opened.model, prompt, {
      gen: genOpts.gen,
      incremental: genOpts.incremental,
      stopIds,
      onLogits: values["dump-logits"] ? (row) => logitRows.push(row.slice()) : undefined,
      onStep: (s: Step) => {
        const now = io();
        const hits = now.expertHits - last.expertHits, misses = now.expertMisses - last.expertMisses;
        const gb = (now.trunkBytes + now.expertBytes - last.trunkBytes - last.expertBytes) / 1e9;
        last = now;
        console.error(
          `${String(s.step).padStart(4)}  ${String(s.token).padStart(6)}  ${s.seconds.toFixed(4).padStart(8)}  ${
            `${hits}/${hits + misses}`.padStart(11)
          }  ${gb.toFixed(3).padStart(8)}  ${(1 / s.seconds).toFixed(2).padStart(6)}`,
        );
      },
    });
    const wall = (performance.now() - t1) / 1000;
    const ids = steps.map((s) => s.token);
    const text = tokenizer?.decode(ids);
    const peak = peakRssBytes();
    const stats = io();
    console.log(ids.join(","));
    if (text !== undefined) console.log(text);
    const lookups = stats.expertHits + stats.expertMisses;
    console.error(
      `k3: ${ids.length} tokens in ${wall.toFixed(3)} s (${(wall / ids.length).toFixed(4)} s/token); PEAK RSS ${
        fmtBytes(peak)
      } (quote this, not the plan)`,
    );
    if (weights.ioStats) {
      console.error(
        `k3: read ${fmtBytes(stats.trunkBytes)} trunk, ${fmtBytes(stats.expertBytes)} experts (${
          fmtBytes(Math.round(stats.trunkBytes / ids.length))
        } + ${fmtBytes(Math.round(stats.expertBytes / ids.length))} per token); expert cache hit rate ${
          lookups ? ((100 * stats.expertHits) / lookups).toFixed(1) : "0.0"
        }%; ` +
          `${stats.pinnedLayers} trunk layers pinned; I/O wait ${
            ((100 * stats.ioWaitSeconds) / Math.max(wall, 1e-9)).toFixed(1)
          }% of wall clock`,
      );
    }
    if (values["dump-logits"]) {
      const all = new Float32Array(logitRows.length * cfg.vocabSize);
      logitRows.forEach((r, i) => all.set(r, i * cfg.vocabSize));
      await writeFileAtomic(values["dump-logits"], new Uint8Array(all.buffer));
    }
    if (values.out) {
      const report = {
        model_dir: dir,
        prompt_ids: prompt,
        generated_ids: ids,
        generated_text: text ?? null,
        incremental: genOpts.incremental,
        layers: cfg.numLayers,
        load_seconds: loadSeconds,
        wall_seconds: wall,
        seconds_per_token: wall / ids.length,
        step_seconds: steps.map((s) => s.seconds),
        peak_rss_bytes: peak,
        trunk_bytes_read: stats.trunkBytes,
        expert_bytes_read: stats.expertBytes,
        trunk_bytes_per_token: stats.trunkBytes / ids.length,
        expert_bytes_per_token: stats.expertBytes / ids.length,
        expert_cache_hits: stats.expertHits,
        expert_cache_misses: stats.expertMisses,
        expert_cache_hit_rate: lookups ? stats.expertHits / lookups : 0,
        trunk_layers_pinned: stats.pinnedLayers,
        io_wait_seconds: stats.ioWaitSeconds,
        io_share: stats.ioWaitSeconds / Math.max(wall, 1e-9),
        read_busy_seconds: readActivity.busySeconds - reads0.busySeconds,
        read_bytes: readActivity.bytes - reads0.bytes,
        memory: opened.plan ?? null,
      };
      await writeFileAtomic(values.out, JSON.stringify(report, null, 2) + "\n");
    }
    return 0;
  } finally {
    await opened.close();
  }
}
