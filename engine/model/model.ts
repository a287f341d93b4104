/**
 * Kimi K3's forward pass: one file for the architecture, reading like the math in
 * docs/math.md (sections 3 to 9).
 *
 * The pass runs T tokens at once (T = 1 when decoding, a segment of the prompt when
 * prefilling: the whole prompt when the memory holds it, docs/prefill.md), layer by layer:
 * every projection is one matrix times T vectors, so each weight is read once per pass,
 * while the recurrences (KDA state, conv history, MLA cache) advance token by token. The
 * residual stream of all T rows stays in the scratch between layers; the wide temporaries
 * run in row tiles (scratch.ts). A row's dot product has the same bits whatever T and the
 * tile are, so neither segments nor tiles ever change a token.
 *
 * Weights come from a `WeightSource` (all resident, or streamed and cached: see
 * ../weights/streamed.ts and ../weights/expert_cache.ts), each layer's dense weights as one
 * typed record (layer_weights.ts); the sequence's recurrent state lives in `SequenceState`
 * (state.ts), the scratch and its liveness table in scratch.ts.
 *
 * @module
 */

import type { K3Config } from "./config.ts";
import type { Kernels } from "../native/ffi.ts";
import type { Vec } from "../native/memory.ts";
import { type Compute, HEAD_OP, serialCompute } from "../native/pool.ts";
import { type Expert, type Matrix, settleExpert, verifyMatrix } from "../native/tensors.ts";
import type { GluWeights, KdaWeights, LayerWeights, MlaWeights, MoeWeights } from "./layer_weights.ts";
import { type Ledger, newLedger } from "./ledger.ts";
import { Scratch } from "./scratch.ts";
import { SequenceState, SPEC_RECORD_ROWS, SpeculationRecord } from "./state.ts";
import type { WeightSource } from "./weight_source.ts";
import { ExpertStream, readAheadPays } from "./expert_stream.ts";

/** The pool's split threshold counts weight elements of a product (SPLIT_MIN_ELEMS); one
 * SiTU element costs about what a product's 64 weight elements do, so a split pays from a
 * few thousand elements (an expert's tile of rows, not one decode row's). */
const SITU_WORK = 64;

/** One sequence's part of a forward pass: its state and its next tokens. */
export interface Segment {
  /** The sequence's state (advanced by the pass). */
  state: SequenceState;
  /** Its next token ids. */
  ids: number[];
  /** Which rows' logits the pass returns: the last token's, every token's, or none. */
  logits: "last" | "all" | "none";
  /** A draft being verified: the pass records what it takes to cut the state back to any
   * prefix of these tokens afterwards (K3Model.keepPrefix). */
  speculative?: boolean;
}

/** Where a segment's tokens sit among the pass's rows. */
interface RowSpan {
  seg: Segment;
  r0: number;
  n: number;
}

/** A span's rows inside a tile: absolute rows [from, to). */
interface TileSpan {
  sp: RowSpan;
  from: number;
  to: number;
}

/** Tiles [t0, t1) of at most `tile` rows over R rows, in ascending order (the recurrences
 * carry from one tile to the next). */
export function rowTiles(R: number, tile: number): [number, number][] {
  const tiles: [number, number][] = [];
  for (let t0 = 0; t0 < R; t0 += tile) tiles.push([t0, Math.min(R, t0 + tile)]);
  return tiles;
}

/** Each span's rows inside the tile [t0, t1), in row order. */
function tileSpans(spans: RowSpan[], t0: number, t1: number): TileSpan[] {
  return spans
    .map((sp) => ({ sp, from: Math.max(t0, sp.r0), to: Math.min(t1, sp.r0 + sp.n) }))
    .filter((ts) => ts.from < ts.to);
}

function rowSpans(segments: Segment[]): RowSpan[] {
  let r = 0;
  return segments.map((seg) => {
    if (seg.ids.length < 1) throw new Error("forward: a segment without tokens");
    const sp = { seg, r0: r, n: seg.ids.length };
    r += sp.n;
    return sp;
  });
}

/** Counters the run report reads. */
export interface ForwardStats {
  /** Routed experts run so far. */
  expertsUsed: number;
  /** Wall seconds spent in each layer (waits for weights included). */
  layerSeconds: Float64Array;
}

/** What a pass reports at the end of each layer (progress of a long prefill). */
export interface LayerProgress {
  /** The layer just finished (0-based). */
  layer: number;
  /** Layers in the model. */
  layers: number;
  /** Rows of the pass. */
  rows: number;
  /** Seconds since the pass started. */
  seconds: number;
}

