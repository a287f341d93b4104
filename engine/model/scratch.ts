/**
 * The forward pass's scratch: its size (for the memory plan) and its buffers, allocated
 * once for up to `maxT` rows per pass.
 *
 * @module
 */

import type { K3Config } from "./config.ts";
import type { Kernels } from "../native/ffi.ts";
import { Vec } from "../native/memory.ts";

/** Widths the scratch buffers are sized by. */
function scratchShape(cfg: K3Config) {
  const m = cfg.mla;
  const wide = Math.max(
    cfg.kda.numHeads * cfg.kda.headDim,
    cfg.hiddenSize,
    cfg.denseIntermediate,
    cfg.moe.numShared * cfg.moe.intermediate,
    cfg.moe.intermediate,
    cfg.moe.latent,
    cfg.moe.numExperts,
    m.qLoraRank,
    m.kvLoraRank + m.ropeDim,
    m.numHeads * (m.nopeDim + m.ropeDim),
    m.numHeads * (m.kvLoraRank + m.ropeDim),
    m.numHeads * m.vDim,
  );
  return {
    D: cfg.hiddenSize,
    nsrc: Math.floor((cfg.numLayers - 1) / cfg.attnResBlock) + 2,
    wide,
    small: Math.max(cfg.kda.numHeads, cfg.kda.headDim, 1),
  };
}

/** Rows one forward pass holds: a prefill chunk of one sequence beside a decode token of each other. */
export function passRows(chunk: number, sequences: number): number {
  return chunk + sequences - 1;
}

/** Bytes of the forward pass's scratch for chunks of `maxT` tokens (for the memory plan). */
export function scratchBytes(cfg: K3Config, maxT: number, capacity: number): number {
  const { D, nsrc, wide, small } = scratchShape(cfg);
  const { latent, topK } = cfg.moe;
  const floats = maxT * nsrc * D + 3 * maxT * D + 5 * maxT * wide + maxT * small +
    Math.max(cfg.mla.numHeads, 1) * capacity + maxT * latent + maxT * topK * latent + maxT * cfg.vocabSize;
  return 4 * floats + 8 * topK;
}

/**
 * The wide buffers [maxT][wide] by role: the one liveness table. The roles of a stage are
 * live together; a buffer under two names of one stage takes the second once the first is
 * consumed (the stage's comment says when). A layer runs its stages one after another, and
 * a GLU runs inside the MoE stage only on buffers the MoE stage leaves free.
 */
export interface WideRoles {
  /** KDA: q, k, v and the decay input f live through the recurrence, whose output is o;
   * the gate g takes f's place once the decay is consumed (beta is in `small`). */
  kda: { q: Vec; k: Vec; v: Vec; f: Vec; o: Vec; g: Vec };
  /** MLA: qa (q_a's output), then the attended output o in its place; q; c (kv_a's
   * output), then the gate g in its place; qlat and olat, one row's latent query and
   * attended latent. */
  mla: { qa: Vec; o: Vec; q: Vec; c: Vec; g: Vec; qlat: Vec; olat: Vec };
  /** LatentMoE: the router's logits, then acc (the experts' weighted sum) in their place;
   * z (the experts' latent input) lives through every expert. */
  moe: { routerLogits: Vec; acc: Vec; z: Vec };
  /** A GLU (dense MLP, shared experts, a routed expert): gate and up, SiTU into gate; a
   * routed expert's output in `out`. */
  glu: { gate: Vec; up: Vec; out: Vec };
}

/** The five wide buffers w0..w4 under their roles (the table above, as buffers). */
function wideRoles([w0, w1, w2, w3, w4]: readonly Vec[]): WideRoles {
  return {
    kda: { q: w0, k: w1, v: w2, f: w3, o: w4, g: w3 },
    mla: { qa: w0, o: w0, q: w1, c: w2, g: w2, qlat: w3, olat: w4 },
    moe: { routerLogits: w2, acc: w2, z: w3 },
    glu: { gate: w0, up: w1, out: w4 },
  };
}

/** Scratch buffers, allocated once for up to `maxT` tokens per call. */
export class Scratch {
  /** AttnRes sources: [maxT][nsrc][D]. */
  readonly src: Vec;
  /** [maxT][D] sub-layer input. */
  readonly x: Vec;
  /** [maxT][D] normed input. */
  readonly xn: Vec;
  /** [maxT][D] sub-layer output. */
  readonly a: Vec;
  /** The wide temporaries by role (wideRoles). */
  readonly wide: WideRoles;
  /** [maxT][small]. */
  readonly small: Vec;
  /** MLA scores [heads][capacity]. */
  readonly scores: Vec;
  /** Router: the chosen expert ids of one row. */
  readonly ids: Int32Array;
  /** Its native pointer. */
  readonly idsPtr: NonNullable<Deno.PointerValue>;
  /** Router: the chosen experts' weights of one row. */
  readonly wts: Float32Array;
  /** Its native pointer. */
  readonly wtsPtr: NonNullable<Deno.PointerValue>;
  /** Gathered latent inputs [maxT][latent]. */
  readonly expertIn: Vec;
  /** Per token, per chosen slot: [maxT][topK][latent]. */
  readonly expertOut: Vec;
  /** [maxT][vocab]. */
  readonly logits: Vec;

  /** Scratch for passes of up to `maxT` rows, MLA scores over `capacity` positions. */
  constructor(k: Kernels, cfg: K3Config, readonly maxT: number, capacity: number) {
    const { D, nsrc, wide, small } = scratchShape(cfg);
    const m = cfg.mla;
    this.src = new Vec(k, maxT * nsrc * D, "attnres sources");
    this.x = new Vec(k, maxT * D);
    this.xn = new Vec(k, maxT * D);
    this.a = new Vec(k, maxT * D);
    this.wide = wideRoles(Array.from({ length: 5 }, () => new Vec(k, maxT * wide)));
    this.small = new Vec(k, maxT * small);
    this.scores = new Vec(k, Math.max(m.numHeads, 1) * capacity);
    this.ids = new Int32Array(cfg.moe.topK);
    this.idsPtr = Deno.UnsafePointer.of(this.ids)!;
    this.wts = new Float32Array(cfg.moe.topK);
    this.wtsPtr = Deno.UnsafePointer.of(this.wts)!;
    this.expertIn = new Vec(k, maxT * cfg.moe.latent);
    this.expertOut = new Vec(k, maxT * cfg.moe.topK * cfg.moe.latent);
    this.logits = new Vec(k, maxT * cfg.vocabSize, "logits");
  }
}
