/**
 * The forward pass's scratch: its size (for the memory plan) and its buffers, allocated
 * once for up to `maxT` rows per pass.
 *
 * @module
 */

import type { K3Config } from "./config.ts";
import type { Kernels } from "../native/ffi.ts";
import { Vec } from "../native/memory.ts";

/** Widths the scratch buffers are sized by. MLA's latent query and attended latent have
 * their own one-row buffers (`Scratch.qlat`, `Scratch.olat`), so they do not widen `wide`. */
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
    m.numHeads * m.vDim,
  );
  return {
    D: cfg.hiddenSize,
    nsrc: Math.floor((cfg.numLayers - 1) / cfg.attnResBlock) + 2,
    wide,
    small: Math.max(cfg.kda.numHeads, cfg.kda.headDim, 1),
  };
}

/**
 * Rows of a routed expert's tile: as many as the wide buffers hold at the expert's widths
 * (its input and output `latent`, its gate and up `intermediate` wide), at least the
 * tile's. An expert is narrower than the widest temporary (the dense MLP), so its tile is
 * several times taller: at the released widths 64 rows of the wide buffers hold 603 of an
 * expert's, so the ~73 rows a 4,096-id prompt gives each expert run as one tile.
 */
export function expertTileRows(cfg: K3Config, tileRows: number): number {
  const { wide } = scratchShape(cfg);
  return Math.max(tileRows, Math.floor((tileRows * wide) / Math.max(cfg.moe.intermediate, cfg.moe.latent)));
}

/** Rows one forward pass holds: a prefill chunk of one sequence beside a decode token of each other. */
export function passRows(chunk: number, sequences: number): number {
  return chunk + sequences - 1;
}

/**
 * Rows of the wide temporaries by default: a pass of more rows runs its projections, MLPs
 * and experts in tiles of this many rows. 64 rows are past the products' 16-row superblock
 * and keep a tile near 50 MB at the released widths.
 */
export const DEFAULT_TILE_ROWS = 64;

/** The rows a scratch is sized for (see Scratch). */
export interface ScratchRows {
  /** Rows of a pass (the segment and the decode rows beside it). */
  rows: number;
  /** Rows of a tile of wide temporaries (default min(rows, DEFAULT_TILE_ROWS)). */
  tileRows?: number;
  /** Rows whose logits a pass can return (default `rows`). */
  logitRows?: number;
  /** Positions MLA attends over (its scores). */
  capacity: number;
}

/** `rows` with its defaults filled in. */
export function scratchRows(r: ScratchRows): Required<ScratchRows> {
  return {
    rows: r.rows,
    tileRows: Math.max(1, Math.min(r.rows, r.tileRows ?? DEFAULT_TILE_ROWS)),
    logitRows: Math.max(1, Math.min(r.rows, r.logitRows ?? r.rows)),
    capacity: r.capacity,
  };
}

/**
 * Bytes a segment row holds for the whole pass: its AttnRes sources (the residual stream),
 * its experts' latent input, its experts' outputs (and where each landed), and its routing.
 */
export function segmentRowBytes(cfg: K3Config): number {
  const { D, nsrc } = scratchShape(cfg);
  const { latent, topK } = cfg.moe;
  return 4 * (nsrc * D + latent + topK * latent) + 12 * topK;
}

/** Bytes of the scratch that do not grow with the segment: the tiles, one MLA row, the
 * MLA scores and the logits. */
export function scratchFixedBytes(cfg: K3Config, tileRows: number, logitRows: number, capacity: number): number {
  const { D, wide, small } = scratchShape(cfg);
  const m = cfg.mla;
  const H = Math.max(m.numHeads, 1);
  const floats = 2 * Math.max(tileRows, logitRows) * D + tileRows * D + 5 * tileRows * wide + tileRows * small +
    H * (m.kvLoraRank + m.ropeDim) + H * m.kvLoraRank + H * capacity +
    logitRows * cfg.vocabSize;
  return 4 * floats + 8 * cfg.moe.topK;
}

/**
 * Rows of logits a pass of `sequences` sequences returns at most in generation: one row
 * per sequence and the drafts of the decoding ones (the scheduler caps the drafts to fit),
 * as many as a 16-token chunk held before segments grew.
 */
export function logitRowsFor(sequences: number): number {
  return passRows(16, sequences);
}

/** The scratch rows of a planned pass (openModel's model and the memory plan): `rows` rows,
 * default tiles, and logits for `sequences` sequences. */
export function planScratchRows(rows: number, sequences: number, capacity: number): ScratchRows {
  return { rows, tileRows: DEFAULT_TILE_ROWS, logitRows: logitRowsFor(sequences), capacity };
}

/** Bytes of the forward pass's scratch for these rows (for the memory plan). */
export function scratchBytes(cfg: K3Config, rows: ScratchRows): number {
  const r = scratchRows(rows);
  return r.rows * segmentRowBytes(cfg) + scratchFixedBytes(cfg, r.tileRows, r.logitRows, r.capacity);
}

/**
 * The wide buffers [tileRows][wide] by role: the one liveness table. The roles of a stage are
 * live together; a buffer under two names of one stage takes the second once the first is
 * consumed (the stage's comment says when). A layer runs its stages one after another, and
 * a GLU runs inside the MoE stage only on buffers the MoE stage leaves free.
 */
