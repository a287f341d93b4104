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

  readonly #latentDim: number;
  readonly #ropeDim: number;

  /** Allocates the state for up to `capacity` positions. */
  constructor(k: Kernels, cfg: K3Config, readonly capacity: number) {
    const { numHeads: H, headDim: d } = cfg.kda;
    const m = cfg.mla;
    this.#latentDim = m.kvLoraRank;
    this.#ropeDim = m.ropeDim;
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

  /**
   * The native bytes the forward pass reads from this state at `pos` positions, in the
   * saved-state payload's order: each KDA layer (convQ, convK, convV, S), then each MLA
   * layer (latent [pos][kvLoraRank], krope [pos][ropeDim]). Views, not copies.
   */
  regions(pos = this.pos): Uint8Array[] {
    const out: Uint8Array[] = [];
    for (const s of this.kda.values()) {
      for (const v of [s.convQ, s.convK, s.convV, s.S]) out.push(v.buf.u8.subarray(0, v.length * 4));
    }
    for (const s of this.mla.values()) {
      out.push(s.latent.buf.u8.subarray(0, pos * this.#latentDim * 4));
      out.push(s.krope.buf.u8.subarray(0, pos * this.#ropeDim * 4));
    }
    return out;
  }

  /**
   * A copy of every byte the forward pass reads at the current position (the payload of
   * {@link regions}, back to back): what {@link restore} needs to continue exactly here.
   */
  snapshot(): Uint8Array {
    const parts = this.regions();
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let off = 0;
    for (const p of parts) (out.set(p, off), off += p.length);
    return out;
  }

  /**
   * Makes this state the one {@link snapshot} copied at `pos` positions: every region
   * written and the position set, so the next forward call reads exactly what the original
   * state would have. Throws when the bytes do not fit this state's layout or capacity.
   */
  restore(bytes: Uint8Array, pos: number): void {
    if (!Number.isSafeInteger(pos) || pos < 0 || pos > this.capacity) {
      throw new Error(`restore: position ${pos} outside this state's capacity ${this.capacity}`);
    }
    const parts = this.regions(pos);
    const want = parts.reduce((n, p) => n + p.length, 0);
    if (bytes.length !== want) throw new Error(`restore: ${bytes.length} bytes for a state that needs ${want}`);
    let off = 0;
    for (const p of parts) (p.set(bytes.subarray(off, off + p.length)), off += p.length);
    this.pos = pos;
  }

  /** Frees the state's native buffers. */
  free(): void {
    for (const s of this.kda.values()) [s.convQ, s.convK, s.convV, s.S].forEach((v) => v.buf.free());
    for (const s of this.mla.values()) [s.latent, s.krope].forEach((v) => v.buf.free());
  }
}
