/**
 * Kimi K3's forward pass: one file for the architecture, reading like the math in
 * docs/math.md (sections 3 to 9).
 *
 * The pass runs T tokens at once (T = 1 when decoding, a chunk when prefilling): every
 * projection is one matrix times T vectors, so each weight is read once per chunk, while
 * the recurrences (KDA state, conv history, MLA cache) advance token by token. A row's dot
 * product has the same bits whatever T is, so chunking never changes a token.
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
import { type Compute, serialCompute } from "../native/pool.ts";
import { type Expert, type Matrix, settleExpert, verifyMatrix } from "../native/tensors.ts";
import type { GluWeights, KdaWeights, LayerWeights, MlaWeights, MoeWeights } from "./layer_weights.ts";
import { type Ledger, newLedger } from "./ledger.ts";
import { Scratch } from "./scratch.ts";
import { SequenceState, SPEC_RECORD_ROWS, SpeculationRecord } from "./state.ts";
import type { WeightSource } from "./weight_source.ts";
import { ExpertStream, readAheadPays } from "./expert_stream.ts";

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

  /** The forward pass over `weights` with the kernels `k` (see openModel); `opts.readAhead`
   * (default true) reads the next layer's experts ahead on a guess. */
  constructor(
    readonly k: Kernels,
    readonly cfg: K3Config,
    readonly weights: WeightSource,
    readonly maxT: number,
    readonly capacity: number,
    compute?: Compute,
    opts: { readAhead?: boolean } = {},
  ) {
    this.readAheadOn = opts.readAhead ?? true;
    this.s = new Scratch(k, cfg, maxT, capacity);
    this.stats = { expertsUsed: 0, layerSeconds: new Float64Array(cfg.numLayers) };
    this.nsrc = Math.floor((cfg.numLayers - 1) / cfg.attnResBlock) + 2;
    this.compute = compute ?? serialCompute(k);
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
   * Runs tokens `ids` (at most maxT) at positions state.pos.., advancing the state.
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
    for (const sp of spans) {
      for (let j = 0; j < sp.n; j++) await this.weights.embed(sp.seg.ids[j], srcRow(sp.r0 + j, 0));
    }
    let nblocks = 0;
    let partialEmpty = false;

    for (let L = 0; L < cfg.numLayers; L++) {
      const layerStart = performance.now();
      const tRead = performance.now();
      const w = await this.weights.layer(L);
      this.spent("trunkReadWait", tRead);
      // 1. x = AttnRes(blocks + [partial]) when there are snapshots, else the partial.
      for (let t = 0; t < R; t++) {
        if (nblocks > 0) {
          k.k3_attnres(
            srcRow(t, 0),
            nblocks + 1,
            D,
            w.attnRes.norm.ptr,
            w.attnRes.proj.ptr,
            cfg.rmsNormEps,
            s.x.at(t * D),
          );
        } else {
          s.x.f.set(s.src.f.subarray(t * this.nsrc * D, t * this.nsrc * D + D), t * D);
        }
      }
      // 2. At a block boundary the partial becomes a snapshot.
      if (L % cfg.attnResBlock === 0) {
        nblocks++;
        partialEmpty = true;
      }
      // 3. Attention on the normed input.
      k.k3_rmsnorm(s.x.ptr, w.inputNorm.ptr, s.xn.ptr, D, R, cfg.rmsNormEps);
      if (w.attention.kind === "kda") this.kda(L, w.attention, spans, R);
      else this.mla(L, w.attention, spans, R);
      this.weights.doneWithAttention?.(L);
      // 4. partial = a, or partial + a.
      for (let t = 0; t < R; t++) {
        const dst = t * this.nsrc * D + nblocks * D;
        if (partialEmpty) s.src.f.set(s.a.f.subarray(t * D, t * D + D), dst);
        else k.k3_add(srcRow(t, nblocks), s.a.at(t * D), D);
      }
      partialEmpty = false;
      // 5. y = AttnRes(blocks + [partial]); 6. MLP of the normed y.
      this.mlpInput(w, R, nblocks);
      if (w.mlp.kind === "dense") this.glu(w.mlp, s.xn.ptr, s.a.ptr, R);
      else await this.moe(L, w.mlp, R);
      this.weights.doneWithLayer?.(L);
      // 7. partial += m.
      for (let t = 0; t < R; t++) k.k3_add(srcRow(t, nblocks), s.a.at(t * D), D);
      // The next layer's experts start reading now, behind its attention.
      this.guessNextExperts(L, R, nblocks);
      this.stats.layerSeconds[L] += (performance.now() - layerStart) / 1000;
    }

    // Final aggregation, norm and head, for the rows whose logits are wanted.
    const out: number[] = [];
    for (const sp of spans) {
      const from = sp.seg.logits === "all" ? 0 : sp.seg.logits === "last" ? sp.n - 1 : sp.n;
      for (let j = from; j < sp.n; j++) out.push(sp.r0 + j);
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

  /** Kimi Delta Attention: projections over all rows, the recurrence row by row per segment. */
  private kda(L: number, w: KdaWeights, spans: RowSpan[], R: number): void {
    const { k, cfg, s } = this;
    const { numHeads: H, headDim: d, gateLowerBound } = cfg.kda;
    const C = H * d;
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
    for (const sp of spans) {
      const st = sp.seg.state.kda.get(L)!;
      // A draft being verified: the state before it, and below each row's inputs.
      const rec = sp.seg.speculative ? sp.seg.state.spec!.kda.get(L)! : undefined;
      if (rec) {
        rec.S.f.set(st.S.f);
        rec.convQ.f.set(st.convQ.f);
        rec.convK.f.set(st.convK.f);
        rec.convV.f.set(st.convV.f);
      }
      const keep = (from: Vec, t: number, to: Vec, j: number, n = C) =>
        to.f.set(from.f.subarray(t * n, (t + 1) * n), j * n);
      for (let t = sp.r0; t < sp.r0 + sp.n; t++) {
        const at = (b: Vec) => b.at(t * C);
        const j = t - sp.r0;
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
        // The decay alpha overwrites f; the delta rule reads o from the updated state.
        k.k3_kda_decay(at(f), w.aLog.ptr, w.dtBias.ptr, at(f), H, d, gateLowerBound);
        if (rec) {
          keep(q, t, rec.q, j);
          keep(kk, t, rec.k, j);
          keep(v, t, rec.v, j);
          keep(f, t, rec.alpha, j);
          keep(beta, t, rec.beta, j, H);
        }
        k.k3_kda_step(st.S.ptr, at(q), at(kk), at(v), beta.at(t * H), at(f), at(o), d, 0, H);
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
   * attends over its own segment's cache.
   */
  private mla(L: number, w: MlaWeights, spans: RowSpan[], R: number): void {
    const { k, cfg, s } = this;
    const m = cfg.mla;
    const H = m.numHeads, dc = m.kvLoraRank, dr = m.ropeDim;
    const dq = m.nopeDim + dr;
    const { qa, q, c, qlat, olat, o, g } = s.wide.mla;
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
    for (const sp of spans) {
      const cache = sp.seg.state.mla.get(L)!;
      for (let j = 0; j < sp.n; j++) {
        const t = sp.r0 + j, p = sp.seg.state.pos + j;
        k.k3_rmsnorm(
          c.at(t * cw),
          w.kvANorm.ptr,
          cache.latent.at(p * dc),
          dc,
          1,
          cfg.rmsNormEps,
        );
        cache.krope.f.set(c.f.subarray(t * cw + dc, (t + 1) * cw), p * dr);
        k.k3_mla_absorb(kvb.ptr, kvb.wtype, q.at(t * H * dq), qlat.ptr, H, m.nopeDim, dr, m.vDim, dc, 0, H);
        k.k3_mla_attend(
          qlat.ptr,
          cache.latent.ptr,
          cache.krope.ptr,
          cache.latent.ptr,
          olat.ptr,
          s.scores.ptr,
          p + 1,
          H,
          1,
          dc,
          dr,
          dc,
          1 / Math.sqrt(dq),
          0,
          H,
        );
        k.k3_mla_expand(kvb.ptr, kvb.wtype, olat.ptr, o.at(t * H * m.vDim), H, m.nopeDim, m.vDim, dc, 0, H);
      }
    }
    this.spent("attention", tAttn);
    // Output gate, then o_proj.
    this.mm(w.gate, s.xn.ptr, g.ptr, R);
    k.k3_sigmoid_mul(o.ptr, g.ptr, R * H * m.vDim);
    this.mm(w.o, o.ptr, s.a.ptr, R);
  }

  /** One routed expert on the rows that chose it; each output lands at [row][router slot]. */
  private runExpert(ex: Expert, users: { t: number; slot: number }[], z: Vec): void {
    const { k, cfg, s } = this;
    const { latent, topK, intermediate: I } = cfg.moe;
    for (let j = 0; j < users.length; j++) {
      s.expertIn.f.set(z.f.subarray(users[j].t * latent, (users[j].t + 1) * latent), j * latent);
    }
    const nt = users.length;
    // An expert fresh from the shards is verified by this run: its products add up its
    // tensor checks, compared with the expert table before its output is used.
    const c = ex.check && !ex.check.verified ? ex.check : undefined;
    c?.words.fill(0n);
    const { gate, up, out } = s.wide.glu;
    this.compute.mxfp4(ex.w1, s.expertIn.ptr, gate.ptr, nt, c?.words.subarray(0, 2));
    this.compute.mxfp4(ex.w3, s.expertIn.ptr, up.ptr, nt, c?.words.subarray(2, 4));
    k.k3_situ_glu(gate.ptr, up.ptr, gate.ptr, nt * I, cfg.situBeta, cfg.situLinearBeta);
    this.compute.mxfp4(ex.w2, gate.ptr, out.ptr, nt, c?.words.subarray(4, 6));
    if (c) settleExpert(c);
    for (let j = 0; j < nt; j++) {
      const { t, slot } = users[j];
      s.expertOut.f.set(out.f.subarray(j * latent, (j + 1) * latent), (t * topK + slot) * latent);
    }
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
    const { k, cfg, s } = this;
    const { gate, up } = s.wide.glu;
    this.mm(w.gate, x, gate.ptr, T);
    this.mm(w.up, x, up.ptr, T);
    k.k3_situ_glu(gate.ptr, up.ptr, gate.ptr, T * w.gate.rows, cfg.situBeta, cfg.situLinearBeta);
    this.mm(w.down, gate.ptr, out, T);
  }

  /** Each row's top-k experts and weights by layer `w`'s router on the normed rows in s.xn. */
  private route(w: MoeWeights, T: number): { ids: number[]; weights: number[] }[] {
    const { k, cfg, s } = this;
    const { numExperts, topK } = cfg.moe;
    const logits = s.wide.moe.routerLogits;
    this.mm(w.router, s.xn.ptr, logits.ptr, T);
    const chosen: { ids: number[]; weights: number[] }[] = [];
    for (let t = 0; t < T; t++) {
      k.k3_router_topk(
        logits.at(t * numExperts),
        w.routerBias.ptr,
        numExperts,
        topK,
        cfg.moe.routedScaling,
        s.idsPtr,
        s.wtsPtr,
      );
      chosen.push({ ids: Array.from(s.ids), weights: Array.from(s.wts) });
    }
    return chosen;
  }

  /** Layer w's MLP input for T rows: s.x = its MLP AttnRes over the sources (nblocks
   * snapshots and the partial), s.xn = that normed. */
  private mlpInput(w: LayerWeights, T: number, nblocks: number): void {
    const { k, cfg, s } = this;
    const D = cfg.hiddenSize;
    for (let t = 0; t < T; t++) {
      const src = s.src.at(t * this.nsrc * D);
      k.k3_attnres(src, nblocks + 1, D, w.mlpRes.norm.ptr, w.mlpRes.proj.ptr, cfg.rmsNormEps, s.x.at(t * D));
    }
    k.k3_rmsnorm(s.x.ptr, w.postAttentionNorm.ptr, s.xn.ptr, D, T, cfg.rmsNormEps);
  }

  /**
   * Reads layer L+1's likely experts ahead, at the end of layer L, so that they land while
   * layer L+1's attention runs instead of after its routing. The guess is layer L+1's router
   * on the input its MLP would get if attention added nothing: its MLP AttnRes over the
   * sources as they stand, normed with its MLP norm (s.x, s.xn and the router logits are free
   * between layers). On the real-width slice 9 guesses in 10 were right (the earlier guess,
   * from layer L's own MLP input at its routing, 2 in 3). Only when layer L+1 is an MoE layer
   * in memory for good (a streamed layer is not waited for) and the source reads experts, and
   * while it pays (readAheadPays: most guesses right, and the cache alone not serving 95%).
   * A wrong guess costs a read, never a bit: the pass runs what the real routing chose.
   */
  private guessNextExperts(L: number, T: number, nblocks: number): void {
    const { cfg } = this;
    const next = L + 1;
    if (!this.readAheadOn || next >= cfg.numLayers || !this.weights.prefetchExperts) return;
    const io = this.weights.ioStats?.();
    if (io && !readAheadPays(io, cfg.moe.topK)) return;
    const w = this.weights.heldLayer?.(next);
    if (!w || w.mlp.kind !== "moe") return;
    this.mlpInput(w, T, nblocks);
    this.weights.prefetchExperts(next, [...new Set(this.route(w.mlp, T).flatMap((c) => c.ids))]);
  }

  /**
   * Stable LatentMoE for T tokens. The experts chosen by any token of the chunk are fetched
   * once (chunk union), their reads issued the moment the routing is known, before the
   * latent projection and the shared experts run; each expert runs on the tokens that chose
   * it as soon as it lands (expert_stream.ts); each token then sums its own experts in its
   * router's order, so the order they land in never changes a bit.
   */
  private async moe(L: number, w: MoeWeights, T: number): Promise<void> {
    const { k, cfg, s } = this;
    const { latent, topK } = cfg.moe;
    const D = cfg.hiddenSize;
    const { acc, z } = s.wide.moe;
    // Route each token, then claim the experts any row chose and start their reads.
    const chosen = this.route(w, T);
    const users = new Map<number, { t: number; slot: number }[]>();
    chosen.forEach(({ ids }, t) =>
      ids.forEach((e, slot) => {
        const list = users.get(e) ?? [];
        list.push({ t, slot });
        users.set(e, list);
      })
    );
    const union = [...users.keys()].sort((a, b) => a - b);
    this.stats.expertsUsed += union.length;
    const stream = new ExpertStream(this.weights, L, union);
    // z = routed_expert_down_proj x, once per token; the shared experts at full width (into
    // s.x); both while the reads are in flight.
    this.mm(w.latentDown, s.xn.ptr, z.ptr, T);
    if (w.shared) this.glu(w.shared, s.xn.ptr, s.x.ptr, T);
    await stream.run(
      (E, ex) => {
        const tExpert = performance.now();
        this.runExpert(ex, users.get(E)!, z);
        this.spent("expertCompute", tExpert);
      },
      (t0) => this.spent("expertReadWait", t0),
    );
    this.weights.doneWithExperts?.(L);
    // acc = sum_j w_j e_j in router order; RMSNorm; up-projection.
    // The router's logits are consumed: acc takes their place.
    for (let t = 0; t < T; t++) {
      const row = acc.f.subarray(t * latent, (t + 1) * latent);
      row.fill(0);
      for (let j = 0; j < topK; j++) {
        k.k3_axpy(acc.at(t * latent), chosen[t].weights[j], s.expertOut.at((t * topK + j) * latent), latent);
      }
    }
    k.k3_rmsnorm(acc.ptr, w.latentNorm.ptr, acc.ptr, latent, T, cfg.rmsNormEps);
    this.mm(w.latentUp, acc.ptr, s.a.ptr, T);
    // Shared experts (computed above), added with no weight.
    if (w.shared) k.k3_add(s.a.ptr, s.x.ptr, T * D);
  }
}
