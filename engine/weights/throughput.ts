/**
 * The memory plan's prediction of decode tokens/s: a small explicit model of one forward
 * pass, so that the plan can spend memory where it buys the most tokens (weights/plan.ts).
 *
 * A decode pass carries one token of each of S sequences (S rows). It reads from disk
 * every streamed trunk layer once (pinned layers are in RAM) and the routed experts its rows
 * choose that are not in the expert cache; it computes every trunk weight once for all its
 * rows, and each distinct chosen expert once for the rows routed to it. The read and the
 * compute overlap (the ring reads ahead while the layers compute), so
 *
 *   pass seconds = max(io, compute)
 *   io      = (streamed trunk bytes + missed expert bytes) / disk rate
 *   compute = trunk+head bytes / dense rate x (1 + g (S - 1))
 *             + MoE layers x (D + h (S k - D)) x expert bytes / expert rate
 *   D       = E (1 - (1 - k/E)^S)     distinct experts a layer's S rows choose (uniform routing)
 *   missed  = MoE layers x D x expert bytes x (1 - min(1, slots / all experts))
 *   tokens/s = S / pass seconds
 *
 * where g is what one more row adds to a bf16 product over the same weights, as a share of
 * the first row's (`rowGrowth`), and h the same for an MXFP4 expert product
 * (`expertRowGrowth`: ~1, the kernel is bound by decoding the weights, for every row). Uniform routing is the pessimistic case for the cache (a real
 * router's favourite experts hit more often), and drafted rows are not counted (the
 * per-sequence cost model turns them on only where they pay). The disk rate, the bf16
 * product's rate on all threads and its row growth g are measured at start-up
 * (weights/rate_probe.ts); the MXFP4 rate is taken as the share of the bf16 rate that
 * bench/limits.ts measures on this machine class, and h as g; bench/limits.ts checks the
 * prediction against a run (`plan_predicted_over_measured`). Where nothing was measured
 * (the README's full-model projections) DEFAULT_COMPUTE stands in.
 *
 * @module
 */

/** The rates a prediction is made from (bytes per second, and a share). */
export interface PassRates {
  /** Reads from disk (the trunk ring's and the experts'): measured at start-up. */
  disk: number;
  /** bf16 weights the trunk and head products consume for one row, on all threads. */
  dense: number;
  /** MXFP4 expert bytes the routed-expert products consume for one row, on all threads. */
  expert: number;
  /** What each row beyond the first adds to a bf16 product over the same weights, as a
   * share of the first row's cost. */
  rowGrowth: number;
  /** The same for a routed expert's MXFP4 product. */
  expertRowGrowth: number;
}

/**
 * The compute rates of a 2-core AVX-512 machine, as bench/limits.ts and the ledger measure
 * them: bf16 products at ~16 GB/s on two threads (resident decode moves 5.46 GB of weights
 * per token in ~0.33 s), 16 rows at 0.31-0.53 of one row's time per row (g = 0.5); MXFP4 at
 * ~0.3 of the bf16 rate (4.4-6 GB/s per thread against 13-16), and every routed row costing
 * about a whole product (a batch of 8 on the real-width slice: 1.78 s of expert compute a
 * pass for 256 expert rows of 17.6 MB, where the bf16 products took 1.96 s for 4.9 GB).
 * Start-up measures the bf16 rate (weights/rate_probe.ts) and takes the others as shares.
 */
export const DEFAULT_COMPUTE = { dense: 16e9, expert: 4.8e9, rowGrowth: 0.5, expertRowGrowth: 1 } as const;

/** The model's shape as the prediction needs it (bytes). */
export interface PassShape {
  /** Bytes of every trunk layer together. */
  trunkBytes: number;
  /** Bytes of the lm_head (one product per row). */
  headBytes: number;
  /** Layers with routed experts. */
  moeLayers: number;
  /** Routed experts per MoE layer. */
  experts: number;
  /** Experts each row chooses per MoE layer. */
  topK: number;
  /** Bytes of one routed expert. */
  expertBytes: number;
}

/** One way of spending memory: sequences in flight, trunk bytes not pinned, cache slots. */
export interface PassSplit {
  /** Sequences decoding at once (rows of a decode pass). */
  sequences: number;
  /** Trunk bytes read from disk every pass (the streamed layers; 0 when all are pinned). */
  streamedBytes: number;
  /** Expert-cache slots (every expert: nothing is read after the first pass). */
  slots: number;
  /** Everything is resident: nothing is read during a pass. */
  resident?: boolean;
}

/** A prediction: tokens/s and what makes up a pass. */
export interface Prediction {
  /** Decode tokens per second, all sequences together. */
  tokensPerSecond: number;
  /** Seconds of one decode pass. */
  passSeconds: number;
  /** Seconds of its reads. */
  ioSeconds: number;
  /** Seconds of its compute. */
  computeSeconds: number;
  /** Bytes it reads from disk. */
  readBytes: number;
}

/** Distinct experts that `rows` rows choose in one layer of `experts`, `topK` each (uniform). */
export function distinctExperts(experts: number, topK: number, rows: number): number {
  if (experts <= 0 || topK <= 0) return 0;
  return experts * (1 - Math.pow(1 - Math.min(1, topK / experts), rows));
}

/** Predicted decode tokens/s of `split` on a model of `shape` at `rates` (see the module doc). */
export function predictPass(shape: PassShape, split: PassSplit, rates: PassRates): Prediction {
  const S = Math.max(1, split.sequences);
  const g = rates.rowGrowth, h = rates.expertRowGrowth;
  const D = distinctExperts(shape.experts, shape.topK, S);
  const all = shape.moeLayers * shape.experts;
  const miss = split.resident || all === 0 ? 0 : 1 - Math.min(1, split.slots / all);
  const readBytes = split.resident ? 0 : split.streamedBytes + shape.moeLayers * D * shape.expertBytes * miss;
  const ioSeconds = readBytes / rates.disk;
  const computeSeconds = (shape.trunkBytes + shape.headBytes) / rates.dense * (1 + g * (S - 1)) +
    shape.moeLayers * (D + h * Math.max(0, S * shape.topK - D)) * shape.expertBytes / rates.expert;
  const passSeconds = Math.max(ioSeconds, computeSeconds);
  return { tokensPerSecond: S / passSeconds, passSeconds, ioSeconds, computeSeconds, readBytes };
}
