/**
 * The memory plan's prediction of decode tokens/s: a small explicit model of one forward
 * pass, so that the plan can spend memory where it buys the most tokens (weights/plan.ts).
 *
 * A decode pass carries one token of each of S sequences (S rows; more when sequences
 * draft, below). It reads from disk every streamed trunk layer once (pinned layers are in
 * RAM), the routed experts its rows choose that are not in the expert cache and, when it is
 * streamed, the lm_head; it computes every trunk weight once for all its rows, and each
 * distinct chosen expert once for the rows routed to it:
 *
 *   io      = (streamed trunk bytes + missed expert bytes + streamed head bytes) / disk rate
 *   compute = trunk+head bytes / dense rate x (1 + g (R - 1))
 *             + MoE layers x (D + h (R k - D)) x expert bytes / expert rate
 *   D       = E (1 - (1 - k/E)^R)     distinct experts a layer's R rows choose (uniform routing)
 *   missed  = MoE layers x D x expert bytes x (1 - min(1, slots / all experts))
 *
 * where R is the rows of a pass, g is what one more row adds to a bf16 product over the same
 * weights, as a share of the first row's (`rowGrowth`), and h the same for an MXFP4 expert
 * product (`expertRowGrowth`). Uniform routing is the pessimistic case for the cache (a real
 * router's favourite experts hit more often).
 *
 * The reads and the compute overlap only as far as the pass lets them, so the pass is not
 * max(io, compute) but the time of this schedule, one disk and one compute in order, run
 * until it repeats (PASSES passes, the first from an empty ring, the mean of the others):
 *
 *  - Trunk layers compute in order; a streamed layer starts once all its bytes are in.
 *  - The ring reads the streamed layers in the order the pass uses them (wrapping to the
 *    next pass), each as soon as the ring has room for it: a layer's bytes are free again
 *    when its compute is done (the early free of its attention tensors is not counted), so
 *    with a ring of two layers the read of layer i+2 waits for layer i to finish. The part
 *    of the read that does not fit ahead of the compute is serial with it.
 *  - A MoE layer's missed experts are read once its routing is known (after the layer's
 *    trunk compute) and overlap only that layer's expert compute: the layer is done at
 *    max(routing + expert compute, last expert read + one expert's compute), and the next
 *    layer cannot start before. A pinned MoE layer that has a layer before it in the pass
 *    is guessed (`guessRight`, model.ts guessNextExperts): as many reads as its misses are
 *    issued when that layer is done, of which the share `guessRight` is what its routing then finds;
 *    the rest are read at its routing, and the wrong guesses' reads are read for nothing.
 *  - A streamed lm_head is read after the last layer, one chunk ahead of its product: its
 *    read overlaps only its own compute.
 *  - The disk serves reads in the order they are issued: the ring issues deep (64 pieces
 *    in flight on one I/O pool), so an expert's or the head's read queues behind the ring's
 *    reads already issued. So a streamed head waits for the next pass's first layer, read
 *    ahead while the last layer computed; and a larger ring can make a missed expert wait
 *    longer (more read ahead of it), the one way more ring predicts no more tokens/s.
 *  - A streamed layer's products also check the weights they load: CHECK_SHARE of one
 *    row's product time (trunk_ring.ts, bench/verify.ts), once however many rows.
 *
 * With everything pinned and nothing missed nothing is read and the pass is the compute, as
 * before; with reads the pass is at least max(io, compute) and longer where the ring, the
 * routing or the head make a read wait for compute or compute wait for a read.
 *
 * Drafted rows: a sequence that drafts verifies `draftRows` more rows a pass, which cost
 * compute like any row (R = S (1 + draftRows)), and yields 1 + `acceptedDrafts` tokens a
 * pass (tokens/s = S (1 + acceptedDrafts) / pass). The plan assumes DEFAULT_DRAFTING: no
 * extra rows and none accepted, because drafting is turned on per sequence by its own cost
 * model only where the accepted tokens pay for the rows (so the draft-off pass is what the
 * plan can count on), and `--draft off` drafts nothing.
 *
 * The disk rate, the bf16 product's rate on all threads and its row growth g are measured at
 * start-up (weights/rate_probe.ts); the MXFP4 rate is taken as the share of the bf16 rate
 * that bench/limits.ts measures on this machine class, and h as g; bench/limits.ts checks the
 * prediction against a run (`plan_predicted_over_measured`). Where nothing was measured
 * (the README's full-model projections) DEFAULT_COMPUTE stands in. Not counted: attention,
 * norms and the compute's slowdown while the disk reads beside it.
 *
 * @module
 */

