/**
 * Binding the released tensor names to typed weights in native memory.
 *
 * One list (`layerTensors`) says which tensors a decoder layer has, with their shapes and
 * how the engine keeps them; loading from safetensors and from a packed trunk both use it.
 * Matrices stay BF16 or F32 as stored (F16 is widened to F32, exactly); vectors are
 * widened to F32. Routed experts stay packed MXFP4.
 *
 * @module
 */

import type { K3Config } from "./config.ts";
import { K3Error } from "../errors.ts";
import { type Kernels, WTYPE } from "../native/ffi.ts";
import { NativeBuffer } from "../native/memory.ts";
import type { Checkpoint, TensorInfo } from "../weights/safetensors.ts";
import type { MatrixCheck } from "../weights/tensor_check.ts";
import type { ExpertCheck } from "../weights/expert_table.ts";

/** Prefix of every decoder tensor's name in the checkpoint. */
export const PREFIX = "language_model.model.";
/** Name of the lm_head tensor. */
export const HEAD_NAME = "language_model.lm_head.weight";

/** A dense matrix [rows][cols] in native memory, BF16 or F32. */
export interface Matrix {
  /** Native pointer to the weights. */
  ptr: NonNullable<Deno.PointerValue>;
  /** Element type (WTYPE). */
  wtype: number;
  /** Output rows. */
  rows: number;
  /** Input columns. */
  cols: number;
  /** For a streamed matrix: the check its first product settles (tensor_check.ts). */
  check?: MatrixCheck;
}

/** A float32 vector in native memory. */
export interface F32 {
  /** Native pointer to the values. */
  ptr: NonNullable<Deno.PointerValue>;
  /** The same memory as a Float32Array. */
  f: Float32Array;
}

/** One MXFP4 matrix: packed [rows][cols/2] and scales [rows][cols/32]. */
export interface Mxfp4 {
  /** Native pointer to the packed 4-bit values. */
  packed: NonNullable<Deno.PointerValue>;
  /** Native pointer to the per-block scales. */
  scales: NonNullable<Deno.PointerValue>;
  /** Output rows. */
  rows: number;
  /** Input columns. */
  cols: number;
}

/** One routed expert: gate w1, up w3, down w2. */
export interface Expert {
  /** Gate projection. */
  w1: Mxfp4;
  /** Up projection. */
  w3: Mxfp4;
  /** Down projection. */
  w2: Mxfp4;
  /** With an expert table: the digest its first run settles (expert_table.ts). */
  check?: ExpertCheck;
}

/** How a tensor is kept in memory. */
export type Keep = "matrix" | "vector" | "u8";

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

const FLOAT_DTYPES = new Set(["BF16", "F16", "F32"]);

/** Checks a checkpoint tensor against its spec; throws K3Error naming the tensor. */
export function checkTensor(t: TensorInfo, spec: TensorSpec): void {
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

/**
 * Checks that every tensor the model binds is present with the right shape and dtype,
 * before anything is allocated, so a bad checkpoint fails fast with the tensor named.
 */
export function checkCheckpoint(cfg: K3Config, ckpt: Checkpoint): void {
  const D = cfg.hiddenSize, V = cfg.vocabSize;
  const check = (specs: TensorSpec[]) => {
    for (const spec of specs) checkTensor(ckpt.get(PREFIX + spec.name), spec);
  };
  check(globalTensors(cfg));
  check([{ name: "embed_tokens.weight", shape: [V, D], keep: "matrix" }]);
  checkTensor(ckpt.get(HEAD_NAME), { name: HEAD_NAME, shape: [V, D], keep: "matrix" });
  for (let L = 0; L < cfg.numLayers; L++) {
    check(layerTensors(cfg, L));
    if (L >= cfg.firstKDense) {
      for (let E = 0; E < cfg.moe.numExperts; E++) check(expertTensors(cfg, L, E));
    }
  }
}

/** Bytes a tensor takes once bound (after widening). */
export function boundBytes(t: { dtype: string; bytes: number }, keep: Keep): number {
  if (keep === "u8") return t.bytes;
  const elems = t.bytes / (t.dtype === "F32" ? 4 : 2);
  if (keep === "matrix" && t.dtype === "BF16") return elems * 2;
  return elems * 4;
}

/** Widens n BF16 or F16 elements at `src` to F32 at `dst`. */
function widen(k: Kernels, dtype: string, src: Deno.PointerValue, dst: Deno.PointerValue, n: number): void {
  if (dtype === "BF16") k.k3_bf16_to_f32(src, dst, n);
  else k.k3_f16_to_f32(src, dst, n);
}

/** A set of bound tensors of one layer (or of the globals), by short name. */
export class BoundTensors {
  /** Tensors bound by name, freed together. */
  constructor(
    readonly matrices: Map<string, Matrix>,
    readonly vectors: Map<string, F32>,
    readonly owned: NativeBuffer[],
  ) {}

  /** The matrix `name`; throws when it was not bound as one. */
  matrix(name: string): Matrix {
    const m = this.matrices.get(name);
    if (!m) throw new Error(`internal: matrix ${name} not bound`);
    return m;
  }

  /** The vector `name`; throws when it was not bound as one. */
  vector(name: string): F32 {
    const v = this.vectors.get(name);
    if (!v) throw new Error(`internal: vector ${name} not bound`);
    return v;
  }

  /** Frees every bound tensor. */
  free(): void {
    for (const b of this.owned) b.free();
  }
}

/**
 * Reads and binds the given tensors from the checkpoint, one native buffer each (tensors
 * that need widening are read into a temporary buffer first). `prefix` is prepended to
 * spec names.
 */
export async function loadTensors(
  k: Kernels,
  ckpt: Checkpoint,
  specs: TensorSpec[],
  prefix = PREFIX,
): Promise<BoundTensors> {
  const matrices = new Map<string, Matrix>();
  const vectors = new Map<string, F32>();
  const owned: NativeBuffer[] = [];
  try {
    // Every tensor is checked before anything is allocated; then all are read together
    // (readTensors: deep direct reads) and each is bound as soon as its bytes are in.
    const tensors = specs.map((spec) => {
      const t = ckpt.get(prefix + spec.name);
      checkTensor(t, spec);
      return t;
    });
    await ckpt.readTensors(k, tensors, (i, { buf, delta }) => {
      const t = tensors[i], spec = specs[i];
      owned.push(buf);
      let ptr = buf.at(delta);
      const widened = boundBytes(t, spec.keep) !== t.bytes;
      if (widened) {
        const elems = t.bytes / 2;
        const wide = NativeBuffer.alloc(k, elems * 4, t.name);
        owned.push(wide);
        widen(k, t.dtype, ptr, wide.ptr, elems);
        owned.splice(owned.indexOf(buf), 1);
        buf.free();
        ptr = wide.ptr;
      }
      if (spec.keep === "matrix") {
        const wtype = widened || t.dtype === "F32" ? WTYPE.f32 : WTYPE.bf16;
        matrices.set(spec.name, { ptr, wtype, rows: spec.shape[0], cols: spec.shape[1] });
      } else if (spec.keep === "vector") {
        vectors.set(spec.name, {
          ptr,
          f: new Float32Array(Deno.UnsafePointerView.getArrayBuffer(ptr, boundBytes(t, spec.keep))),
        });
      }
    });
  } catch (e) {
    for (const b of owned) b.free();
    throw e;
  }
  return new BoundTensors(matrices, vectors, owned);
}
