/**
 * `k3 run <model_dir>`: greedy generation with a report.
 *
 * @module
 */

import { loadConfig } from "../engine/config.ts";
import { usageError } from "../engine/errors.ts";
import { generate } from "../engine/generate.ts";
import { firstLayers, openModel } from "../engine/load.ts";
import { fmtBytes, intFlag, parseFlags, parseIds, peakRssBytes, writeFileAtomic } from "./common.ts";

export const USAGE = `usage: k3 run <model_dir> --ids 1,2,3 [options]

Greedy generation from a prompt of token ids.

  --ids LIST        prompt token ids, comma-separated
  --gen N           tokens to generate (default 8, 1..4096)
  --incremental     carry KDA/conv state and the MLA cache between steps
                    (default: recompute the whole sequence every step; same tokens)
  --stop-id ID      stop after this id (repeatable)
  --layers N        bind and run only the first N layers (diagnostic)
  --chunk N         prefill tokens per forward call (default 16, 1..256)
  --out FILE        write a JSON report (atomically)
  -h, --help        this help
`;

export async function main(args: string[]): Promise<number> {
  const { values, positionals } = parseFlags("run", args, {
    ids: { type: "string" },
    gen: { type: "string" },
    incremental: { type: "boolean" },
    "stop-id": { type: "string", multiple: true },
    layers: { type: "string" },
    chunk: { type: "string" },
    out: { type: "string" },
    help: { type: "boolean", short: "h" },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length !== 1) throw usageError("run: expected exactly one <model_dir> (see k3 run --help)");
  if (values.ids === undefined) throw usageError("run: a prompt is required: --ids");
  const dir = positionals[0];
  const gen = intFlag("gen", values.gen, 8, 1, 4096);
  const chunk = intFlag("chunk", values.chunk, 16, 1, 256);
  let cfg = await loadConfig(dir);
  if (values.layers !== undefined) cfg = firstLayers(cfg, intFlag("layers", values.layers, 0, 1, cfg.numLayers));
  const prompt = parseIds("ids", values.ids, cfg.vocabSize);
  if (prompt.length > 32768) throw usageError(`--ids: ${prompt.length} ids, at most 32768`);
  const stopIds = (values["stop-id"] ?? []).map((s) => parseIds("stop-id", s, cfg.vocabSize)[0]);

  const t0 = performance.now();
  const opened = await openModel(dir, { layers: cfg.numLayers, capacity: prompt.length + gen, chunk });
  const loadSeconds = (performance.now() - t0) / 1000;
  try {
    console.error(`k3: ${dir}: ${cfg.numLayers} layers, hidden ${cfg.hiddenSize}, vocab ${cfg.vocabSize}; loaded in ${loadSeconds.toFixed(2)} s`);
    console.error("step  token   seconds   tok/s");
    const t1 = performance.now();
    const steps = await generate(opened.model, prompt, {
      gen,
      incremental: values.incremental ?? false,
      stopIds,
      onStep: (s) => console.error(`${String(s.step).padStart(4)}  ${String(s.token).padStart(6)}  ${s.seconds.toFixed(4).padStart(8)}  ${(1 / s.seconds).toFixed(2).padStart(6)}`),
    });
    const wall = (performance.now() - t1) / 1000;
    const ids = steps.map((s) => s.token);
    const peak = peakRssBytes();
    console.log(ids.join(","));
    console.error(`k3: ${ids.length} tokens in ${wall.toFixed(3)} s (${(wall / ids.length).toFixed(4)} s/token); PEAK RSS ${fmtBytes(peak)}`);
    if (values.out) {
      const report = {
        model_dir: dir,
        prompt_ids: prompt,
        generated_ids: ids,
        incremental: values.incremental ?? false,
        layers: cfg.numLayers,
        load_seconds: loadSeconds,
        wall_seconds: wall,
        seconds_per_token: wall / ids.length,
        step_seconds: steps.map((s) => s.seconds),
        peak_rss_bytes: peak,
      };
      await writeFileAtomic(values.out, JSON.stringify(report, null, 2) + "\n");
    }
    return 0;
  } finally {
    opened.close();
  }
}