import { DEFAULT_TILE_ROWS } from "../model/scratch.ts";

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
  /** `rowGrowth` at TILE_GROWTH_ROWS rows: a long prompt's products run in tiles of that
   * many rows, where each more row adds far less than in a decode batch (the products are
   * compute-bound there, the one-row product memory-bound); absent: `rowGrowth`. Prefill
   * predictions only (plan_segment.ts predictPrefill); experts' taken as the bf16 one's. */
  tileRowGrowth?: number;
  /** The bf16 product's rate from the split-coded form, one row (a coded trunk's streamed
   * layers: the products decode them); absent: `dense`. */
  codedDense?: number;
}

/** PassRates.tileRowGrowth of the machine DEFAULT_COMPUTE describes: the bf16 product over
 * 64 rows at ~110 GFLOP/s a thread against one row at 8 GB/s of weights a thread
 * (weights/rate_probe.ts measures it at start-up: 0.08-0.13 on this machine). */
const TILE_GROWTH_DEFAULT = 0.075;

/**
 * The compute rates of a 2-core AVX-512 machine, as bench/limits.ts and the ledger measure
 * them: bf16 products at ~16 GB/s on two threads (resident decode moves 5.46 GB of weights
 * per token in ~0.33 s), 16 rows at 0.31-0.53 of one row's time per row (g = 0.5); MXFP4 at
 * ~0.3 of the bf16 rate (4.4-6 GB/s per thread against 13-16), and every routed row costing
 * about a whole product (a batch of 8 on the real-width slice: 1.78 s of expert compute a
 * pass for 256 expert rows of 17.6 MB, where the bf16 products took 1.96 s for 4.9 GB).
 * Start-up measures the bf16 rate (weights/rate_probe.ts) and takes the others as shares.
 */
export const DEFAULT_COMPUTE = {
  dense: 16e9,
  expert: 4.8e9,
  rowGrowth: 0.5,
  expertRowGrowth: 1,
  tileRowGrowth: TILE_GROWTH_DEFAULT,
} as const;

/** Rows of a decode batch's row-growth probe (PassRates.rowGrowth). */
export const GROWTH_ROWS = 8;

/** Rows of a prefill tile's row-growth probe (PassRates.tileRowGrowth): the model's tile. */
export const TILE_GROWTH_ROWS: number = DEFAULT_TILE_ROWS;

/**
 * One product over `rows` rows, in one-row products, from the two row growths measured
 * (PassRates): up to GROWTH_ROWS rows, 1 + small (rows - 1) (a few rows ride on the
 * weights' read: the one-row product is bound by memory); from TILE_GROWTH_ROWS rows on,
 * rows x a row's share of a tile, (1 + (TILE_GROWTH_ROWS - 1) tile) / TILE_GROWTH_ROWS (the
 * arithmetic bounds it, and tiles re-read the weights under it, so any segment costs the
 * same per row there); linear between the two. Without a tile growth, 1 + small (rows - 1).
 */
