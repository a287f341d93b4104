/**
 * Opening a model: the composition root, the one place the engine's parts are put
 * together, in the order each needs the last:
 *
 *   1. the config, read once, `--layers` applied once (`readModelConfig`);
 *   2. the checkpoint index, checked against the config (every bound tensor present, none
 *      unused), and with `--trunk` the packed trunk and its expert table;
 *   3. the sizes: the trunk's regions, or the checkpoint's tensors once bound; a sequence's
 *      state; the forward pass's scratch for each number of sequences the plan may take;
 *   4. the plan (weights/plan.ts, pure), for as many sequences as asked or as fit, against
 *      the memory this process can still use (native/available.ts), printed before
 *      anything big is allocated; with `predict`, the disk's read rate and the bf16
 *      product's rate are measured first (weights/rate_probe.ts) and the plan predicts
 *      tokens/s (weights/throughput.ts) and chooses by it;
 *   5. the weights: every weight resident, or the trunk and experts streamed and cached
 *      within the plan;
 *   6. the compute (threads for the products);
 *   7. the model.
 *
 * @module
 */

import { configFingerprint, type K3Config, loadConfig } from "./model/config.ts";
import { EXIT, K3Error, usageError } from "./errors.ts";
import { type Kernels, kernels, libraryPath } from "./native/ffi.ts";
import { type Availability, memoryAvailability } from "./native/available.ts";
import { startCompute } from "./native/pool.ts";
import { K3Model } from "./model/model.ts";
import { GUESS_RIGHT } from "./model/expert_stream.ts";
import { planScratchRows, scratchBytes } from "./model/scratch.ts";
import { AUTO_CONTEXT_PREFILL, type ChunkRequest } from "./weights/plan_segment.ts";
import { stateBytes } from "./model/state.ts";
import type { WeightSource } from "./model/weight_source.ts";
import { Checkpoint } from "./weights/safetensors.ts";
import { boundSizes, checkAccounted, checkCheckpoint } from "./weights/bind.ts";
import { TrunkFile } from "./weights/trunk_file.ts";
import { streamedLayout, type TrunkDecode } from "./weights/trunk_geometry.ts";
import { measureDecodeRate } from "./weights/codec.ts";
import { DATA_FILE, weightSample } from "./weights/manifest.ts";
import { measureRates } from "./weights/rate_probe.ts";
import type { PassRates } from "./weights/throughput.ts";
import { EXPERTS_FILE, type ExpertTable, readExpertTable, TABLE_ADVICE } from "./weights/expert_table.ts";
import { expertBytes } from "./weights/experts.ts";
import { checkFits, fitContext, fitSequences, makePlan, type MemoryPlan } from "./weights/plan.ts";
import { autoContextPositions } from "./weights/plan_state.ts";
import { formatPlan } from "./weights/plan_text.ts";
import { type MemoryOptions, wantsStreaming } from "./weights/plan_input.ts";
import { ResidentWeights } from "./weights/resident.ts";
import { StreamedWeights } from "./weights/streamed.ts";

/** A model directory's config, read once: the whole model's, and the one that runs. */
export interface ModelConfig {
  /** The model directory. */
  dir: string;
  /** The whole model's config (its fingerprint names a packed trunk). */
  full: K3Config;
  /** The config that runs: the whole model's, or with `--layers N` its first N layers. */
  cfg: K3Config;
}

/** The config of only the first `n` layers (the `--layers` diagnostic). */
function firstLayers(cfg: K3Config, n: number): K3Config {
  if (n < 1 || n > cfg.numLayers) throw usageError(`--layers: ${n} is out of range 1..${cfg.numLayers}`);
  return { ...cfg, numLayers: n, layerKinds: cfg.layerKinds.slice(0, n) };
}

/** Reads `dir`'s config; with `layers`, runs only its first `layers` layers (--layers). */
export async function readModelConfig(dir: string, layers?: number): Promise<ModelConfig> {
  const full = await loadConfig(dir);
  return { dir, full, cfg: layers === undefined ? full : firstLayers(full, layers) };
}

