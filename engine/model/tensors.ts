/**
 * The released tensor names and shapes: which tensors a decoder layer has (`layerTensors`),
 * the model-level ones, a routed expert's six, and how the engine keeps each. Loading from
 * safetensors (engine/weights/bind.ts) and from a packed trunk both use these lists; so do
 * k3 pack and the memory plan. Names and shapes only: no memory, no files.
 *
 * @module
 */

import type { K3Config } from "./config.ts";
import { K3Error } from "../errors.ts";
import type { Keep } from "../native/tensors.ts";

/** Prefix of every decoder tensor's name in the checkpoint. */
export const PREFIX = "language_model.model.";
/** Name of the lm_head tensor. */
export const HEAD_NAME = "language_model.lm_head.weight";

/** One tensor a layer needs. `shape` is the released shape; A_log may be longer. */
export interface TensorSpec {
  /** Name without the `language_model.model.` prefix. */
  name: string;
  /** The released shape. */
  shape: number[];
  /** How the tensor is bound (matrix, vector, raw). */
  keep: Keep;
  /** Accept any first dimension >= shape[0] (A_log ships padded to 128). */
  atLeast?: boolean;
}

/**
 * Whether kernels other than the dense product read the layer matrix `name` (MLA's
 * kv_b_proj, read by absorb and expand): the trunk ring then decodes its pieces where they
 * land, instead of leaving them coded for the product to decode (WTYPE.bf16Split).
 */
export function readOutsideProducts(name: string): boolean {
  return name.endsWith("self_attn.kv_b_proj.weight");
}

/** Dense (trunk) tensors of layer L, in a fixed order. */
export function layerTensors(cfg: K3Config, L: number): TensorSpec[] {
  const D = cfg.hiddenSize;
  const p = `layers.${L}.`;
  const m = (name: string, rows: number, cols: number): TensorSpec => ({
    name: p + name,
    shape: [rows, cols],
    keep: "matrix",
  });
  const v = (name: string, shape: number[], atLeast = false): TensorSpec => ({
    name: p + name,
    shape,
    keep: "vector",
    atLeast,
  });
  const specs: TensorSpec[] = [
    v("input_layernorm.weight", [D]),
    v("post_attention_layernorm.weight", [D]),
    v("self_attention_res_norm.weight", [D]),
    v("self_attention_res_proj.weight", [1, D]),
    v("mlp_res_norm.weight", [D]),
    v("mlp_res_proj.weight", [1, D]),
  ];
  if (cfg.layerKinds[L] === "kda") {
    const { numHeads: H, headDim: d } = cfg.kda;
    const C = H * d;
    specs.push(
      m("self_attn.q_proj.weight", C, D),
      m("self_attn.k_proj.weight", C, D),
      m("self_attn.v_proj.weight", C, D),
      v("self_attn.q_conv1d.weight", [C, 1, 4]),
      v("self_attn.k_conv1d.weight", [C, 1, 4]),
      v("self_attn.v_conv1d.weight", [C, 1, 4]),
      m("self_attn.f_a_proj.weight", d, D),
      m("self_attn.f_b_proj.weight", C, d),
      m("self_attn.b_proj.weight", H, D),
      v("self_attn.A_log", [H], true),
      v("self_attn.dt_bias", [C]),
      v("self_attn.o_norm.weight", [d]),
      m("self_attn.g_proj.weight", C, D),
      m("self_attn.o_proj.weight", D, C),
    );
  } else {
    const c = cfg.mla;
    const H = c.numHeads;
    specs.push(
      m("self_attn.q_a_proj.weight", c.qLoraRank, D),
      v("self_attn.q_a_layernorm.weight", [c.qLoraRank]),
      m("self_attn.q_b_proj.weight", H * (c.nopeDim + c.ropeDim), c.qLoraRank),
      m("self_attn.kv_a_proj_with_mqa.weight", c.kvLoraRank + c.ropeDim, D),
      v("self_attn.kv_a_layernorm.weight", [c.kvLoraRank]),
      m("self_attn.kv_b_proj.weight", H * (c.nopeDim + c.vDim), c.kvLoraRank),
      m("self_attn.g_proj.weight", H * c.vDim, D),
      m("self_attn.o_proj.weight", D, H * c.vDim),
    );
  }
  if (L < cfg.firstKDense) {
    const I = cfg.denseIntermediate;
    specs.push(m("mlp.gate_proj.weight", I, D), m("mlp.up_proj.weight", I, D), m("mlp.down_proj.weight", D, I));
  } else {
    const e = cfg.moe;
    const S = e.numShared * e.intermediate;
    const b = "block_sparse_moe.";
    specs.push(
      m(b + "gate.weight", e.numExperts, D),
      v(b + "gate.e_score_correction_bias", [e.numExperts]),
      m(b + "routed_expert_down_proj.weight", e.latent, D),
      m(b + "routed_expert_up_proj.weight", D, e.latent),
      v(b + "routed_expert_norm.weight", [e.latent]),
    );
    if (S > 0) {
      specs.push(
        m(b + "shared_experts.gate_proj.weight", S, D),
        m(b + "shared_experts.up_proj.weight", S, D),
        m(b + "shared_experts.down_proj.weight", D, S),
      );
    }
  }
  return specs;
}

