/**
 * Opening a model directory: config, checkpoint index, weights and the model object.
 *
 * @module
 */

import { type K3Config, loadConfig } from "../model/config.ts";
import { usageError } from "../errors.ts";
import { type Kernels, kernels } from "../native/ffi.ts";
import { K3Model } from "../model/model.ts";
import type { MemoryOptions, MemoryPlan } from "./plan.ts";
import { startCompute } from "../native/pool.ts";
import { Checkpoint } from "./safetensors.ts";
import { openWeights } from "./streamed.ts";
import { checkCheckpoint } from "../model/weights.ts";

/** The config of only the first `n` layers (the `--layers` diagnostic). */
export function firstLayers(cfg: K3Config, n: number): K3Config {
  if (n < 1 || n > cfg.numLayers) throw usageError(`--layers: ${n} is out of range 1..${cfg.numLayers}`);
  return { ...cfg, numLayers: n, layerKinds: cfg.layerKinds.slice(0, n) };
}

/** Options for `openModel`. */
export interface OpenOptions {
  /** Bind only the first N layers. */
  layers?: number;
  /** Positions the sequence state must hold (prompt + generated). */
  capacity: number;
  /** Prompt tokens of one sequence per forward pass during prefill. */
  chunk?: number;
  /** Sequences generated at once (the memory plan holds a state for each). Default 1. */
  sequences?: number;
  /** Take the most sequences up to `sequences` that fit the memory plan. */
  autoSequences?: boolean;
  /** Threads for matrix products (default: all cores). Never changes a token. */
  threads?: number;
  /** Smallest product (weight elements) worth splitting across threads (tests lower it). */
  splitMin?: number;
  /** Memory budget; undefined fields mean everything resident. */
  memory?: MemoryOptions;
  /** Where the memory plan is printed before anything big is allocated (default: nowhere). */
  log?: (line: string) => void;
  onProgress?: (what: string, done: number, total: number) => void;
}

/** An opened model, ready to generate. */
export interface OpenedModel {
  k: Kernels;
  cfg: K3Config;
  ckpt: Checkpoint;
  model: K3Model;
  /** The memory plan the model was opened with. */
  plan: MemoryPlan;
  /** Frees everything (after waiting for reads in flight). */
  close(): Promise<void>;
}

/**
 * Opens a model directory: every weight resident, or, with memory options, the trunk and
 * experts streamed and cached within the plan (engine/streamed.ts). The plan is made and
 * checked against MemAvailable before anything big is allocated.
 */
export async function openModel(dir: string, opts: OpenOptions): Promise<OpenedModel> {
  const fullCfg = await loadConfig(dir);
  let cfg = fullCfg;
  if (opts.layers !== undefined) cfg = firstLayers(cfg, opts.layers);
  const k = kernels();
  const ckpt = await Checkpoint.open(dir, (d, n) => opts.onProgress?.("index", d, n));
  try {
    checkCheckpoint(cfg, ckpt);
    const opened = await openWeights(k, fullCfg, cfg, ckpt, {
      mem: opts.memory,
      capacity: opts.capacity,
      chunk: opts.chunk ?? 16,
      sequences: opts.sequences,
      autoSequences: opts.autoSequences,
      log: opts.log,
      onLayer: (d, n) => opts.onProgress?.("load", d, n),
    });
    const weights = opened.weights;
    const compute = await startCompute(
      k,
      opts.threads ?? navigator.hardwareConcurrency,
      opts.splitMin,
    );
    const model = new K3Model(k, cfg, weights, opened.passRows, opts.capacity, compute);
    return {
      k,
      cfg,
      ckpt,
      model,
      plan: opened.plan,
      async close() {
        compute.close();
        await opened.close();
        ckpt.close();
      },
    };
  } catch (e) {
    ckpt.close();
    throw e;
  }
}