/**
 * The engine's switches: inputs that change how it runs, never a token, each with a
 * default. They are options like any other (no part of the engine reads the environment);
 * the CLI fills them from its environment once (cli/environment.ts).
 */
export interface EngineSwitches {
  /** Read the next layer's experts ahead on a guess (model.ts guessNextExperts). Default
   * true; false to measure what the guess buys. */
  expertReadAhead?: boolean;
  /** Where the coded pieces of a streamed split-coded trunk are decoded: "product" (the
   * default) or "io", every piece on the I/O threads as it lands (trunk_ring.ts). */
  trunkDecode?: TrunkDecode;
  /** The memory to plan against instead of the probe (native/available.ts), with its name
   * for messages (tests shrink it to reach a refusal). */
  memoryAvailable?: Availability;
}

/** Options for `openModel`. */
export interface OpenOptions extends EngineSwitches {
  /** Bind only the first N layers (when the model is given as a directory). */
  layers?: number;
  /** Positions the sequence state must hold (prompt + generated); with `autoCapacity`, the
   * most it may hold. */
  capacity: number;
  /** `--context auto`: the most positions up to `capacity` that the memory plan holds, with
   * the states within a share of the memory (plan_state.ts autoContextPositions) and room for
   * a whole prompt of `prefillTokens` in one segment. The opened plan's `state.positions` is
   * the context. */
  autoCapacity?: boolean;
  /** The refusal when `capacity` positions do not fit the memory but fewer would, given the
   * most that fit: names the flag to change (default: a line naming the memory flags). */
  capacityRefusal?: (most: number) => string;
  /** Prompt tokens of one sequence per forward pass during prefill (a segment), or `auto`:
   * the largest segment the memory holds, up to `prefillTokens` (weights/plan_segment.ts).
   * Default 16. */
  chunk?: ChunkRequest;
  /** The prompt length `auto` sizes the segment for and the plan predicts the prefill of
   * (default: `capacity`). */
  prefillTokens?: number;
  /** Rows of the wide temporaries and of the logits, when not the plan's (tests, benches:
   * a row's bits never depend on either). */
  rows?: { tileRows?: number; logitRows?: number };
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
  /** Plan a conversation state cache (`k3 serve`, `k3 batch`): its GB, or undefined for
   * the plan's default (weights/plan.ts); absent: no cache in the plan. */
  stateCache?: { gb?: number };
  /** Sequences may draft (the scheduler's default; the plan holds a speculation record for
   * each). Default true; false for `--draft off`. */
  drafts?: boolean;
  /** Predict decode tokens/s in the plan when weights stream (`k3 batch`, `k3 serve`):
   * measures the disk's and the bf16 product's rates, and `--preset auto` and `autoSequences` choose by the
   * prediction. `rates` gives the rates instead (tests, benches). */
  predict?: boolean;
  /** The rates to predict with, instead of measuring the disk (implies `predict`). */
  rates?: PassRates;
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

/** A packed trunk opened for the run, with its expert table when it has one and reads are verified. */
interface OpenedTrunk {
  file: TrunkFile;
  table?: { table: ExpertTable; path: string };
}

/**
 * The positions each sequence holds: `opts.capacity`, or with `autoCapacity` the most up to
 * it within the states' share of `available` that the plan for `want` sequences holds, with
 * room for a whole prompt of `prefillTokens` in one segment when the segment is `auto`. An
 * explicit context too long for the memory is refused naming the most that fit (exit 2).
 * When not even one position fits with `want` sequences, the context asked for is returned
 * and fitSequences says why (fewer sequences fit, or the plan's own refusal).
 */
function fitCapacity(
  opts: OpenOptions,
  want: number,
  available: number | undefined,
  state: { fixed: number; perPosition: number },
  prefillTokens: number | undefined,
  planFor: (capacity: number, sequences: number) => MemoryPlan,
): number {
  const auto = opts.autoCapacity ?? false;
  const most = auto ? Math.min(opts.capacity, autoContextPositions(state, available, want)) : opts.capacity;
  const planOf = (capacity: number) => {
    const p = planFor(capacity, want);
    // A long context bought with a short segment would re-read the model every segment.
    if (auto && opts.chunk === "auto" && p.chunk < Math.min(prefillTokens ?? capacity, capacity)) {
      throw new K3Error(`a context of ${capacity} positions leaves no room for a whole prompt in one segment`);
    }
    return p;
  };
  const refusal = opts.capacityRefusal ??
    ((fit: number) =>
      `${opts.capacity} positions do not fit the memory plan at this budget: it holds at most ${fit}${
        want > 1 ? ` a sequence for ${want} sequences` : ""
      }; ask for fewer, or raise the budget (--preset, --trunk-gb, --cache-gb)`);
  try {
    return fitContext(planOf, most, auto, refusal).state.positions;
  } catch (e) {
    if (e instanceof K3Error && e.exitCode !== EXIT.usage) return most;
    throw e;
  }
}

/**
 * Opens a model (a directory, or a config `readModelConfig` read): every weight resident,
 * or, with memory options, the trunk and experts streamed and cached within the plan. The
 * plan is made and checked against the available memory before anything big is allocated.
 */
export async function openModel(model: string | ModelConfig, opts: OpenOptions): Promise<OpenedModel> {
  // 1. The config.
  const { dir, full, cfg } = typeof model === "string" ? await readModelConfig(model, opts.layers) : model;
  const mem = opts.memory ?? {};
  const verify = opts.verify ?? true;
  const readAhead = opts.expertReadAhead ?? true, trunkDecode = opts.trunkDecode ?? "product";
  const k = kernels();
  // 2. The checkpoint, and the packed trunk.
  const ckpt = await Checkpoint.open(dir, (d, n) => opts.onProgress?.("index", d, n));
  let trunk: OpenedTrunk | undefined;
  const closing: (() => Promise<void> | void)[] = [() => ckpt.close()];
  const close = async () => {
    for (const c of closing.reverse()) await c();
  };
  try {
    checkCheckpoint(cfg, ckpt);
    checkAccounted(full, ckpt);
    if (mem.trunkDir !== undefined) {
      const fingerprint = await configFingerprint(full), sample = await weightSample(k, full, ckpt);
      const file = await TrunkFile.open(k, mem.trunkDir, cfg, fingerprint, sample, verify);
      closing.push(() => file.close());
      const table = readExpertTable(mem.trunkDir, full, fingerprint, sample);
      trunk = { file, table: table && verify ? { table, path: `${mem.trunkDir}/${EXPERTS_FILE}` } : undefined };
    }
    // 3. The sizes.
    const layouts = trunk?.file.manifest.layer.slice(0, cfg.numLayers).map((r) =>
      streamedLayout(r, trunk!.file.manifest.piece, trunkDecode)
    );
    const sizes = trunk
      ? {
        layerBytes: trunk.file.manifest.layer.slice(0, cfg.numLayers).map((r) => r.size),
        layerStreamBytes: layouts!.map((l) => l.footprint),
        layerCodedBytes: layouts!.map((l) => l.coded),
        embedBytes: trunk.file.manifest.embed.size,
        headBytes: trunk.file.manifest.head.size,
        finalsBytes: trunk.file.manifest.finals.size,
      }
      : boundSizes(cfg, ckpt);
    // 4. The plan.
    const chunk = opts.chunk ?? 16, want = opts.sequences ?? 1;
    const state = stateBytes(cfg);
    // The scratch's MLA scores row spans the context, so each candidate context sizes its own.
    const scratchRowsFor = (rows: number, sequences: number, capacity: number) => ({
      ...planScratchRows(rows, sequences, capacity),
      ...opts.rows,
    });
    const available = opts.memoryAvailable ?? memoryAvailability();
    // The rates of the prediction, measured now: the disk on the trunk's data (or a shard).
    const rates = opts.rates ?? (opts.predict && wantsStreaming(mem)
      ? await measureRates(
        k,
        mem.trunkDir !== undefined ? `${mem.trunkDir}/${DATA_FILE}` : ckpt.shards[0],
        opts.threads ?? navigator.hardwareConcurrency,
      )
      : undefined);
    // A trunk whose streamed layers the products decode: their rate from the coded form too,
    // as a share of the plain one measured beside it.
    if (rates && !opts.rates && rates.codedDense === undefined && layouts?.some((l) => l.coded > 0)) {
      const d = await measureDecodeRate(k, libraryPath(), opts.threads ?? navigator.hardwareConcurrency, 0.2);
      rates.codedDense = rates.dense * d.splitProduct / d.plainProduct;
    }
    const guessRight = readAhead ? GUESS_RIGHT : 0;
    const autoCapacity = opts.autoCapacity ?? false;
    const prefillTokens = opts.prefillTokens ?? (autoCapacity ? AUTO_CONTEXT_PREFILL : undefined);
    const planFor = (capacity: number, sequences: number) => {
      const p = makePlan({
        cfg,
        ...sizes,
        expertBytes: expertBytes(cfg),
        stateBytes: state,
        scratchFor: (rows, n) => scratchBytes(cfg, scratchRowsFor(rows, n, capacity)),
        capacity,
        chunk,
        prefillTokens,
        sequences,
        mem,
        packed: trunk !== undefined,
        available: available?.bytes,
        availableSource: available?.source,
        stateCache: opts.stateCache,
        drafts: opts.drafts ?? true,
        rates,
        guessRight,
      });
      checkFits(p);
      return p;
    };
    const capacity = fitCapacity(opts, want, available?.bytes, state, prefillTokens, planFor);
    const plan = fitSequences((sequences) => planFor(capacity, sequences), want, opts.autoSequences ?? false);
    if (opts.log) {
      for (const line of formatPlan(plan)) opts.log(line);
      if (mem.trunkDir === undefined) {
        // The checkpoint's shards carry no checksums: without a trunk no weight is checked.
        opts.log(
          `  (no packed trunk: no weight is verified as it is read, the checkpoint's shards carry no checksums; ` +
            `pack one with k3 pack <model_dir> <trunk_dir>, then add the expert table with ${TABLE_ADVICE})`,
        );
      } else if (!trunk?.table && full.numLayers > full.firstKDense) {
        opts.log(
          `  (routed experts are not verified per read: no ${EXPERTS_FILE} in ${mem.trunkDir}; ` +
            `add the table with ${TABLE_ADVICE})`,
        );
      }
    }
    // 5. The weights.
    let weights: WeightSource;
    if (plan.mode === "resident") {
      const resident = await ResidentWeights.load(k, cfg, ckpt, { onLayer: (d, n) => opts.onProgress?.("load", d, n) });
      closing.push(() => resident.free());
      weights = resident;
    } else {
      const streamed = await StreamedWeights.open(k, cfg, ckpt, plan, trunk?.file, trunk?.table, trunkDecode);
      closing.push(() => streamed.close());
      weights = streamed;
    }
    // 6. The compute.
    const compute = await startCompute(k, opts.threads ?? navigator.hardwareConcurrency, opts.splitMin);
    closing.push(() => compute.close());
    // 7. The model.
    const rows = scratchRowsFor(plan.passRows, plan.state.sequences, capacity);
    const model = new K3Model(k, cfg, weights, plan.passRows, capacity, compute, {
      readAhead,
      tileRows: rows.tileRows,
      logitRows: rows.logitRows,
    });
    return { k, cfg, ckpt, model, plan, close };
  } catch (e) {
    await close();
    throw e;
  }
}