/** Model-level tensors outside the layers (embedding and head are handled separately). */
export function globalTensors(cfg: K3Config): TensorSpec[] {
  const D = cfg.hiddenSize;
  return [
    { name: "norm.weight", shape: [D], keep: "vector" },
    { name: "output_attn_res_norm.weight", shape: [D], keep: "vector" },
    { name: "output_attn_res_proj.weight", shape: [1, D], keep: "vector" },
  ];
}

/** The six tensors of routed expert E of layer L, with their shapes. */
export function expertTensors(cfg: K3Config, L: number, E: number): TensorSpec[] {
  const { latent, intermediate: I } = cfg.moe;
  const p = `layers.${L}.block_sparse_moe.experts.${E}.`;
  const u8 = (name: string, rows: number, cols: number): TensorSpec => ({
    name: p + name,
    shape: [rows, cols],
    keep: "u8",
  });
  return [
    u8("w1.weight_packed", I, latent / 2),
    u8("w1.weight_scale", I, latent / 32),
    u8("w3.weight_packed", I, latent / 2),
    u8("w3.weight_scale", I, latent / 32),
    u8("w2.weight_packed", latent, I / 2),
    u8("w2.weight_scale", latent, I / 32),
  ];
}

/** A tensor as a checkpoint describes it (safetensors' header entry). */
export interface TensorFound {
  /** Its full name. */
  name: string;
  /** Its stored shape. */
  shape: number[];
  /** Its stored dtype (safetensors' name: BF16, F16, F32, U8). */
  dtype: string;
}

const FLOAT_DTYPES = new Set(["BF16", "F16", "F32"]);

/** Checks a checkpoint tensor against its spec; throws K3Error naming the tensor. */
export function checkTensor(t: TensorFound, spec: TensorSpec): void {
  const want = spec.shape;
  const got = t.shape;
  const shapeOk = spec.atLeast
    ? got.length === 1 && got[0] >= want[0]
    : got.length === want.length && got.every((d, i) => d === want[i]);
  if (!shapeOk) {
    throw new K3Error(
      `tensor ${t.name}: shape ${JSON.stringify(got)}, expected ${spec.atLeast ? ">= " : ""}${JSON.stringify(want)}`,
    );
  }
  if (spec.keep === "u8" ? t.dtype !== "U8" : !FLOAT_DTYPES.has(t.dtype)) {
    throw new K3Error(`tensor ${t.name}: dtype ${t.dtype}, expected ${spec.keep === "u8" ? "U8" : "BF16, F16 or F32"}`);
  }
}

/** Bytes a tensor takes once bound (after widening). */
export function boundBytes(t: { dtype: string; bytes: number }, keep: Keep): number {
  if (keep === "u8") return t.bytes;
  const elems = t.bytes / (t.dtype === "F32" ? 4 : 2);
  if (keep === "matrix" && t.dtype === "BF16") return elems * 2;
  return elems * 4;
}