/** The model: config, kernels, weights and scratch. */
export class K3Model {
  private readonly s: Scratch;
  /** Sources per token in the AttnRes buffer: snapshots plus the running partial. */
  private readonly nsrc: number;
  private readonly compute: Compute;
  /** Whether the next layer's experts are read ahead on a guess (guessNextExperts). */
  private readonly readAheadOn: boolean;
  /** Counters the run report reads. */
  readonly stats: ForwardStats;
  /** Seconds by kind of work, over every pass so far. */
  readonly ledger: Ledger = newLedger();
  /** Called at the end of each layer of every pass (prefill progress); unset: nothing. */
  onLayer?: (p: LayerProgress) => void;

  /** The forward pass over `weights` with the kernels `k` (see openModel); `opts.readAhead`
   * (default true) reads the next layer's experts ahead on a guess; `opts.tileRows`
   * (default min(maxT, 64)) rows of wide temporaries run at once; `opts.logitRows` (default
   * maxT) rows of logits a pass can return. */
  constructor(
    readonly k: Kernels,
    readonly cfg: K3Config,
    readonly weights: WeightSource,
    readonly maxT: number,
    readonly capacity: number,
    compute?: Compute,
    opts: { readAhead?: boolean; tileRows?: number; logitRows?: number } = {},
  ) {
    this.readAheadOn = opts.readAhead ?? true;
    this.s = new Scratch(k, cfg, { rows: maxT, tileRows: opts.tileRows, logitRows: opts.logitRows, capacity });
    this.stats = { expertsUsed: 0, layerSeconds: new Float64Array(cfg.numLayers) };
    this.nsrc = Math.floor((cfg.numLayers - 1) / cfg.attnResBlock) + 2;
    this.compute = compute ?? serialCompute(k);
  }

  /** Rows of logits one pass can return. */
  get logitRows(): number {
    return this.s.logitRows;
  }

  /** Rows of a tile of wide temporaries. */
  get tileRows(): number {
    return this.s.tileRows;
  }

  /** A fresh sequence state able to hold `capacity` positions. */
  newState(): SequenceState {
    return new SequenceState(this.k, this.cfg, this.capacity);
  }

  /**
   * After a pass that ran `seg.speculative` for `state`: keeps only its first `keep` tokens
   * (the pending one and the accepted drafts), as if the pass had run those alone. Replays
   * the KDA recurrence from the recorded inputs (no weight is read); the MLA cache is cut by
   * the position.
   */
  keepPrefix(state: SequenceState, keep: number): void {
    state.spec!.keepPrefix(this.k, state, keep);
  }

  /**
   * Runs tokens `ids` (at most maxT; with `allLogits`, at most logitRows) at positions
   * state.pos.., advancing the state.
   * Returns logits of the last token, or of every token when `allLogits`, as a view
   * [T][vocab] into scratch (valid until the next call). The one-segment case of `pass`.
   */
  async forward(state: SequenceState, ids: number[], allLogits = false): Promise<Float32Array> {
    const [logits] = await this.pass([{ state, ids, logits: allLogits ? "all" : "last" }]);
    return logits;
  }

