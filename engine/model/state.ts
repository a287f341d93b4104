/**
 * A sequence's state between forward calls: the KDA layers' conv histories and recurrent
 * states, the MLA layers' latent cache, and the position; and what it takes in bytes (for
 * the memory plan).
 *
 * @module
 */

import type { K3Config } from "./config.ts";
import type { Kernels } from "../native/ffi.ts";
import { Vec } from "../native/memory.ts";

/**
 * Bytes of sequence state: the KDA layers' conv histories and recurrent states (fixed) and
 * the MLA layers' latent cache per position (the normed kv latent and the shared raw key
 * part, fp32: 576 floats per MLA layer for the released model, ~55 KB per position for all
 * 24 MLA layers instead of ~2.37 MB for expanded keys and values).
 */
export function stateBytes(cfg: K3Config): { fixed: number; perPosition: number } {
  const { numHeads: H, headDim: d } = cfg.kda;
  const nK = cfg.layerKinds.filter((x) => x === "kda").length;
  const nM = cfg.numLayers - nK;
  return {
    fixed: 4 * nK * (3 * 3 * H * d + H * d * d),
    perPosition: 4 * nM * (cfg.mla.kvLoraRank + cfg.mla.ropeDim),
  };
}

/** Per-sequence state carried between forward calls (incremental decoding). */
export class SequenceState {
  /** Number of tokens already processed. */
  pos = 0;
  /** KDA layers: conv histories of q, k, v ([C][3] each) and the recurrent state S. */
  readonly kda = new Map<number, { convQ: Vec; convK: Vec; convV: Vec; S: Vec }>();
  /** MLA layers: the latent cache, normed latents [pos][kvLoraRank] and raw k_rope [pos][ropeDim]. */
  readonly mla = new Map<number, { latent: Vec; krope: Vec }>();

  /** Allocates the state for up to `capacity` positions. */
  constructor(k: Kernels, cfg: K3Config, readonly capacity: number) {
    const { numHeads: H, headDim: d } = cfg.kda;
    const m = cfg.mla;
    cfg.layerKinds.forEach((kind, L) => {
      if (kind === "kda") {
        const C = H * d;
        this.kda.set(L, {
          convQ: new Vec(k, C * 3),
          convK: new Vec(k, C * 3),
          convV: new Vec(k, C * 3),
          S: new Vec(k, H * d * d),
        });
      } else {
        this.mla.set(L, {
          latent: new Vec(k, capacity * m.kvLoraRank),
          krope: new Vec(k, capacity * Math.max(m.ropeDim, 1)),
        });
      }
    });
    this.reset();
  }

  /** Back to an empty sequence. */
  reset(): void {
    this.pos = 0;
    for (const s of this.kda.values()) {
      s.convQ.f.fill(0);
      s.convK.f.fill(0);
      s.convV.f.fill(0);
      s.S.f.fill(0);
    }
  }

  /** Frees the state's native buffers. */
  free(): void {
    for (const s of this.kda.values()) [s.convQ, s.convK, s.convV, s.S].forEach((v) => v.buf.free());
    for (const s of this.mla.values()) [s.latent, s.krope].forEach((v) => v.buf.free());
  }
}
