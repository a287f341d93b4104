/**
 * Opening a model directory: config, checkpoint index, weights and the model object.
 *
 * @module
 */

import { type K3Config, loadConfig } from "./config.ts";
import { usageError } from "./errors.ts";
import { kernels, type Kernels } from "./ffi.ts";
import { K3Model } from "./model.ts";
import type { MemoryOptions } from "./plan.ts";
import { ResidentWeights } from "./resident.ts";
import { Checkpoint } from "./safetensors.ts";

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
  /** Tokens per forward call during prefill. */
  chunk?: number;
  /** Memory budget; undefined fields mean everything resident. */
  memory?: MemoryOptions;
  onProgress?: (what: string, done: number, total: number) => void;
}

/** An opened model, ready to generate. */
export interface OpenedModel {
  k: Kernels;
  cfg: K3Config;
  ckpt: Checkpoint;
  model: K3Model;
  /** The memory plan the model was opened with, when budgets were given. */
  plan?: unknown;
  close(): void;
}

/** Opens a model directory with every weight resident. */
export async function openModel(dir: string, opts: OpenOptions): Promise<OpenedModel> {
  let cfg = await loadConfig(dir);
  if (opts.layers !== undefined) cfg = firstLayers(cfg, opts.layers);
  const k = kernels();
  const ckpt = await Checkpoint.open(dir, (d, n) => opts.onProgress?.("index", d, n));
  try {
    const weights = await ResidentWeights.load(k, cfg, ckpt, { onLayer: (d, n) => opts.onProgress?.("load", d, n) });
    const model = new K3Model(k, cfg, weights, opts.chunk ?? 16, opts.capacity);
    return {
      k,
      cfg,
      ckpt,
      model,
      close() {
        weights.free();
        ckpt.close();
      },
    };
  } catch (e) {
    ckpt.close();
    throw e;
  }
}