export interface WideRoles {
  /** KDA: q, k, v and the decay input f live through the recurrence, whose output is o;
   * the gate g takes f's place once the decay is consumed (beta is in `small`). */
  kda: { q: Vec; k: Vec; v: Vec; f: Vec; o: Vec; g: Vec };
  /** MLA: qa (q_a's output), then the attended output o in its place; q; c (kv_a's
   * output), then the gate g in its place; the latent queries and attended latents of a
   * tile of query rows, qlat and olat (when they hold less than a row: Scratch.qlat and
   * Scratch.olat). */
  mla: { qa: Vec; o: Vec; q: Vec; c: Vec; g: Vec; qlat: Vec; olat: Vec };
  /** LatentMoE: the router's logits, then acc (the experts' weighted sum) in their place
   * (z, the experts' latent input, lives through every expert: Scratch.z). */
  moe: { routerLogits: Vec; acc: Vec };
  /** A GLU (dense MLP, shared experts, a routed expert): gate and up, SiTU into gate; a
   * routed expert's gathered input rows in `in` (the MoE stage leaves it free: the
   * router's logits are consumed before the experts run; the expert's output goes straight
   * to Scratch.expertOut). */
  glu: { gate: Vec; up: Vec; in: Vec };
}

/** The five wide buffers w0..w4 under their roles (the table above, as buffers). */
function wideRoles([w0, w1, w2, w3, w4]: readonly Vec[]): WideRoles {
  return {
    kda: { q: w0, k: w1, v: w2, f: w3, o: w4, g: w3 },
    mla: { qa: w0, o: w0, q: w1, c: w2, g: w2, qlat: w3, olat: w4 },
    moe: { routerLogits: w2, acc: w2 },
    glu: { gate: w0, up: w1, in: w3 },
  };
}

/**
 * Scratch buffers, allocated once, by lifetime: the segment's rows (live across the
 * layers, or across one MoE stage), a tile's wide temporaries, one MLA row, and the
 * logits of the rows that want them. A pass of more rows than a tile runs its
 * projections in tiles (model.ts); a row's bits do not depend on the tile.
 */
export class Scratch {
  /** Rows of a pass. */
  readonly rows: number;
  /** Rows of a tile. */
  readonly tileRows: number;
  /** Rows of logits. */
  readonly logitRows: number;
  /** AttnRes sources: [rows][nsrc][D]. */
  readonly src: Vec;
  /** The experts' latent input: [rows][latent]. */
  readonly z: Vec;
  /** The routed experts' outputs, [rows * topK][latent], in the order the experts ran (each
   * expert's rows together, as its product wrote them). */
  readonly expertOut: Vec;
  /** Per row, per router slot: which row of expertOut holds that expert's output. */
  readonly expertAt: Int32Array;
  /** Per row, the router's chosen expert ids: [rows][topK]. */
  readonly routeIds: Int32Array;
  /** Per row, the chosen experts' weights: [rows][topK]. */
  readonly routeWts: Float32Array;
  /** [max(tileRows, logitRows)][D] sub-layer input (the head's rows too). */
  readonly x: Vec;
  /** [max(tileRows, logitRows)][D] normed input. */
  readonly xn: Vec;
  /** [tileRows][D] sub-layer output. */
  readonly a: Vec;
  /** The wide temporaries by role (wideRoles), [tileRows][wide] each. */
  readonly wide: WideRoles;
  /** [tileRows][small]. */
  readonly small: Vec;
  /** Rows of a routed expert's tile in the wide buffers (expertTileRows). */
  readonly expertRows: number;
  /** MLA: one row's latent query [heads][kvLoraRank + ropeDim]. */
  readonly qlat: Vec;
  /** MLA: one row's attended latent [heads][kvLoraRank]. */
  readonly olat: Vec;
  /** MLA scores [heads][capacity] (a tile of query rows uses them as [rows][heads][positions]). */
  readonly scores: Vec;
  /** Router: the chosen expert ids of one row. */
  readonly ids: Int32Array;
  /** Its native pointer. */
  readonly idsPtr: NonNullable<Deno.PointerValue>;
  /** Router: the chosen experts' weights of one row. */
  readonly wts: Float32Array;
  /** Its native pointer. */
  readonly wtsPtr: NonNullable<Deno.PointerValue>;
  /** [logitRows][vocab]. */
  readonly logits: Vec;

  /** Scratch for passes of up to `shape.rows` rows (see ScratchRows). */
  constructor(k: Kernels, cfg: K3Config, shape: ScratchRows) {
    const { rows, tileRows, logitRows, capacity } = scratchRows(shape);
    this.rows = rows;
    this.tileRows = tileRows;
    this.logitRows = logitRows;
    const { D, nsrc, wide, small } = scratchShape(cfg);
    const m = cfg.mla;
    const { latent, topK } = cfg.moe;
    const H = Math.max(m.numHeads, 1);
    this.src = new Vec(k, rows * nsrc * D, "attnres sources");
    this.z = new Vec(k, rows * latent);
    this.expertOut = new Vec(k, rows * topK * latent);
    this.expertAt = new Int32Array(rows * topK);
    this.routeIds = new Int32Array(rows * topK);
    this.routeWts = new Float32Array(rows * topK);
    const xRows = Math.max(tileRows, logitRows);
    this.x = new Vec(k, xRows * D);
    this.xn = new Vec(k, xRows * D);
    this.a = new Vec(k, tileRows * D);
    this.wide = wideRoles(Array.from({ length: 5 }, () => new Vec(k, tileRows * wide)));
    this.small = new Vec(k, tileRows * small);
    this.expertRows = expertTileRows(cfg, tileRows);
    this.qlat = new Vec(k, H * (m.kvLoraRank + m.ropeDim));
    this.olat = new Vec(k, H * m.kvLoraRank);
    this.scores = new Vec(k, H * capacity);
    this.ids = new Int32Array(topK);
    this.idsPtr = Deno.UnsafePointer.of(this.ids)!;
    this.wts = new Float32Array(topK);
    this.wtsPtr = Deno.UnsafePointer.of(this.wts)!;
    this.logits = new Vec(k, logitRows * cfg.vocabSize, "logits");
  }
}
