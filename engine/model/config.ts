/**
 * The model configuration: the released nested config.json read into one plain type.
 *
 * The reader never guesses. Every field the forward pass depends on must be present with
 * the right type; all missing or mistyped fields are listed by name in one error (exit 2).
 *
 * @module
 */

import { EXIT, K3Error } from "../errors.ts";
import { JsonFields, type NumberRange, problemText } from "../json_fields.ts";
import { expectDirectory } from "../paths.ts";
import { readInputJson } from "../native/files.ts";

/** Which attention a layer uses. */
export type AttentionKind = "kda" | "mla";

/** Everything the engine needs to know about the model's shape. */
export interface K3Config {
  /** Width of the residual stream. */
  hiddenSize: number;
  /** Decoder layers. */
  numLayers: number;
  /** Vocabulary size (embedding and lm_head rows). */
  vocabSize: number;
  /** Epsilon of every RMSNorm. */
  rmsNormEps: number;
  /** Zero-based: layerKinds[L] is the attention of layer L. */
  layerKinds: AttentionKind[];
  /** Kimi Delta Attention: heads, head width, short-conv kernel, gate lower bound. */
  kda: { numHeads: number; headDim: number; convKernel: number; gateLowerBound: number };
  /** Gated MLA: the latent attention layers' sizes. */
  mla: {
    numHeads: number;
    qLoraRank: number;
    kvLoraRank: number;
    nopeDim: number;
    ropeDim: number;
    vDim: number;
  };
  /** Stable LatentMoE: routed and shared experts and the router. */
  moe: {
    numExperts: number;
    topK: number;
    numShared: number;
    /** routed_expert_hidden_size: the latent width routed experts run in. */
    latent: number;
    /** moe_intermediate_size: per-expert (and per-shared-expert) intermediate width. */
    intermediate: number;
    routedScaling: number;
  };
  /** Layers below this index use the dense MLP. */
  firstKDense: number;
  /** Intermediate width of the dense MLP layers. */
  denseIntermediate: number;
  /** Layers per Attention Residuals block. */
  attnResBlock: number;
  /** SiTU-GLU beta. */
  situBeta: number;
  /** SiTU-GLU linear beta. */
  situLinearBeta: number;
  /** Beginning-of-sequence token id. */
  bosId: number;
  /** End-of-sequence token id. */
  eosId: number;
  /** MXFP4 group size of the routed experts. */
  quantGroup: number;
  /** max_position_embeddings: the positions the model was made for (the released model:
   * 262,144). Absent from a config: no window of its own ({@link modelWindow}). */
  maxPositions?: number;
}

/** The most positions any context may hold (a window-less config, and the --context flags). */
export const MAX_CONTEXT = 1 << 20;

/**
 * The model's own window: the positions a sequence may hold, prompt and completion, before
 * memory is counted (max_position_embeddings, at most {@link MAX_CONTEXT}). K3's attention
 * has no position encoding (NoPE), so nothing breaks beyond it; it is where the model was
 * trained, so the engine stops there.
 */
export function modelWindow(cfg: K3Config): number {
  return Math.min(cfg.maxPositions ?? MAX_CONTEXT, MAX_CONTEXT);
}

/** Sanity bounds (the released model: 93 layers, width 7168, vocabulary 163,840). */
const MAX_LAYERS = 4096;
const MAX_WIDTH = 1 << 16;
const MAX_VOCAB = 1 << 22;
const MAX_INTERMEDIATE = 1 << 20;
/**
 * Float ranges, open below (the released model: KDA decay bound -5, routed scaling 1, SiTU
 * caps 4 and 25): where the math needs a sign or a scale, a value outside would run as
 * another model, so it is refused instead.
 */
const GATE_BOUND_RANGE: NumberRange = { min: -1000, max: 0, minOpen: true };
const SCALE_RANGE: NumberRange = { min: 0, max: 1000, minOpen: true };

/** A one-based list of layers (its range is checked against the layer count later). */
function layerList(f: JsonFields, k: string): number[] {
  const list = f.array(k, { maxLength: MAX_LAYERS });
  return Array.from({ length: list?.length ?? 0 }, (_, i) => list!.int(i) ?? 0);
}