export function rowsCost(small: number, tile: number | undefined, rows: number): number {
  if (tile === undefined || rows <= GROWTH_ROWS) return 1 + small * (rows - 1);
  const few = 1 + small * (GROWTH_ROWS - 1);
  const many = Math.max(few, 1 + tile * (TILE_GROWTH_ROWS - 1));
  if (rows >= TILE_GROWTH_ROWS) return (rows * many) / TILE_GROWTH_ROWS;
  return few + ((many - few) * (rows - GROWTH_ROWS)) / (TILE_GROWTH_ROWS - GROWTH_ROWS);
}

/** What checking a streamed layer's weights in its products adds, as a share of one row's
 * product time (trunk_ring.ts: ~13% of the dense product's own time, bench/verify.ts). */
export const CHECK_SHARE = 0.13;

/** Passes the schedule runs; the first starts from an empty ring, the mean of the others is
 * the prediction. */
export const PASSES = 4;

/** Drafting as the plan assumes it (see the module doc): no extra rows, none accepted. */
export const DEFAULT_DRAFTING = { draftRows: 0, acceptedDrafts: 0 } as const;

/** The model's shape as the prediction needs it (bytes). */
export interface PassShape {
  /** Bytes of every trunk layer together. */
  trunkBytes: number;
  /** Bytes of the lm_head (one product per row). */
  headBytes: number;
  /** Layers with routed experts (the last `moeLayers` of `layers`). */
  moeLayers: number;
  /** Routed experts per MoE layer. */
  experts: number;
  /** Experts each row chooses per MoE layer. */
  topK: number;
  /** Bytes of one routed expert. */
  expertBytes: number;
  /** Bytes of each trunk layer in pass order (summing to `trunkBytes`); absent: the trunk
   * in max(1, moeLayers) equal layers. */
  layers?: readonly number[];
  /** Bytes a streamed layer reads from disk and takes in the ring, where that is fewer than
   * `layers` (a split-coded trunk whose pieces the products decode: trunk_ring.ts
   * streamedLayout); absent: `layers`. Its products still cover `layers` bytes. */
  streamLayers?: readonly number[];
  /** Of each layer's bytes, those its products decode from the coded form when it is
   * streamed (once a pass, at `codedDense`; more rows reuse the decoded window). */
  codedLayers?: readonly number[];
  /** The share of a pinned MoE layer's missed experts that the read-ahead guesses right
   * before its routing (0 or absent: nothing is read ahead). */
  guessRight?: number;
}

/** One way of spending memory: sequences in flight, trunk bytes not pinned, cache slots. */
export interface PassSplit {
  /** Sequences decoding at once (one row each of a decode pass, drafts aside). */
  sequences: number;
  /** Trunk bytes read from disk every pass (the streamed layers; 0 when all are pinned).
   * Without `streamedLayers` they are spread over the layers in proportion to their size. */
  streamedBytes: number;
  /** Which layers (indices into `PassShape.layers`) are streamed; overrides `streamedBytes`. */
  streamedLayers?: readonly number[];
  /** Bytes of the ring the streamed layers are read through; absent: room for them all. */
  ringBytes?: number;
  /** The lm_head is read from disk every pass (in chunks, one ahead of its product). */
  headStreamed?: boolean;
  /** Expert-cache slots (every expert: nothing is read after the first pass). */
  slots: number;
  /** Everything is resident: nothing is read during a pass. */
  resident?: boolean;
  /** Drafted rows each sequence verifies a pass beyond its own (default 0). */
  draftRows?: number;
  /** Drafts each sequence gets accepted a pass, on average (default 0; at most draftRows). */
  acceptedDrafts?: number;
}

/** A prediction: tokens/s and what makes up a pass. */
export interface Prediction {
  /** Decode tokens per second, all sequences together. */
  tokensPerSecond: number;
  /** Seconds of one decode pass. */
  passSeconds: number;
  /** Seconds of its reads (all of them, back to back at the disk rate). */
  ioSeconds: number;
  /** Seconds of its compute (all of it, back to back). */
  computeSeconds: number;
  /** Bytes it reads from disk. */
  readBytes: number;
}

