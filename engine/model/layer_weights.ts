/**
 * A decoder layer's dense weights as one typed record, built once when the layer is bound
 * (resident at load, streamed each time its bytes land), so the forward pass reads fields
 * and never builds a tensor name. The names here are those of `layerTensors`
 * (./tensors.ts), the one list of what a layer has.
 *
 * @module
 */

import type { K3Config } from "./config.ts";
import type { F32, Matrix } from "../native/tensors.ts";

/** A SiTU-GLU MLP: down(SiTU(gate x, up x)). */
export interface GluWeights {
  /** gate_proj. */
  gate: Matrix;
  /** up_proj. */
  up: Matrix;
  /** down_proj. */
  down: Matrix;
}

/** Kimi Delta Attention's weights. */
export interface KdaWeights {
  /** The attention kind. */
  kind: "kda";
  /** q_proj. */
  q: Matrix;
  /** k_proj. */
  k: Matrix;
  /** v_proj. */
  v: Matrix;
  /** q_conv1d (the short convolution of q). */
  qConv: F32;
  /** k_conv1d. */
  kConv: F32;
  /** v_conv1d. */
  vConv: F32;
  /** f_a_proj (the low-rank decay input, then f_b_proj). */
  fA: Matrix;
  /** f_b_proj. */
  fB: Matrix;
  /** b_proj (beta, one per head). */
  beta: Matrix;
  /** A_log (the decay's per-head log rate). */
  aLog: F32;
  /** dt_bias. */
  dtBias: F32;
  /** o_norm (per-head RMSNorm of the output). */
  oNorm: F32;
  /** g_proj (the output gate). */
  gate: Matrix;
  /** o_proj. */
  o: Matrix;
}

/** Gated MLA's weights. */
export interface MlaWeights {
  /** The attention kind. */
  kind: "mla";
  /** q_a_proj. */
  qA: Matrix;
  /** q_a_layernorm. */
  qANorm: F32;
  /** q_b_proj. */
  qB: Matrix;
  /** kv_a_proj_with_mqa (the latent and the shared raw key part). */
  kvA: Matrix;
  /** kv_a_layernorm. */
  kvANorm: F32;
  /** kv_b_proj (read by absorb and expand). */
  kvB: Matrix;
  /** g_proj (the output gate). */
  gate: Matrix;
  /** o_proj. */
  o: Matrix;
}

/** A dense MLP layer (L < first_k_dense_replace). */
export interface DenseMlpWeights extends GluWeights {
  /** The MLP kind. */
  kind: "dense";
}

/** A LatentMoE layer's dense weights (its routed experts come from the weight source). */
export interface MoeWeights {
  /** The MLP kind. */
  kind: "moe";
  /** gate (the router). */
  router: Matrix;
  /** gate.e_score_correction_bias. */
  routerBias: F32;
  /** routed_expert_down_proj (into the experts' latent). */
  latentDown: Matrix;
  /** routed_expert_up_proj (back from the latent). */
  latentUp: Matrix;
  /** routed_expert_norm. */
  latentNorm: F32;
  /** The shared experts, when the model has them. */
  shared?: GluWeights;
}

/** AttnRes's weights before a sub-layer: its norm and its projection. */
export interface AttnResWeights {
  /** The norm (`*_res_norm`). */
  norm: F32;
  /** The projection (`*_res_proj`). */
  proj: F32;
}

/** One decoder layer's dense weights. */
export interface LayerWeights {
  /** AttnRes before attention. */
  attnRes: AttnResWeights;
  /** input_layernorm. */
  inputNorm: F32;
  /** The attention. */
  attention: KdaWeights | MlaWeights;
  /** AttnRes before the MLP. */
  mlpRes: AttnResWeights;
  /** post_attention_layernorm. */
  postAttentionNorm: F32;
  /** The MLP. */
  mlp: DenseMlpWeights | MoeWeights;
}

/** Bound tensors by name (without the checkpoint's prefix). */
export interface NamedTensors {
  /** The matrix `name`; throws when it was not bound as one. */
  matrix(name: string): Matrix;
  /** The vector `name`; throws when it was not bound as one. */
  vector(name: string): F32;
}

/** Layer L's record from its bound tensors. */
export function layerWeights(cfg: K3Config, L: number, t: NamedTensors): LayerWeights {
  const p = `layers.${L}.`;
  const m = (name: string) => t.matrix(p + name);
  const v = (name: string) => t.vector(p + name);
  const glu = (at: string): GluWeights => ({
    gate: m(`${at}gate_proj.weight`),
    up: m(`${at}up_proj.weight`),
    down: m(`${at}down_proj.weight`),
  });
  const a = "self_attn.";
  const attention: KdaWeights | MlaWeights = cfg.layerKinds[L] === "kda"
    ? {
      kind: "kda",
      q: m(a + "q_proj.weight"),
      k: m(a + "k_proj.weight"),
      v: m(a + "v_proj.weight"),
      qConv: v(a + "q_conv1d.weight"),
      kConv: v(a + "k_conv1d.weight"),
      vConv: v(a + "v_conv1d.weight"),
      fA: m(a + "f_a_proj.weight"),
      fB: m(a + "f_b_proj.weight"),
      beta: m(a + "b_proj.weight"),
      aLog: v(a + "A_log"),
      dtBias: v(a + "dt_bias"),
      oNorm: v(a + "o_norm.weight"),
      gate: m(a + "g_proj.weight"),
      o: m(a + "o_proj.weight"),
    }
    : {
      kind: "mla",
      qA: m(a + "q_a_proj.weight"),
      qANorm: v(a + "q_a_layernorm.weight"),
      qB: m(a + "q_b_proj.weight"),
      kvA: m(a + "kv_a_proj_with_mqa.weight"),
      kvANorm: v(a + "kv_a_layernorm.weight"),
      kvB: m(a + "kv_b_proj.weight"),
      gate: m(a + "g_proj.weight"),
      o: m(a + "o_proj.weight"),
    };
  const b = "block_sparse_moe.";
  const mlp: DenseMlpWeights | MoeWeights = L < cfg.firstKDense ? { kind: "dense", ...glu("mlp.") } : {
    kind: "moe",
    router: m(b + "gate.weight"),
    routerBias: v(b + "gate.e_score_correction_bias"),
    latentDown: m(b + "routed_expert_down_proj.weight"),
    latentUp: m(b + "routed_expert_up_proj.weight"),
    latentNorm: v(b + "routed_expert_norm.weight"),
    shared: cfg.moe.numShared > 0 ? glu(b + "shared_experts.") : undefined,
  };
  return {
    attnRes: { norm: v("self_attention_res_norm.weight"), proj: v("self_attention_res_proj.weight") },
    inputNorm: v("input_layernorm.weight"),
    attention,
    mlpRes: { norm: v("mlp_res_norm.weight"), proj: v("mlp_res_proj.weight") },
    postAttentionNorm: v("post_attention_layernorm.weight"),
    mlp,
  };
}