  /**
   * One forward pass over several segments, each a sequence's state plus its next tokens
   * (a prefill chunk or one decode token). Rows are the segments' tokens back to back:
   * every projection runs once over all rows, the recurrences (KDA, conv history, MLA
   * cache) advance per segment against its own state, routing is per row, and the experts
   * any row chose are fetched once. Each row's arithmetic is the same whatever else is in
   * the pass, so a sequence's logits have the same bits as when it runs alone.
   *
   * Returns, per segment, its wanted logits ([rows][vocab], or empty) as views into
   * scratch, valid until the next call. Each segment's state advances by its token count.
   */
  async pass(segments: Segment[]): Promise<Float32Array[]> {
    const { k, cfg, s } = this;
    const D = cfg.hiddenSize;
    const spans = rowSpans(segments);
    const R = spans.reduce((n, sp) => n + sp.n, 0);
    if (R < 1 || R > this.maxT) throw new Error(`forward: ${R} rows, pass limit ${this.maxT}`);
    const seen = new Set<SequenceState>();
    for (const { state, ids } of segments) {
      if (seen.has(state)) throw new Error("forward: one sequence appears twice in a pass");
      seen.add(state);
      if (state.pos + ids.length > state.capacity) {
        throw new Error(`forward: position ${state.pos + ids.length} beyond capacity ${state.capacity}`);
      }
    }
    for (const { state, ids, speculative } of segments) {
      if (!speculative) continue;
      if (!state.spec || state.spec.maxRows < ids.length) {
        state.spec?.free();
        // Room for the usual draft (8 tokens and the pending one), or for this one.
        state.spec = new SpeculationRecord(k, cfg, Math.min(this.maxT, Math.max(ids.length, SPEC_RECORD_ROWS)));
      }
      state.spec.pos0 = state.pos;
      state.spec.rows = ids.length;
    }

    // Per row, the AttnRes sources are stored back to back: [snapshots..., partial].
    // Before layer 0 the partial is the embedding and there are no snapshots.
    const srcRow = (t: number, i: number) => s.src.at((t * this.nsrc + i) * D);
    // In id order: a streamed embedding then reads each of its pieces once a pass, not once a row.
    const embedOrder = spans.flatMap((sp) => sp.seg.ids.slice(0, sp.n).map((id, j) => ({ id, row: sp.r0 + j })));
    embedOrder.sort((a, b) => a.id - b.id || a.row - b.row);
    for (const { id, row } of embedOrder) await this.weights.embed(id, srcRow(row, 0));
    let nblocks = 0;
    let partialEmpty = false;
    const tiles = rowTiles(R, s.tileRows);
    const passStart = performance.now();

    for (let L = 0; L < cfg.numLayers; L++) {
      const layerStart = performance.now();
      const tRead = performance.now();
      const w = await this.weights.layer(L);
      this.spent("trunkReadWait", tRead);
      // The sources attention reads: the snapshots so far and the partial.
      const attnSources = nblocks;
      // At a block boundary the partial becomes a snapshot.
      if (L % cfg.attnResBlock === 0) {
        nblocks++;
        partialEmpty = true;
      }
      for (const [t0, t1] of tiles) {
        // 1. x = AttnRes(blocks + [partial]) when there are snapshots, else the partial.
        this.attnInput(w, t0, t1, attnSources);
        // 3. Attention on the normed input.
        if (w.attention.kind === "kda") this.kda(L, w.attention, spans, t0, t1);
        else this.mla(L, w.attention, spans, t0, t1);
        // 4. partial = a, or partial + a.
        this.addPartial(t0, t1, nblocks, partialEmpty);
      }
      this.weights.doneWithAttention?.(L);
      partialEmpty = false;
      // 5. y = AttnRes(blocks + [partial]); 6. MLP of the normed y; 7. partial += m.
      if (w.mlp.kind === "dense") {
        for (const [t0, t1] of tiles) {
          this.mlpInput(w, t0, t1, nblocks);
          this.glu(w.mlp, s.xn.ptr, s.a.ptr, t1 - t0);
          this.addPartial(t0, t1, nblocks, false);
        }
      } else await this.moe(L, w, w.mlp, tiles, nblocks);
      this.weights.doneWithLayer?.(L);
      // The next layer's experts start reading now, behind its attention.
      this.guessNextExperts(L, tiles, nblocks);
      this.stats.layerSeconds[L] += (performance.now() - layerStart) / 1000;
      this.onLayer?.({ layer: L, layers: cfg.numLayers, rows: R, seconds: (performance.now() - passStart) / 1000 });
    }

    // Final aggregation, norm and head, for the rows whose logits are wanted.
    const out: number[] = [];
    for (const sp of spans) {
      const from = sp.seg.logits === "all" ? 0 : sp.seg.logits === "last" ? sp.n - 1 : sp.n;
      for (let j = from; j < sp.n; j++) out.push(sp.r0 + j);
    }
    if (out.length > s.logitRows) {
      throw new Error(`internal: a pass wants ${out.length} rows of logits, the scratch holds ${s.logitRows}`);
    }
    out.forEach((t, i) =>
      k.k3_attnres(
        srcRow(t, 0),
        nblocks + 1,
        D,
        this.weights.outputResNorm.ptr,
        this.weights.outputResProj.ptr,
        cfg.rmsNormEps,
        s.x.at(i * D),
      )
    );
    const V = cfg.vocabSize;
    if (out.length > 0) {
      k.k3_rmsnorm(s.x.ptr, this.weights.finalNorm.ptr, s.xn.ptr, D, out.length, cfg.rmsNormEps);
      const tHead = performance.now();
      await this.weights.head(s.xn.ptr, s.logits.ptr, out.length, this.compute);
      this.spent("head", tHead);
    }
    let o = 0;
    return spans.map((sp) => {
      sp.seg.state.pos += sp.n;
      const n = sp.seg.logits === "all" ? sp.n : sp.seg.logits === "last" ? 1 : 0;
      o += n;
      return s.logits.f.subarray((o - n) * V, o * V);
    });
  }