/** Distinct experts that `rows` rows choose in one layer of `experts`, `topK` each (uniform). */
export function distinctExperts(experts: number, topK: number, rows: number): number {
  if (experts <= 0 || topK <= 0) return 0;
  return experts * (1 - Math.pow(1 - Math.min(1, topK / experts), rows));
}

/** One trunk layer of the schedule: seconds of its reads and its compute. */
interface Step {
  /** Seconds to read it from disk (0: pinned). */
  read: number;
  /** Bytes it takes in the ring (0: pinned). */
  ringBytes: number;
  /** Seconds of its trunk products (the check included when streamed). */
  dense: number;
  /** Seconds to read its missed experts (0: none, or not a MoE layer). */
  expertRead: number;
  /** Seconds of its routed-expert products. */
  expert: number;
  /** Seconds of one distinct expert's products (the last to land runs after its read). */
  lastExpert: number;
  /** The share of expertRead guessed right and read as the layer before it ends (0: none). */
  guessed: number;
}

/** Predicted decode tokens/s of `split` on a model of `shape` at `rates` (see the module doc). */
export function predictPass(shape: PassShape, split: PassSplit, rates: PassRates): Prediction {
  const S = Math.max(1, split.sequences);
  const draftRows = Math.max(0, split.draftRows ?? 0);
  const accepted = Math.min(draftRows, Math.max(0, split.acceptedDrafts ?? 0));
  const R = S * (1 + draftRows);
  const g = rates.rowGrowth, h = rates.expertRowGrowth;
  const D = distinctExperts(shape.experts, shape.topK, R);
  const all = shape.moeLayers * shape.experts;
  const miss = split.resident || all === 0 ? 0 : 1 - Math.min(1, split.slots / all);
  const rowCost = 1 + g * (R - 1);
  const layers = shape.layers ?? Array.from(
    { length: Math.max(1, shape.moeLayers) },
    () => shape.trunkBytes / Math.max(1, shape.moeLayers),
  );
  const trunk = layers.reduce((a, b) => a + b, 0);
  // The share of each layer streamed every pass, and the bytes that reads (a coded layer's
  // stored footprint).
  const share = split.resident
    ? layers.map(() => 0)
    : split.streamedLayers
    ? layers.map((_, i) => (split.streamedLayers!.includes(i) ? 1 : 0))
    : layers.map(() => (trunk > 0 ? Math.min(1, split.streamedBytes / trunk) : 0));
  const streamed = layers.map((b, i) => share[i] * (shape.streamLayers?.[i] ?? b));
  const headStreamed = !split.resident && !!split.headStreamed;
  const firstMoe = layers.length - Math.min(layers.length, shape.moeLayers);
  const expertLayer = (D + h * Math.max(0, R * shape.topK - D)) * shape.expertBytes / rates.expert;
  const missedBytes = D * shape.expertBytes * miss;
  const guessRight = Math.min(1, Math.max(0, shape.guessRight ?? 0));
  const steps: Step[] = layers.map((b, i) => {
    const moe = i >= firstMoe;
    return {
      guessed: moe && i > 0 && share[i] === 0 && missedBytes > 0 ? guessRight : 0,
      read: streamed[i] / rates.disk,
      ringBytes: streamed[i],
      // a streamed layer's products check every word they use (all of `b`, coded or not),
      // and decode what is coded once a pass
      dense: b / rates.dense * rowCost + CHECK_SHARE * share[i] * b / rates.dense +
        share[i] * (shape.codedLayers?.[i] ?? 0) * (1 / (rates.codedDense ?? rates.dense) - 1 / rates.dense),
      expertRead: moe ? missedBytes / rates.disk : 0,
      expert: moe ? expertLayer : 0,
      lastExpert: moe && D > 0 ? expertLayer / D : 0,
    };
  });
  const head = shape.headBytes / rates.dense * rowCost;
  const headRead = headStreamed ? shape.headBytes / rates.disk : 0;
  // A guessed layer reads its misses twice over where the guess was wrong.
  const wrongBytes = steps.reduce((a, s) => a + (s.guessed > 0 ? (1 - s.guessed) * missedBytes : 0), 0);
  const readBytes = streamed.reduce((a, b) => a + b, 0) + shape.moeLayers * missedBytes + wrongBytes +
    (headStreamed ? shape.headBytes : 0);
  const ioSeconds = readBytes / rates.disk;
  const computeSeconds = steps.reduce((a, s) => a + s.dense + s.expert, 0) + head;
  const passSeconds = readBytes === 0 ? computeSeconds : schedule(steps, head, headRead, split.ringBytes ?? Infinity);
  return { tokensPerSecond: S * (1 + accepted) / passSeconds, passSeconds, ioSeconds, computeSeconds, readBytes };
}