function findGroupSize(v: unknown): number | undefined {
  if (!isObject(v)) return undefined;
  if (typeof v.group_size === "number") return v.group_size;
  for (const child of Object.values(v)) {
    const found = findGroupSize(child);
    if (found !== undefined) return found;
  }
  return undefined;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * Reads the released config.json object. Throws K3Error (exit 2) naming every missing or
 * mistyped field, and every value the engine cannot run with confidence.
 */
export function parseConfig(json: unknown, source = "config.json"): K3Config {
  if (!isObject(json)) throw new K3Error(`${source}: not a JSON object`, EXIT.usage);
  const problems: string[] = [];
  const cannotRead = () => new K3Error(`${source}: cannot read the model config: ${problems.join("; ")}`, EXIT.usage);
  // Every field is read and every problem collected, so one error names them all; a field
  // with a problem reads as 0 (or empty) until then.
  const root = JsonFields.root(json, { absent: "missing", report: (p) => problems.push(problemText(p)) })!;
  const text = root.object("text_config");
  const lin = text?.object("linear_attn_config");
  if (!text || !lin) throw cannotRead();
  // quantization_config sits in text_config in the raw release, at the root in some dumps.
  const quant = isObject(text.get("quantization_config"))
    ? text.object("quantization_config")
    : isObject(json.quantization_config)
    ? root.object("quantization_config")
    : undefined;

  const numLayers = text.int("num_hidden_layers", 1, MAX_LAYERS) ?? 0;
  const cfg: K3Config = {
    hiddenSize: text.int("hidden_size", 1, MAX_WIDTH) ?? 0,
    numLayers,
    vocabSize: text.int("vocab_size", 1, MAX_VOCAB) ?? 0,
    rmsNormEps: text.number("rms_norm_eps") ?? 0,
    layerKinds: [],
    kda: {
      numHeads: lin.int("num_heads", 1, 4096) ?? 0,
      headDim: lin.int("head_dim", 1, 4096) ?? 0,
      convKernel: lin.int("short_conv_kernel_size", 1, 64) ?? 0,
      // The decay bound is a log-space floor: negative, or the state would grow.
      gateLowerBound: lin.number("gate_lower_bound", GATE_BOUND_RANGE) ?? 0,
    },
    mla: {
      numHeads: text.int("num_attention_heads", 1, 4096) ?? 0,
      qLoraRank: text.int("q_lora_rank", 1, MAX_WIDTH) ?? 0,
      kvLoraRank: text.int("kv_lora_rank", 1, MAX_WIDTH) ?? 0,
      nopeDim: text.int("qk_nope_head_dim", 1, 4096) ?? 0,
      ropeDim: text.int("qk_rope_head_dim", 0, 4096) ?? 0,
      vDim: text.int("v_head_dim", 1, 4096) ?? 0,
    },
    moe: {
      numExperts: text.int("num_experts", 1, MAX_WIDTH) ?? 0,
      topK: text.int("num_experts_per_token", 1, 1024) ?? 0,
      numShared: text.int("num_shared_experts", 0, 64) ?? 0,
      latent: text.int("routed_expert_hidden_size", 1, MAX_WIDTH) ?? 0,
      intermediate: text.int("moe_intermediate_size", 1, MAX_INTERMEDIATE) ?? 0,
      routedScaling: text.number("routed_scaling_factor", SCALE_RANGE) ?? 0,
    },
    firstKDense: text.int("first_k_dense_replace", 0, MAX_LAYERS) ?? 0,
    denseIntermediate: text.int("intermediate_size", 1, MAX_INTERMEDIATE) ?? 0,
    attnResBlock: text.int("attn_res_block_size", 1, MAX_LAYERS) ?? 0,
    // SiTU's caps divide and multiply: positive, and small enough to cap anything.
    situBeta: text.number("activation_situ_beta", SCALE_RANGE) ?? 0,
    situLinearBeta: text.number("activation_situ_linear_beta", SCALE_RANGE) ?? 0,
    bosId: root.int("bos_token_id", 0, MAX_VOCAB) ?? 0,
    eosId: root.int("eos_token_id", 0, MAX_VOCAB) ?? 0,
    quantGroup: 0,
    // Optional: the forward pass never reads it (NoPE); it bounds the context.
    maxPositions: text.has("max_position_embeddings") ? text.int("max_position_embeddings", 1) : undefined,
  };
  const fullAttn = layerList(lin, "full_attn_layers");
  const kdaLayers = layerList(lin, "kda_layers");
  const mlaGate = text.boolean("mla_use_output_gate");
  const renormalize = text.boolean("moe_renormalize");
  const latentNorm = text.boolean("latent_moe_use_norm");
  const routerAct = text.string("moe_router_activation_func");
  const groups = text.int("num_expert_group", 1, MAX_WIDTH);
  const topkGroup = text.int("topk_group", 1, MAX_WIDTH);
  if (!quant) {
    problems.push("text_config.quantization_config is missing (expected an object)");
  } else {
    // compressed-tensors puts group_size in config_groups.<name>.weights; find it there.
    const fmt = quant.get("format");
    cfg.quantGroup = findGroupSize(quant.value) ?? 0;
    if (typeof fmt === "string" && !fmt.includes("mxfp4")) {
      problems.push(`${quant.name("format")}: expected an mxfp4 format, got ${JSON.stringify(fmt)}`);
    }
    if (cfg.quantGroup !== 32) {
      problems.push(`${quant.name("...group_size")}: expected 32, got ${cfg.quantGroup || "none"}`);
    }
  }
  if (problems.length) throw cannotRead();

  // Values that are present but that this engine cannot run as the released model does.
  const bad: string[] = [];
  const layerKinds: (AttentionKind | undefined)[] = new Array(numLayers).fill(undefined);
  for (const [list, kind] of [[fullAttn, "mla"], [kdaLayers, "kda"]] as const) {
    for (const oneBased of list) {
      if (oneBased < 1 || oneBased > numLayers) {
        bad.push(`${kind} layer ${oneBased} outside 1..${numLayers} (the lists are one-based)`);
      } else if (layerKinds[oneBased - 1]) {
        bad.push(`layer ${oneBased} listed twice`);
      } else layerKinds[oneBased - 1] = kind;
    }
  }
  const unlisted = layerKinds.flatMap((k, i) => (k ? [] : [i + 1]));
  if (unlisted.length) bad.push(`layers ${unlisted.join(",")} are in neither full_attn_layers nor kda_layers`);
  cfg.layerKinds = layerKinds.map((k) => k ?? "kda");
  if (cfg.kda.convKernel !== 4) bad.push(`short_conv_kernel_size ${cfg.kda.convKernel} (only 4 is supported)`);
  if (!mlaGate) bad.push("mla_use_output_gate false (the released model gates MLA)");
  if (!renormalize || !latentNorm) bad.push("moe_renormalize and latent_moe_use_norm must be true");
  if (routerAct !== "sigmoid") bad.push(`moe_router_activation_func ${JSON.stringify(routerAct)} (only sigmoid)`);
  if (groups !== 1 || topkGroup !== 1) bad.push("grouped routing (num_expert_group/topk_group != 1) is not supported");
  if (cfg.moe.topK > cfg.moe.numExperts) bad.push("num_experts_per_token exceeds num_experts");
  for (
    const [name, v] of [["routed_expert_hidden_size", cfg.moe.latent], [
      "moe_intermediate_size",
      cfg.moe.intermediate,
    ]] as const
  ) {
    if (v % 32 !== 0) bad.push(`${name} ${v} is not a multiple of 32 (MXFP4 groups)`);
  }
  if (cfg.firstKDense > numLayers) bad.push("first_k_dense_replace exceeds num_hidden_layers");
  if (!(cfg.rmsNormEps > 0 && cfg.rmsNormEps < 1)) bad.push("rms_norm_eps must be in (0, 1)");
  for (const [name, id] of [["bos_token_id", cfg.bosId], ["eos_token_id", cfg.eosId]] as const) {
    if (id >= cfg.vocabSize) bad.push(`${name} ${id} is outside the vocabulary (vocab_size ${cfg.vocabSize})`);
  }
  if (bad.length) throw new K3Error(`${source}: unsupported model config: ${bad.join("; ")}`, EXIT.usage);
  return cfg;
}

/** The largest config.json read (the released one is a few kB). */
const MAX_CONFIG_BYTES = 16 << 20;

/**
 * Reads and parses `<dir>/config.json` (not a model directory, unreadable, not a regular
 * file or invalid: exit 2).
 */
export function loadConfig(dir: string): Promise<K3Config> {
  expectDirectory(dir, "a model directory", "config.json");
  const path = `${dir}/config.json`;
  const json = readInputJson(path, { what: "the model config", maxBytes: MAX_CONFIG_BYTES, exitCode: EXIT.usage });
  return Promise.resolve(parseConfig(json, path));
}

/** A short stable fingerprint of the shape-defining config (for trunks and saved state). */
export async function configFingerprint(cfg: K3Config): Promise<string> {
  const bytes = new TextEncoder().encode(JSON.stringify(cfg));
  const digest = await crypto.subtle.digest("SHA-256", bytes);
  return Array.from(new Uint8Array(digest).slice(0, 16), (b) => b.toString(16).padStart(2, "0")).join("");
}