  /** Row t's AttnRes source i (pointer). */
  private srcRow(t: number, i: number): NonNullable<Deno.PointerValue> {
    return this.s.src.at((t * this.nsrc + i) * this.cfg.hiddenSize);
  }

  /** Layer w's attention input for rows [t0, t1): s.x = its AttnRes over `nblocks`
   * snapshots and the partial (the partial alone before the first snapshot), s.xn = that
   * normed. Tile rows are indexed from t0. */
  private attnInput(w: LayerWeights, t0: number, t1: number, nblocks: number): void {
    this.resInput(w.attnRes, w.inputNorm, t0, t1, nblocks, true);
  }

  /** s.x for rows [t0, t1) = the AttnRes `res` over the sources (`nblocks` snapshots and
   * the partial; with `partialAlone`, the partial itself when there is no snapshot yet),
   * s.xn = s.x under `norm`. Tile rows are indexed from t0. */
  private resInput(
    res: LayerWeights["attnRes"],
    norm: LayerWeights["inputNorm"],
    t0: number,
    t1: number,
    nblocks: number,
    partialAlone: boolean,
  ): void {
    const { k, cfg, s } = this;
    const D = cfg.hiddenSize;
    for (let t = t0; t < t1; t++) {
      if (partialAlone && nblocks === 0) {
        s.x.f.set(s.src.f.subarray(t * this.nsrc * D, t * this.nsrc * D + D), (t - t0) * D);
      } else {
        k.k3_attnres(
          this.srcRow(t, 0),
          nblocks + 1,
          D,
          res.norm.ptr,
          res.proj.ptr,
          cfg.rmsNormEps,
          s.x.at((t - t0) * D),
        );
      }
    }
    k.k3_rmsnorm(s.x.ptr, norm.ptr, s.xn.ptr, D, t1 - t0, cfg.rmsNormEps);
  }

  /** Rows [t0, t1)'s partial (source `nblocks`) = the tile's s.a, or += it. */
  private addPartial(t0: number, t1: number, nblocks: number, replace: boolean): void {
    const { k, s } = this;
    const D = this.cfg.hiddenSize;
    for (let t = t0; t < t1; t++) {
      if (replace) s.src.f.set(s.a.f.subarray((t - t0) * D, (t - t0 + 1) * D), (t * this.nsrc + nblocks) * D);
      else k.k3_add(this.srcRow(t, nblocks), s.a.at((t - t0) * D), D);
    }
  }

