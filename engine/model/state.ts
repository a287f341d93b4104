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

/** Rows a speculation record holds unless a longer draft asks for more: the usual draft
 * (8 tokens) and the pending token. */
export const SPEC_RECORD_ROWS = 9;

/**
 * Bytes of one sequence's {@link SpeculationRecord} for passes of up to `rows` of its rows:
 * per KDA layer the state and conv histories from before the pass, and each row's conv and
 * delta-rule inputs (~0.68 GB for the released model at 9 rows).
 */
export function speculationBytes(cfg: K3Config, rows: number): number {
  const { numHeads: H, headDim: d } = cfg.kda;
  const C = H * d;
  const nK = cfg.layerKinds.filter((x) => x === "kda").length;
  return 4 * (C + nK * (H * d * d + 3 * 3 * C + rows * (7 * C + H)));
}

/** Per-sequence state carried between forward calls (incremental decoding). */
export class SequenceState {
  /** Number of tokens already processed. */
  pos = 0;
  /** KDA layers: conv histories of q, k, v ([C][3] each) and the recurrent state S. */
  readonly kda = new Map<number, { convQ: Vec; convK: Vec; convV: Vec; S: Vec }>();
  /** MLA layers: the latent cache, normed latents [pos][kvLoraRank] and raw k_rope [pos][ropeDim]. */
  readonly mla = new Map<number, { latent: Vec; krope: Vec }>();
  /** What the last speculative pass kept to cut the state back to a prefix of its rows
   * (allocated by the first such pass; see SpeculationRecord). */
  spec?: SpeculationRecord;

  readonly #latentDim: number;
  readonly #ropeDim: number;
  /** Each KDA layer's offset in a snapshot (its regions come first, in layer order). */
  readonly #kdaOffset = new Map<number, number>();
  /** Snapshots the next pass takes as it goes ({@link keepDuringPass}): position -> payload. */
  #during = new Map<number, Uint8Array>();

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
    // Each KDA layer's offset in a snapshot, from the layout regions() defines.
    const parts = this.regions(0);
    let off = 0;
    [...this.kda.keys()].forEach((L, i) => {
      this.#kdaOffset.set(L, off);
      for (let j = 0; j < 4; j++) off += parts[4 * i + j].length;
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

  /**
   * Asks the next forward pass to take this state's {@link snapshot} at each of
   * `positions` (each past {@link pos} and at most where the pass ends) on its way: each
   * KDA layer's part is copied as that layer's rows reach the position ({@link keptKda}),
   * the MLA caches' prefixes by {@link takeKept} after the pass. So a prompt that keeps
   * states at several positions (the state cache's message boundaries) still runs in one
   * pass, one read of the streamed model, with the bytes a pass ending there would leave.
   */
  keepDuringPass(positions: readonly number[]): void {
    this.#during = new Map(positions.map((p) => [p, new Uint8Array(this.snapshotBytes(p))]));
  }

  /** Whether the next pass keeps a snapshot at `pos` ({@link keepDuringPass}). */
  keepsAt(pos: number): boolean {
    return this.#during.has(pos);
  }

  /** The pass has run KDA layer `L` over the rows up to `pos` positions: copies the
   * layer's state into a snapshot asked for there. */
  keptKda(L: number, pos: number): void {
    const payload = this.#during.get(pos);
    if (!payload) return;
    const s = this.kda.get(L)!;
    let off = this.#kdaOffset.get(L)!;
    for (const v of [s.convQ, s.convK, s.convV, s.S]) {
      payload.set(v.buf.u8.subarray(0, v.length * 4), off);
      off += v.length * 4;
    }
  }

  /** After the pass: the snapshots {@link keepDuringPass} asked for, completed with the MLA
   * caches' prefixes (rows a pass writes past a position never change those before it),
   * in position order; forgets them. */
  takeKept(): { pos: number; payload: Uint8Array }[] {
    const kept = [...this.#during].sort(([a], [b]) => a - b).map(([pos, payload]) => {
      const parts = this.regions(pos), kdaParts = 4 * this.kda.size;
      let off = parts.slice(0, kdaParts).reduce((n, p) => n + p.length, 0);
      for (const part of parts.slice(kdaParts)) (payload.set(part, off), off += part.length);
      return { pos, payload };
    });
    this.#during = new Map();
    return kept;
  }

  /** Bytes of a {@link snapshot} at `pos` positions. */
  snapshotBytes(pos: number): number {
    return this.regions(pos).reduce((n, p) => n + p.length, 0);
  }

  /** Frees the state's native buffers. */
  free(): void {
    for (const s of this.kda.values()) [s.convQ, s.convK, s.convV, s.S].forEach((v) => v.buf.free());
    for (const s of this.mla.values()) [s.latent, s.krope].forEach((v) => v.buf.free());
    this.spec?.free();
    this.spec = undefined;
  }
}

/** One KDA layer's record of a speculative pass: the state before it and each row's inputs. */
interface KdaRecord {
  /** S before the pass. */
  S: Vec;
  /** Conv histories before the pass, [C][3] each. */
  convQ: Vec;
  convK: Vec;
  convV: Vec;
  /** Per row [rows][C]: the conv inputs (the projections before the conv). */
  rawQ: Vec;
  rawK: Vec;
  rawV: Vec;
  /** Per row: the delta rule's inputs q, k, v [rows][C], alpha [rows][C], beta [rows][H]. */
  q: Vec;
  k: Vec;
  v: Vec;
  alpha: Vec;
  beta: Vec;
}

/**
 * What a speculative pass keeps so that a sequence's state can be cut back to any prefix of
 * the pass's rows (the positions whose draft tokens were accepted): per KDA layer the
 * recurrent state and conv histories from before the pass and each row's inputs to the
 * conv and to the delta rule. Cutting back replays the delta rule over the kept rows from
 * the saved state (the same kernel on the same inputs, so the same bits as a pass over
 * those rows alone) and rebuilds the conv histories from the saved inputs; no weight is
 * read. The MLA cache needs nothing: rows past the position are overwritten later.
 */
export class SpeculationRecord {
  /** The sequence's position when the pass began. */
  pos0 = 0;
  /** Rows the pass ran for this sequence (0: nothing recorded). */
  rows = 0;
  /** Per KDA layer. */
  readonly kda = new Map<number, KdaRecord>();
  private readonly o: Vec;

