/**
 * The prefill segment: how many prompt tokens one forward pass runs (`--chunk`, `auto` by
 * default), and what a prompt's prefill is predicted to read and cost.
 *
 * A pass reads every trunk layer once and every expert its rows chose at most once,
 * whatever its rows (model.ts), so a prompt of P tokens in segments of S reads the model
 * ceil(P / S) times. The scratch grows by a segment row's bytes (scratch.ts
 * segmentRowBytes: the residual stream and AttnRes sources, the experts' inputs and
 * outputs); the wide temporaries run in fixed tiles. So `auto` takes the largest segment
 * the memory holds, up to the whole prompt, before the trunk pins and the expert cache
 * share what is left: one row costs well under a MB, and one segment saved is a read of
 * the whole streamed model. Segments are balanced (600 tokens with room for 250 rows: 3
 * of 200), so the memory an extra row could not save goes to pins and cache.
 *
 * @module
 */

import { distinctExperts, type PassRates, rowsCost } from "./throughput.ts";

/** The requested segment: a fixed number of tokens, or `auto` (the plan chooses). */
export type ChunkRequest = number | "auto";

/** The segment when the available memory is unknown (nothing to size it by). */
export const UNKNOWN_MEMORY_SEGMENT = 1024;

/**
 * The prompt `auto` segments are sized for when the context is `auto` too (serve, chat): an
 * agent's long turn (a tool result carrying files, logs or pages is 1-10k tokens), prefilled
 * whole; a longer prompt runs in segments of it, each reading the model once.
 */
export const AUTO_CONTEXT_PREFILL = 8192;

/** The smallest segment `auto` chooses (the default chunk before segments were sized). */
export const MIN_AUTO_SEGMENT = 16;

/** Segments of a prompt: rows of each, and how many. */
export interface Segments {
  /** Tokens per segment (the last may have fewer). */
  rows: number;
  /** Segments the prompt runs in. */
  segments: number;
}

/** Balanced segments for a prompt of `prompt` tokens when at most `largest` rows fit. */
export function segmentRows(prompt: number, largest: number): Segments {
  const p = Math.max(1, prompt);
  const most = Math.max(1, Math.min(largest, p));
  const segments = Math.ceil(p / most);
  return { rows: Math.ceil(p / segments), segments };
}

/**
 * The largest n in [lo, hi] for which `fits(n)` holds, assuming it holds for every n below
 * one that does (more rows never take less memory); undefined when not even lo fits.
 */
export function largestFitting(lo: number, hi: number, fits: (n: number) => boolean): number | undefined {
  if (!fits(lo)) return undefined;
  let ok = lo, bad = hi + 1;
  while (bad - ok > 1) {
    const mid = Math.floor((ok + bad) / 2);
    if (fits(mid)) ok = mid;
    else bad = mid;
  }
  return ok;
}

/**
 * The segment `auto` chooses for a prompt of `prompt` tokens, given `fits(S)`: whether the
 * plan with segments of S fits the available memory (undefined: unknown, then
 * UNKNOWN_MEMORY_SEGMENT). When not even MIN_AUTO_SEGMENT fits, that one (the plan's
 * refusal says why).
 */
export function autoSegment(prompt: number, fits: ((rows: number) => boolean) | undefined): Segments {
  const p = Math.max(1, prompt);
  if (!fits) return segmentRows(p, UNKNOWN_MEMORY_SEGMENT);
  const lo = Math.min(MIN_AUTO_SEGMENT, p);
  return segmentRows(p, largestFitting(lo, p, fits) ?? lo);
}

/** Segment counts past the fewest that fit which `auto` weighs ({@link weighSegments}). */
export const WEIGHED_SEGMENTS = 8;

/**
 * The segments `auto` takes for a prompt of `tokens`: of the balanced counts from the
 * fewest that fit (`fewest`) to {@link WEIGHED_SEGMENTS} more, down to MIN_AUTO_SEGMENT
 * rows, the one whose `cost` (the plan's predicted prefill with segments of that many
 * rows) is least; ties (within SEGMENT_GAIN) keep fewer segments. Fewer rows a segment
 * leave memory to the trunk pins, which no segment reads; one segment more reads the rest of
 * the streamed model once more. On the released model the fewest segments win at every
 * budget measured (an extra read of its experts outweighs any pin), but the rule, not that
 * outcome, is the plan's.
 */