  /** Kimi Delta Attention on the tile [t0, t1): projections over its rows, the recurrence
   * row by row per segment (carried from the tile before), into s.a. */
  private kda(L: number, w: KdaWeights, spans: RowSpan[], t0: number, t1: number): void {
    const { k, cfg, s } = this;
    const { numHeads: H, headDim: d, gateLowerBound } = cfg.kda;
    const C = H * d;
    const R = t1 - t0;
    const { q, k: kk, v, f, o, g } = s.wide.kda;
    this.mm(w.q, s.xn.ptr, q.ptr, R);
    this.mm(w.k, s.xn.ptr, kk.ptr, R);
    this.mm(w.v, s.xn.ptr, v.ptr, R);
    // f = f_b(f_a x): the low-rank decay input, through `small`.
    this.mm(w.fA, s.xn.ptr, s.small.ptr, R);
    this.mm(w.fB, s.small.ptr, f.ptr, R);
    // beta = sigmoid(b_proj x), one per head and row.
    const beta = s.small;
    this.mm(w.beta, s.xn.ptr, beta.ptr, R);
    k.k3_sigmoid(beta.ptr, beta.ptr, R * H);
    const tAttn = performance.now();
    for (const { sp, from, to } of tileSpans(spans, t0, t1)) {
      const st = sp.seg.state.kda.get(L)!;
      // A draft being verified: the state before it (at its first row), and below each
      // row's inputs.
      const rec = sp.seg.speculative ? sp.seg.state.spec!.kda.get(L)! : undefined;
      if (rec && from === sp.r0) {
        rec.S.f.set(st.S.f);
        rec.convQ.f.set(st.convQ.f);
        rec.convK.f.set(st.convK.f);
        rec.convV.f.set(st.convV.f);
      }
      const keep = (from: Vec, t: number, to: Vec, j: number, n = C) =>
        to.f.set(from.f.subarray(t * n, (t + 1) * n), j * n);
      // The rows in runs that end where a state is kept (the state cache's message
      // boundaries): that layer's part, its conv histories and S, is copied there.
      const end = (r: number) => sp.seg.state.pos + (r - sp.r0);
      for (let r0 = from; r0 < to;) {
        let r1 = r0 + 1;
        while (r1 < to && !sp.seg.state.keepsAt(end(r1))) r1++;
        for (let r = r0; r < r1; r++) {
          // t: the row in the tile's buffers; j: the row in the segment.
          const t = r - t0, j = r - sp.r0;
          const at = (b: Vec) => b.at(t * C);
          if (rec) {
            keep(q, t, rec.rawQ, j);
            keep(kk, t, rec.rawK, j);
            keep(v, t, rec.rawV, j);
          }
          // Causal short conv + SiLU (in place), then L2 norm of q and k per head.
          k.k3_short_conv(st.convQ.ptr, w.qConv.ptr, at(q), at(q), C);
          k.k3_short_conv(st.convK.ptr, w.kConv.ptr, at(kk), at(kk), C);
          k.k3_short_conv(st.convV.ptr, w.vConv.ptr, at(v), at(v), C);
          k.k3_l2norm(at(q), d, H, 1e-6);
          k.k3_l2norm(at(kk), d, H, 1e-6);
          // The decay alpha overwrites f.
          k.k3_kda_decay(at(f), w.aLog.ptr, w.dtBias.ptr, at(f), H, d, gateLowerBound);
          if (rec) {
            keep(q, t, rec.q, j);
            keep(kk, t, rec.k, j);
            keep(v, t, rec.v, j);
            keep(f, t, rec.alpha, j);
            keep(beta, t, rec.beta, j, H);
          }
        }
        // The delta rule over the run's rows in order (each head's state stays in the cache
        // while they pass), its heads split across the threads; o from the updated state.
        const t = r0 - t0, n = r1 - r0;
        this.compute.heads(
          {
            op: HEAD_OP.kda,
            ptrs: [st.S.ptr, q.at(t * C), kk.at(t * C), v.at(t * C), beta.at(t * H), f.at(t * C), o.at(t * C)],
            ints: [d, H, n],
            scale: 0,
          },
          H,
          4 * H * d * d * n,
        );
        sp.seg.state.keptKda(L, end(r1));
        r0 = r1;
      }
    }
    this.spent("attention", tAttn);
    // Per-head RMSNorm of o, then the output gate (norm first, then gate), then o_proj.
    k.k3_rmsnorm(o.ptr, w.oNorm.ptr, o.ptr, d, R * H, cfg.rmsNormEps);
    this.mm(w.gate, s.xn.ptr, g.ptr, R);
    k.k3_sigmoid_mul(o.ptr, g.ptr, R * C);
    this.mm(w.o, o.ptr, s.a.ptr, R);
  }

