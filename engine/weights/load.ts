/**
 * Opening a model directory: config, checkpoint index, weights and the model object.
 *
 * @module
 */

import { type K3Config, loadConfig } from "../model/config.ts";
import { EXIT, K3Error, usageError } from "../errors.ts";
import { type Kernels, kernels } from "../native/ffi.ts";
import { K3Model } from "../model/model.ts";
import type { MemoryOptions, MemoryPlan } from "./plan.ts";
import { startCompute } from "../native/pool.ts";
import { Checkpoint } from "./safetensors.ts";
import { openWeights } from "./streamed.ts";
import { expertTensors, globalTensors, HEAD_NAME, layerTensors, PREFIX } from "../model/tensors.ts";
import { checkCheckpoint } from "./bind.ts";

/** The part of the checkpoint that is the language model (vision tensors are ignored). */
const LM_PREFIX = "language_model.";

/**
 * Refuses (exit 2) a config that leaves a language-model tensor of the checkpoint unused
 * (e.g. `num_shared_experts: 0` beside shared-expert tensors, or too few layers): the
 * engine would run a different model than the checkpoint holds. `cfg` is the whole
 * model's config (not a --layers prefix).
 */
export function checkAccounted(cfg: K3Config, ckpt: Checkpoint, source = `${ckpt.dir}/config.json`): void {
  const used = new Set<string>([PREFIX + "embed_tokens.weight", HEAD_NAME]);
  for (const t of globalTensors(cfg)) used.add(PREFIX + t.name);
  for (let L = 0; L < cfg.numLayers; L++) {
    for (const t of layerTensors(cfg, L)) used.add(PREFIX + t.name);
    if (L >= cfg.firstKDense) {
      for (let E = 0; E < cfg.moe.numExperts; E++) for (const t of expertTensors(cfg, L, E)) used.add(PREFIX + t.name);
    }
  }
  const unused: string[] = [];
  for (const name of ckpt.tensors.keys()) {
    if (name.startsWith(LM_PREFIX) && !used.has(name)) unused.push(name);
  }
  if (unused.length > 0) {
    throw new K3Error(
      `${source}: cannot read the model config with confidence: the checkpoint has ${unused.length} language-model tensor${
        unused.length > 1 ? "s" : ""
      } this config does not use (first: ${
        JSON.stringify(unused.sort()[0])
      }); check num_hidden_layers, num_shared_experts, num_experts and first_k_dense_replace`,
      EXIT.usage,
    );
  }
}

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
  /** Progress of long phases (what, done, total). */
  onProgress?: (what: string, done: number, total: number) => void;
  /**
   * Verify every trunk piece and expert read against its checksum (default true). False
   * only for bench/verify.ts, which measures what verifying costs; never a CLI flag.
   */
  verify?: boolean;
}

/** An opened model, ready to generate. */
export interface OpenedModel {
  /** The kernels. */
  k: Kernels;
  /** The model config. */
  cfg: K3Config;
  /** The checkpoint. */
  ckpt: Checkpoint;
  /** The model. */
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
    checkAccounted(fullCfg, ckpt);
    const opened = await openWeights(k, fullCfg, cfg, ckpt, {
      mem: opts.memory,
      capacity: opts.capacity,
      chunk: opts.chunk ?? 16,
      sequences: opts.sequences,
      autoSequences: opts.autoSequences,
      log: opts.log,
      onLayer: (d, n) => opts.onProgress?.("load", d, n),
      verify: opts.verify,
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