  /** Room for passes of up to `maxRows` rows of this sequence. */
  constructor(k: Kernels, private readonly cfg: K3Config, readonly maxRows: number) {
    const { numHeads: H, headDim: d } = cfg.kda;
    const C = H * d;
    this.o = new Vec(k, maxRows * C); // the replayed rows' outputs, unused
    cfg.layerKinds.forEach((kind, L) => {
      if (kind !== "kda") return;
      const rows = (n: number) => new Vec(k, maxRows * n);
      this.kda.set(L, {
        S: new Vec(k, H * d * d),
        convQ: new Vec(k, C * 3),
        convK: new Vec(k, C * 3),
        convV: new Vec(k, C * 3),
        rawQ: rows(C),
        rawK: rows(C),
        rawV: rows(C),
        q: rows(C),
        k: rows(C),
        v: rows(C),
        alpha: rows(C),
        beta: rows(H),
      });
    });
  }

  /**
   * Cuts `state` back to the first `keep` rows of the recorded pass (1 <= keep <= rows):
   * position pos0 + keep, the KDA states and conv histories as after those rows alone.
   */
  keepPrefix(k: Kernels, state: SequenceState, keep: number): void {
    if (!(keep >= 1 && keep <= this.rows)) throw new Error(`speculation: keep ${keep} of ${this.rows} rows`);
    const { numHeads: H, headDim: d } = this.cfg.kda;
    const C = H * d;
    if (keep < this.rows) {
      for (const [L, r] of this.kda) {
        const st = state.kda.get(L)!;
        st.S.f.set(r.S.f);
        k.k3_kda_steps(st.S.ptr, r.q.ptr, r.k.ptr, r.v.ptr, r.beta.ptr, r.alpha.ptr, this.o.ptr, d, H, keep, 0, H);
        // A conv history holds, per channel, the last three inputs oldest first: after
        // `keep` rows, entries keep.. of (the history before, then the rows' inputs).
        const conv = (hist: Vec, before: Vec, raw: Vec) => {
          for (let c = 0; c < C; c++) {
            for (let i = 0; i < 3; i++) {
              const m = keep + i;
              hist.f[c * 3 + i] = m < 3 ? before.f[c * 3 + m] : raw.f[(m - 3) * C + c];
            }
          }
        };
        conv(st.convQ, r.convQ, r.rawQ);
        conv(st.convK, r.convK, r.rawK);
        conv(st.convV, r.convV, r.rawV);
      }
    }
    state.pos = this.pos0 + keep;
    this.rows = 0;
  }

  /** Frees the record's native buffers. */
  free(): void {
    this.o.buf.free();
    for (const r of this.kda.values()) for (const v of Object.values(r)) v.buf.free();
  }
}