  /**
   * Gated MLA (NoPE) in the latent (absorbed) form: the cache holds each position's normed
   * kv latent and raw k_rope; each head's q_nope is carried into latent space by its key
   * up-projection, attention runs over the shared latents, and each head's value
   * up-projection is applied to the attended latent. Same math as expanding keys and
   * values per position, with a 576-float cache row instead of 96 x 256 + 64. Each row
   * attends over its own segment's cache. On the tile [t0, t1), into s.a.
   */
  private mla(L: number, w: MlaWeights, spans: RowSpan[], t0: number, t1: number): void {
    const { k, cfg, s } = this;
    const m = cfg.mla;
    const H = m.numHeads, dc = m.kvLoraRank, dr = m.ropeDim;
    const dq = m.nopeDim + dr;
    const R = t1 - t0;
    const { qa, q, c, o, g } = s.wide.mla;
    // q = q_b(RMSNorm(q_a x)).
    this.mm(w.qA, s.xn.ptr, qa.ptr, R);
    k.k3_rmsnorm(qa.ptr, w.qANorm.ptr, qa.ptr, m.qLoraRank, R, cfg.rmsNormEps);
    this.mm(w.qB, qa.ptr, q.ptr, R);
    // c = kv_a x: the latent (normed, then cached) and the shared raw key part.
    const cw = dc + dr;
    this.mm(w.kvA, s.xn.ptr, c.ptr, R);
    const kvb = w.kvB;
    verifyMatrix(k, kvb); // read by absorb and expand, not by a product that checks it
    // q_a's output is consumed: o [R][H][vDim] takes its place.
    const tAttn = performance.now();
    // A tile of query rows attends in one call that reads the cache once: its latent
    // queries and attended latents in the free wide buffers (or the one-row buffers when
    // those hold less than a row), its scores in s.scores ([H][capacity] floats: n rows at
    // position p0 need n x (p0 + n) per head, so a long prompt's later tiles have fewer
    // rows). Each row's bits are those of attending alone.
    const qlatRow = H * cw, olatRow = H * dc;
    const wideRows = Math.min(
      Math.floor(s.wide.mla.qlat.length / qlatRow),
      Math.floor(s.wide.mla.olat.length / olatRow),
    );
    const qlat = wideRows >= 1 ? s.wide.mla.qlat : s.qlat, olat = wideRows >= 1 ? s.wide.mla.olat : s.olat;
    const scorePositions = s.scores.length / H;
    for (const { sp, from, to } of tileSpans(spans, t0, t1)) {
      const cache = sp.seg.state.mla.get(L)!;
      const pos = (r: number) => sp.seg.state.pos + (r - sp.r0);
      // The tile's cache rows first: a row attends over its own and the earlier ones only.
      for (let r = from; r < to; r++) {
        const t = r - t0, p = pos(r);
        k.k3_rmsnorm(c.at(t * cw), w.kvANorm.ptr, cache.latent.at(p * dc), dc, 1, cfg.rmsNormEps);
        cache.krope.f.set(c.f.subarray(t * cw + dc, (t + 1) * cw), p * dr);
      }
      // Absorb a wide buffer's rows in one call (each weight block widened once for them
      // all), attend in tiles whose scores fit, expand row by row; heads split across the
      // threads in each.
      const rowsAtOnce = Math.max(1, wideRows);
      for (let a0 = from; a0 < to; a0 += rowsAtOnce) {
        const a1 = Math.min(to, a0 + rowsAtOnce);
        this.compute.heads(
          {
            op: HEAD_OP.absorb,
            ptrs: [kvb.ptr, q.at((a0 - t0) * H * dq), qlat.ptr],
            ints: [kvb.wtype, a1 - a0, H, m.nopeDim, dr, m.vDim, dc],
            scale: 0,
          },
          H,
          (a1 - a0) * H * m.nopeDim * dc,
        );
        for (let r0 = a0; r0 < a1;) {
          const p0 = pos(r0);
          let n = a1 - r0;
          while (n > 1 && n * (p0 + n) > scorePositions) n--;
          this.compute.heads(
            {
              op: HEAD_OP.attend,
              ptrs: [
                qlat.at((r0 - a0) * qlatRow),
                cache.latent.ptr,
                cache.krope.ptr,
                cache.latent.ptr,
                olat.at((r0 - a0) * olatRow),
                s.scores.ptr,
              ],
              ints: [p0 + 1, n, H, 1, dc, dr, dc],
              scale: 1 / Math.sqrt(dq),
            },
            H,
            H * n * (p0 + n) * (dc + dr),
          );
          r0 += n;
        }
        for (let r = a0; r < a1; r++) {
          this.compute.heads(
            {
              op: HEAD_OP.expand,
              ptrs: [kvb.ptr, olat.at((r - a0) * olatRow), o.at((r - t0) * H * m.vDim)],
              ints: [kvb.wtype, H, m.nopeDim, m.vDim, dc],
              scale: 0,
            },
            H,
            H * m.vDim * dc,
          );
        }
      }
    }
    const mlaSeconds = (performance.now() - tAttn) / 1000;
    this.ledger.attention += mlaSeconds;
    this.ledger.mlaAttention += mlaSeconds;
    // Output gate, then o_proj.
    this.mm(w.gate, s.xn.ptr, g.ptr, R);
    k.k3_sigmoid_mul(o.ptr, g.ptr, R * H * m.vDim);
    this.mm(w.o, o.ptr, s.a.ptr, R);
  }

  /** One routed expert on the rows that chose it, a tile of them at a time (the wide
   * buffers' rows at the expert's widths, Scratch.expertRows); its outputs are written
   * straight into Scratch.expertOut from row `filled` on, each (row, router slot) noting
   * where in expertAt. Returns the rows of expertOut filled after it. */
  private runExpert(ex: Expert, users: { t: number; slot: number }[], filled: number): number {
    const { cfg, s } = this;
    const { latent, topK, intermediate: I } = cfg.moe;
    const { gate, up, in: xin } = s.wide.glu;
    // An expert fresh from the shards is verified by its first run: its products add up
    // its tensor checks (over the weights, whatever the rows), compared with the expert
    // table before any output is used.
    const c = ex.check && !ex.check.verified ? ex.check : undefined;
    c?.words.fill(0n);
    for (let u0 = 0; u0 < users.length; u0 += s.expertRows) {
      const run = users.slice(u0, u0 + s.expertRows);
      const nt = run.length;
      run.forEach(({ t }, j) => xin.f.set(s.z.f.subarray(t * latent, (t + 1) * latent), j * latent));
      const words = u0 === 0 ? c?.words : undefined;
      this.compute.mxfp4(ex.w1, xin.ptr, gate.ptr, nt, words?.subarray(0, 2));
      this.compute.mxfp4(ex.w3, xin.ptr, up.ptr, nt, words?.subarray(2, 4));
      this.situ(gate.ptr, up.ptr, nt * I);
      this.compute.mxfp4(ex.w2, gate.ptr, s.expertOut.at(filled * latent), nt, words?.subarray(4, 6));
      if (c && u0 === 0) settleExpert(c);
      run.forEach(({ t, slot }, j) => (s.expertAt[t * topK + slot] = filled + j));
      filled += nt;
    }
    return filled;
  }