export function weighSegments(tokens: number, fewest: Segments, cost: (rows: number) => number): Segments {
  let best = fewest, bestCost = cost(fewest.rows);
  for (let n = fewest.segments + 1; n <= fewest.segments + WEIGHED_SEGMENTS; n++) {
    const rows = Math.ceil(tokens / n);
    if (rows < MIN_AUTO_SEGMENT) break;
    const c = cost(rows);
    if (c < bestCost * (1 - SEGMENT_GAIN)) (best = { rows, segments: Math.ceil(tokens / rows) }, bestCost = c);
  }
  return best;
}

/**
 * The share of the predicted prefill a segment more must save to be taken. The costs are
 * sums of many floating-point terms, so a tie (the products hiding the reads of any
 * segment count, where the rows cost the same in any segment) differs in its last bits, and
 * a tie must keep the fewest segments: each more is a read of the streamed model.
 */
export const SEGMENT_GAIN = 0.01;

/** The model's sizes a prefill prediction reads. */
export interface PrefillShape {
  /** Bytes of the trunk layers read from disk each pass (the unpinned ones; 0: resident). */
  streamedBytes: number;
  /** Bytes of every trunk layer (the products' weights, pinned or not). */
  trunkBytes: number;
  /** MoE layers. */
  moeLayers: number;
  /** Routed experts per MoE layer. */
  experts: number;
  /** Experts each row chooses. */
  topK: number;
  /** Bytes of one routed expert. */
  expertBytes: number;
  /** The experts are all in memory (nothing read per segment). */
  expertsResident: boolean;
}

/** What a prompt's prefill is predicted to read and cost. */
export interface PrefillPrediction {
  /** Prompt tokens. */
  tokens: number;
  /** Tokens a segment. */
  rows: number;
  /** Segments (each a read of the streamed model). */
  segments: number;
  /** Bytes read from disk over the whole prefill. */
  readBytes: number;
  /** Seconds of those reads at the measured disk rate (null: no rates). */
  ioSeconds: number | null;
  /** Seconds of the products at the measured rates (null: no rates). */
  computeSeconds: number | null;
  /** The larger of the two: reads overlap compute, so the slower one bounds the prefill
   * (null: no rates). */
  seconds: number | null;
}

/**
 * The prediction for `tokens` in segments of `rows`: each segment reads the streamed trunk
 * and, per MoE layer, the distinct experts its rows choose (a flat router:
 * throughput.ts distinctExperts); its products cost one row at the measured rate plus a
 * share of it for each more row (throughput.ts rowsCost: riding on the weights' read at a
 * decode batch's rows, a tile's share of the arithmetic at many; a routed expert over the
 * rows that chose it).
 */
export function predictPrefill(
  shape: PrefillShape,
  tokens: number,
  rows: number,
  rates?: PassRates,
): PrefillPrediction {
  const segments = Math.ceil(Math.max(1, tokens) / Math.max(1, rows));
  let readBytes = 0, computeSeconds = 0;
  for (let i = 0; i < segments; i++) {
    const n = Math.min(rows, tokens - i * rows);
    const distinct = distinctExperts(shape.experts, shape.topK, n);
    readBytes += shape.streamedBytes + (shape.expertsResident ? 0 : shape.moeLayers * distinct * shape.expertBytes);
    if (rates) {
      const tile = rates.tileRowGrowth;
      const dense = (shape.trunkBytes / rates.dense) * rowsCost(rates.rowGrowth, tile, n);
      const one = shape.expertBytes / rates.expert;
      const perExpert = distinct > 0 ? (n * shape.topK) / distinct : 0;
      const expertCost = rowsCost(rates.expertRowGrowth, tile, perExpert);
      const expert = shape.moeLayers * one * distinct * expertCost;
      computeSeconds += dense + expert;
    }
  }
  if (!rates) return { tokens, rows, segments, readBytes, ioSeconds: null, computeSeconds: null, seconds: null };
  const ioSeconds = readBytes / rates.disk;
  return { tokens, rows, segments, readBytes, ioSeconds, computeSeconds, seconds: Math.max(ioSeconds, computeSeconds) };
}