/**
 * Seconds of a pass of `steps` then the head, the mean of passes 2 to PASSES (see the module doc): one
 * compute in order, one disk serving reads in the order they are issued, the ring holding
 * `ring` bytes of streamed layers read but not yet done.
 */
function schedule(steps: Step[], head: number, headRead: number, ring: number): number {
  const order = steps.map((_, i) => i).filter((i) => steps[i].ringBytes > 0);
  const n = order.length;
  const total = n * (PASSES + 1); // the last pass's reads of the next one queue too
  // Per streamed read q (pass-major): its issue time once known, its end, its layer's done.
  const issue: number[] = [], end: number[] = [], done: number[] = [];
  const bytesOf = (q: number) => steps[order[q % n]].ringBytes;
  let disk = 0, issued = 0;
  // The ring's window for read `issued`: reads lo..issued fit in it together (at most one
  // pass of layers: a layer's next copy waits for this one), so read lo - 1 must be done.
  let lo = 0, used = 0, usedFor = -1;
  /** When ring read q (the next to issue) can start, or undefined while that is not known. */
  const issueTime = (q: number): number | undefined => {
    if (usedFor !== q) {
      used += bytesOf(q);
      usedFor = q;
      while (lo < q && (used > ring || q - lo >= n)) used -= bytesOf(lo++);
    }
    const room = lo === 0 ? 0 : done[lo - 1];
    if (room === undefined) return undefined;
    return Math.max(room, q > 0 ? issue[q - 1] : 0);
  };
  /** Issues, in order, ring reads up to `upTo` whose start is known and not after `t`. */
  const pump = (t: number, upTo = total - 1) => {
    while (issued <= upTo && issued < total) {
      const at = issueTime(issued);
      if (at === undefined || at > t) return;
      issue[issued] = at;
      disk = Math.max(disk, at) + steps[order[issued % n]].read;
      end[issued++] = disk;
    }
  };
  /** A read of `seconds` issued at `t` behind what the disk already has; its end. */
  const read = (t: number, seconds: number) => {
    pump(t);
    disk = Math.max(disk, t) + seconds;
    return disk;
  };
  let cpu = 0, q = 0, first = 0;
  for (let pass = 0; pass < PASSES; pass++) {
    if (pass === 1) first = cpu;
    for (const s of steps) {
      let start = cpu;
      if (s.ringBytes > 0) {
        pump(Infinity, q);
        start = Math.max(start, end[q]);
      }
      // The guess's reads go out as the layer before ends, behind what the disk has.
      const guessEnd = s.guessed > 0 ? read(cpu, s.expertRead) : 0;
      const routed = start + s.dense;
      let finish = routed + s.expert;
      const late = s.expertRead * (1 - s.guessed);
      if (s.expertRead > 0) finish = Math.max(finish, Math.max(guessEnd, read(routed, late)) + s.lastExpert);
      if (s.ringBytes > 0) done[q++] = finish;
      cpu = finish;
    }
    cpu = headRead > 0 ? Math.max(cpu + head, read(cpu, headRead)) : cpu + head;
  }
  return (cpu - first) / (PASSES - 1);
}