  /** gate = SiTU(gate, up) over n elements, split across the threads (two tanh and a sigmoid
   * an element, about 5 ns: the widest part of a pass that is not a product). */
  private situ(gate: NonNullable<Deno.PointerValue>, up: NonNullable<Deno.PointerValue>, n: number): void {
    const { cfg } = this;
    const call = {
      op: HEAD_OP.situ,
      ptrs: [gate, up, gate],
      ints: [],
      scale: cfg.situBeta,
      scale2: cfg.situLinearBeta,
    };
    this.compute.heads(call, n, SITU_WORK * n);
  }

  /** y = W x for R rows, timed as dense work. */
  private mm(m: Matrix, x: NonNullable<Deno.PointerValue>, y: NonNullable<Deno.PointerValue>, R: number): void {
    const t0 = performance.now();
    this.compute.matmul(m, x, y, R);
    this.ledger.denseMatmul += (performance.now() - t0) / 1000;
  }

  /** Seconds since `t0` (performance.now()), added to the ledger's `key`. */
  private spent(key: keyof Ledger, t0: number): void {
    this.ledger[key] += (performance.now() - t0) / 1000;
  }

  /** SiTU-GLU MLP over T rows: out = down(SiTU(gate x, up x)) (a dense MLP, or the shared experts). */
  private glu(w: GluWeights, x: NonNullable<Deno.PointerValue>, out: NonNullable<Deno.PointerValue>, T: number): void {
    const { s } = this;
    const { gate, up } = s.wide.glu;
    this.mm(w.gate, x, gate.ptr, T);
    this.mm(w.up, x, up.ptr, T);
    this.situ(gate.ptr, up.ptr, T * w.gate.rows);
    this.mm(w.down, gate.ptr, out, T);
  }

  /** Rows [t0, t0 + n)'s top-k experts and weights by layer `w`'s router on the tile's
   * normed rows in s.xn, into s.routeIds and s.routeWts. */
  private route(w: MoeWeights, t0: number, n: number): void {
    const { k, cfg, s } = this;
    const { numExperts, topK } = cfg.moe;
    const logits = s.wide.moe.routerLogits;
    this.mm(w.router, s.xn.ptr, logits.ptr, n);
    for (let i = 0; i < n; i++) {
      k.k3_router_topk(
        logits.at(i * numExperts),
        w.routerBias.ptr,
        numExperts,
        topK,
        cfg.moe.routedScaling,
        s.idsPtr,
        s.wtsPtr,
      );
      s.routeIds.set(s.ids, (t0 + i) * topK);
      s.routeWts.set(s.wts, (t0 + i) * topK);
    }
  }

  /** Layer w's MLP input for rows [t0, t1): s.x = its MLP AttnRes over the sources
   * (nblocks snapshots and the partial), s.xn = that normed. Tile rows are indexed from t0. */
  private mlpInput(w: LayerWeights, t0: number, t1: number, nblocks: number): void {
    this.resInput(w.mlpRes, w.postAttentionNorm, t0, t1, nblocks, false);
  }

  /** The experts rows [0, R) chose (s.routeIds), ascending. */
  private routedUnion(R: number): number[] {
    return [...new Set(this.s.routeIds.subarray(0, R * this.cfg.moe.topK))].sort((a, b) => a - b);
  }

  /**
   * Reads layer L+1's likely experts ahead, at the end of layer L, so that they land while
   * layer L+1's attention runs instead of after its routing. The guess is layer L+1's router
   * on the input its MLP would get if attention added nothing: its MLP AttnRes over the
   * sources as they stand, normed with its MLP norm (s.x, s.xn, the router logits and the
   * routing are free between layers). On the real-width slice 9 guesses in 10 were right
   * (the earlier guess, from layer L's own MLP input at its routing, 2 in 3). Only when
   * layer L+1 is an MoE layer in memory for good (a streamed layer is not waited for) and
   * the source reads experts, and while it pays (readAheadPays: most guesses right, and the
   * cache alone not serving 95%). A wrong guess costs a read, never a bit: the pass runs
   * what the real routing chose.
   */
  private guessNextExperts(L: number, tiles: [number, number][], nblocks: number): void {
    const { cfg } = this;
    const next = L + 1;
    if (!this.readAheadOn || next >= cfg.numLayers || !this.weights.prefetchExperts) return;
    const io = this.weights.ioStats?.();
    if (io && !readAheadPays(io, cfg.moe.topK)) return;
    const w = this.weights.heldLayer?.(next);
    if (!w || w.mlp.kind !== "moe") return;
    for (const [t0, t1] of tiles) {
      this.mlpInput(w, t0, t1, nblocks);
      this.route(w.mlp, t0, t1 - t0);
    }
    this.weights.prefetchExperts(next, this.routedUnion(tiles[tiles.length - 1][1]));
  }

