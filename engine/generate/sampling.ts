/**
 * Sampling the next token from fp32 logits, reproducibly.
 *
 * The generator is xoshiro128** (Blackman and Vigna, 2018; 32-bit words, so it runs on
 * Math.imul and `>>>` with no BigInt per draw), seeded per sequence from a 53-bit seed by
 * SplitMix64 (the seeding its authors recommend). One uniform draw per token is
 * (a >>> 5) * 2^26 + (b >>> 6), scaled by 2^-53: a float64 in [0, 1) from two outputs.
 *
 * The arithmetic is fixed, so the same seed and logits give the same token everywhere
 * (thread count, ISA path, budget and batch composition only ever change how the logits
 * were computed, and those are bit-identical by the engine's own rule):
 * 1. temperature 0 (or top-k 1): the argmax, ties to the lowest id; no draw is consumed.
 * 2. Candidates are ordered by logit descending, ties by id ascending.
 * 3. top-k (0 = off) keeps the first k candidates.
 * 4. Weights w = exp((logit - max) / temperature), in float64 (Math.exp: V8's fdlibm port,
 *    the same bits on every platform), summed in candidate order.
 * 5. top-p keeps the shortest prefix whose weight sum reaches topP * total (at least one).
 * 6. min-p keeps the candidates with w >= minP * w_max (w_max = 1, the first).
 * 7. u = draw * (sum of kept weights, in order); the token is the first kept candidate
 *    whose running sum exceeds u (the last kept one if rounding runs out).
 *
 * @module
 */

import { usageError } from "../errors.ts";

/** Index of the largest logit, ties to the lowest index. */
export function argmax(x: Float32Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

/** Sampling parameters of one sequence. */
export interface SamplingParams {
  /** 0 = greedy (exactly argmax); otherwise divides the logits. */
  temperature: number;
  /** Nucleus: keep the most likely tokens up to this probability mass (1 = off). */
  topP: number;
  /** Keep only the k most likely tokens (0 = off). */
  topK: number;
  /** Drop tokens less likely than minP times the most likely one (0 = off). */
  minP: number;
  /** Seed of the sequence's generator, an integer 0..2^53-1. */
  seed: number;
}

/** Greedy decoding: temperature 0 gives exactly the argmax, ties to the lowest id. */
export const GREEDY: SamplingParams = Object.freeze({ temperature: 0, topP: 1, topK: 0, minP: 0, seed: 0 });

/** The model vendor's sampling guidance for chat: temperature 1.0, top_p 0.95. */
export const CHAT_DEFAULTS: SamplingParams = Object.freeze({ temperature: 1, topP: 0.95, topK: 0, minP: 0, seed: 0 });

/** Throws usageError (exit 2) naming the first parameter out of range. */
export function checkSampling(p: SamplingParams, where = "sampling"): void {
  const bad = (what: string, v: unknown) => usageError(`${where}: ${what}, got ${JSON.stringify(v)}`);
  if (typeof p.temperature !== "number" || !(p.temperature >= 0 && p.temperature <= 100)) {
    throw bad("temperature must be a number in 0..100", p.temperature);
  }
  if (typeof p.topP !== "number" || !(p.topP > 0 && p.topP <= 1)) throw bad("top_p must be in (0, 1]", p.topP);
  if (!Number.isInteger(p.topK) || p.topK < 0 || p.topK > 1e9) {
    throw bad("top_k must be an integer >= 0", p.topK);
  }
  if (typeof p.minP !== "number" || !(p.minP >= 0 && p.minP < 1)) throw bad("min_p must be in [0, 1)", p.minP);
  if (!Number.isSafeInteger(p.seed) || p.seed < 0) throw bad("seed must be an integer in 0..2^53-1", p.seed);
}

/** xoshiro128** with its 128-bit state, seeded by SplitMix64. */
export class Xoshiro128 {
  private readonly s = new Uint32Array(4);

  /** From a raw state (four 32-bit words, not all zero); use {@link Xoshiro128.seeded}. */
  constructor(state: ArrayLike<number>) {
    this.s.set(state);
    if ((this.s[0] | this.s[1] | this.s[2] | this.s[3]) === 0) throw new Error("xoshiro128**: all-zero state");
  }

  /** Seeded from a 53-bit integer by SplitMix64: two 64-bit outputs, low word first. */
  static seeded(seed: number): Xoshiro128 {
    const w = new Uint32Array(4);
    let x = BigInt(seed);
    const M = (1n << 64n) - 1n;
    for (let i = 0; i < 2; i++) {
      x = (x + 0x9e3779b97f4a7c15n) & M;
      let z = x;
      z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
      z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M;
      z = z ^ (z >> 31n);
      w[2 * i] = Number(z & 0xffffffffn);
      w[2 * i + 1] = Number(z >> 32n);
    }
    return new Xoshiro128(w);
  }

  /** The next 32-bit output, as an unsigned number. */
  nextU32(): number {
    const s = this.s;
    const r = Math.imul(rotl(Math.imul(s[1], 5), 7), 9) >>> 0;
    const t = s[1] << 9;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return r;
  }

  /** A float64 uniform in [0, 1) with 53 random bits. */
  nextFloat(): number {
    const a = this.nextU32() >>> 5, b = this.nextU32() >>> 6;
    return (a * 67108864 + b) / 9007199254740992;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/**
 * A per-sequence sampler with its own seeded generator (see the module comment for the
 * exact arithmetic). Throws usageError for parameters out of range.
 */
export function makeSampler(p: SamplingParams): (logits: Float32Array) => number {
  checkSampling(p);
  if (p.temperature === 0 || p.topK === 1) return argmax;
  const rng = Xoshiro128.seeded(p.seed);
  let order = new Int32Array(0);
  let w = new Float64Array(0);
  return (logits) => {
    const V = logits.length;
    if (order.length !== V) {
      order = new Int32Array(V);
      w = new Float64Array(V);
    }
    for (let i = 0; i < V; i++) order[i] = i;
    // Descending logit, ties to the lower id: a total order, so the sort is deterministic.
    order.sort((a, b) => logits[b] - logits[a] || a - b);
    const n = p.topK > 0 ? Math.min(p.topK, V) : V;
    const top = logits[order[0]];
    let total = 0;
    for (let j = 0; j < n; j++) {
      w[j] = Math.exp((logits[order[j]] - top) / p.temperature);
      total += w[j];
    }
    let kept = n;
    if (p.topP < 1) {
      const target = p.topP * total;
      let cum = 0;
      for (let j = 0; j < n; j++) {
        cum += w[j];
        if (cum >= target) {
          kept = j + 1;
          break;
        }
      }
    }
    if (p.minP > 0) {
      let j = 1;
      while (j < kept && w[j] >= p.minP) j++; // w[0] = 1 is the maximum
      kept = j;
    }
    let sum = 0;
    for (let j = 0; j < kept; j++) sum += w[j];
    const u = rng.nextFloat() * sum;
    let cum = 0;
    for (let j = 0; j < kept; j++) {
      cum += w[j];
      if (cum > u) return order[j];
    }
    return order[kept - 1];
  };
}