  /**
   * Stable LatentMoE for the pass's rows, then partial += its output. The experts chosen by
   * any row are fetched once (the union), their reads issued the moment the routing is
   * known; each expert runs on the rows that chose it as soon as it lands
   * (expert_stream.ts), in ascending row order; each row then sums its own experts in its
   * router's order, so neither the order they land in nor the tiles change a bit. In three
   * phases: routing and the latent input by tile; the experts; the sums, the up-projection
   * and the shared experts by tile. A pass of one tile (decode, small chunks) runs the
   * shared experts while the reads are in flight; a pass of more recomputes each tile's MLP
   * input for them afterwards (the same inputs, so the same bits).
   */
  private async moe(
    L: number,
    lw: LayerWeights,
    w: MoeWeights,
    tiles: [number, number][],
    nblocks: number,
  ): Promise<void> {
    const { k, cfg, s } = this;
    const { latent, topK } = cfg.moe;
    const D = cfg.hiddenSize;
    const { acc } = s.wide.moe;
    const R = tiles[tiles.length - 1][1];
    const oneTile = tiles.length === 1;
    // A. Route each row (and, over several tiles, its latent input z).
    for (const [t0, t1] of tiles) {
      this.mlpInput(lw, t0, t1, nblocks);
      this.route(w, t0, t1 - t0);
      if (!oneTile) this.mm(w.latentDown, s.xn.ptr, s.z.at(t0 * latent), t1 - t0);
    }
    // B. Claim the experts any row chose and start their reads; run each as it lands.
    const users = new Map<number, { t: number; slot: number }[]>();
    for (let t = 0; t < R; t++) {
      for (let slot = 0; slot < topK; slot++) {
        const e = s.routeIds[t * topK + slot];
        const list = users.get(e) ?? [];
        list.push({ t, slot });
        users.set(e, list);
      }
    }
    const union = [...users.keys()].sort((a, b) => a - b);
    this.stats.expertsUsed += union.length;
    const stream = new ExpertStream(this.weights, L, union);
    // One tile: z = routed_expert_down_proj x and the shared experts at full width (into
    // s.x), both while the reads are in flight.
    if (oneTile) {
      this.mm(w.latentDown, s.xn.ptr, s.z.ptr, R);
      if (w.shared) this.glu(w.shared, s.xn.ptr, s.x.ptr, R);
    }
    let filled = 0;
    await stream.run(
      (E, ex) => {
        const tExpert = performance.now();
        filled = this.runExpert(ex, users.get(E)!, filled);
        this.spent("expertCompute", tExpert);
      },
      (t0) => this.spent("expertReadWait", t0),
    );
    this.weights.doneWithExperts?.(L);
    // C. acc = sum_j w_j e_j in router order; RMSNorm; up-projection; the shared experts
    // added with no weight. The router's logits are consumed: acc takes their place.
    for (const [t0, t1] of tiles) {
      const n = t1 - t0;
      for (let i = 0; i < n; i++) {
        const t = t0 + i;
        acc.f.subarray(i * latent, (i + 1) * latent).fill(0);
        for (let j = 0; j < topK; j++) {
          k.k3_axpy(
            acc.at(i * latent),
            s.routeWts[t * topK + j],
            s.expertOut.at(s.expertAt[t * topK + j] * latent),
            latent,
          );
        }
      }
      k.k3_rmsnorm(acc.ptr, w.latentNorm.ptr, acc.ptr, latent, n, cfg.rmsNormEps);
      this.mm(w.latentUp, acc.ptr, s.a.ptr, n);
      if (w.shared) {
        if (!oneTile) {
          this.mlpInput(lw, t0, t1, nblocks);
          this.glu(w.shared, s.xn.ptr, s.x.ptr, n);
        }
        k.k3_add(s.a.ptr, s.x.ptr, n * D);
      }
      this.addPartial(t0, t1, nblocks, false);
    }
  }
}
